"""fedur-report: one or many run directories -> a Markdown report and PNG plots of accuracy per round.

    fedur-report runs/a runs/b --out reports/ab
    python -m fedur.app.report runs/* --out reports/all

Writes OUT/report.md (one row per run, then one table per run with its clients), OUT/accuracy_mean.png
(the mean accuracy over clients per round, one line per run; round 0 is zero-shot CLIP) and
OUT/accuracy_clients_<run>.png (every client of one run), OUT/accuracy_virtual_time.png (the mean accuracy against
the virtual clock, one line per run, where a run's clients drop, lag or attack or its server is asynchronous:
docs/system.md, docs/asynchronous.md), and prints the
Markdown and the files.
A run without summary.json (still running, or stopped) is reported from its metrics.jsonl, marked so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedur.app.report_label_free import sections as label_free_sections
from fedur.errors import FedurError
from fedur.metrics import best, fmt, round_numbers
from fedur.plots import line_plot, save
from fedur.train.progress import format_duration
from fedur.train.round_fields import FIELDS, Field, Protocol


class ReportError(FedurError, ValueError):
    """A path is not a run directory, or one of its files cannot be read."""


@dataclass
class Run:
    path: Path
    name: str
    rounds: list[dict]  # metrics.jsonl rows, in order
    settings: dict  # the resolved config (summary.json's, else config.yaml's)
    summary: dict | None  # None for a run that did not finish
    zero_shot: dict = field(default_factory=dict)
    train_sizes: list[int] | None = None  # per client, from partition.json

    @property
    def complete(self) -> bool:
        return self.summary is not None

    def curve(self, values: list[float | None]) -> tuple[list[int], list[float | None]]:
        """(rounds completed, value): step 0 is zero-shot when known, then one point per round."""
        return [0, *round_numbers(self.rounds)], values


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ReportError(f"cannot read {path}: {err}") from err


def load_run(path: Path, name: str | None = None) -> Run:
    if not path.is_dir():
        raise ReportError(f"{path} is not a directory; give the run directories a run wrote (its run.output_dir)")
    metrics, summary_file = path / "metrics.jsonl", path / "summary.json"
    if not metrics.is_file() and not summary_file.is_file():
        raise ReportError(
            f"{path} is not a fedur run directory: it holds neither metrics.jsonl nor summary.json "
            "(give the folders a run wrote, e.g. runs/20250101-120000, or runs/* for all of them)"
        )
    rounds = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                rounds.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a run that was stopped while writing
                break
    summary = _read_json(summary_file) if summary_file.is_file() else None
    if summary is not None:
        settings = summary.get("settings", {})
    elif (path / "config.yaml").is_file():
        settings = yaml.safe_load((path / "config.yaml").read_text()) or {}
    else:
        settings = {}
    if summary is not None:
        zero_shot = summary
    else:  # written right after the zero-shot evaluation, before the first round
        zero_shot = _read_json(path / "zero_shot.json") if (path / "zero_shot.json").is_file() else {}
    partition = _read_json(path / "partition.json") if (path / "partition.json").is_file() else None
    train_sizes = partition_sizes(partition)
    return Run(path, name or path.name, rounds, settings, summary, zero_shot, train_sizes)


def partition_sizes(partition: dict | None) -> list[int] | None:
    """Train images per client: partition.json's train_sizes, or its class counts' sums in runs of fedur before
    it had them (None without either: data without labels written by no such run)."""
    if not partition:
        return None
    if partition.get("train_sizes") is not None:
        return partition["train_sizes"]
    return [sum(row) for row in partition["train"]] if partition.get("train") is not None else None


def load_runs(paths: list[Path]) -> list[Run]:
    """Runs named by their folder; by parent/folder where two folders share a name."""
    names = [p.resolve().name for p in paths]
    unique = [n if names.count(n) == 1 else f"{p.resolve().parent.name}/{n}" for p, n in zip(paths, names)]
    return [load_run(p, n) for p, n in zip(paths, unique)]


def _pct(value: float | None) -> str:
    return fmt(value, missing="")


def _best_at(values: list[float | None]) -> str:
    """'best @ round' with the round counted as rounds completed (1-based); empty when no value."""
    value, index = best(values)
    return "" if value is None else f"{_pct(value)} @ {index + 1}"


def dataset_name(settings: dict) -> str:
    """The dataset's key as summaries record it: "synthetic" for `dataset: {class_path: ...Synthetic}` (and
    data.name in runs of fedur before datasets were classes)."""
    dataset = settings.get("dataset")
    if isinstance(dataset, dict) and dataset.get("class_path"):
        return dataset["class_path"].rsplit(".", 1)[-1].lower()
    return str(settings.get("data", {}).get("name", "?"))


def run_row(run: Run) -> list[str]:
    fed = run.settings.get("federation", {})
    partition = fed.get("partition", "?")
    if partition in ("dirichlet", "domain_dirichlet"):
        partition += f" (beta {fed.get('beta')})"
    means = [r["mean_accuracy"] for r in run.rounds]
    wall = run.summary.get("wall_seconds") if run.complete else sum(r["round_seconds"] for r in run.rounds)
    planned = run.rounds[-1]["rounds"] if steps(run) else fed.get("rounds", "?")  # (an asynchronous server's: steps)
    return [
        run.name, (run.summary or {}).get("dataset") or dataset_name(run.settings), partition, str(fed.get("num_clients", "?")),
        f"{len(run.rounds)}/{planned}", _pct(run.zero_shot.get("zero_shot_client_mean")),
        _pct(means[-1] if means else None), _best_at(means),
        format_duration(wall) + ("" if run.complete else " so far"), "complete" if run.complete else "incomplete",
    ]


def steps(run: Run) -> bool:
    """Whether the run's lines are an asynchronous server's steps (docs/asynchronous.md): it counts steps, not rounds."""
    return bool(run.rounds) and "version" in run.rounds[-1]


def client_rows(run: Run) -> list[list[str]]:
    if not run.rounds:
        return []
    zero_shot = run.zero_shot.get("zero_shot_client_accuracy") or []
    new = set(run.rounds[-1].get("new_clients") or [])
    rows = []
    for k in range(len(run.rounds[-1]["client_accuracy"])):
        curve = [r["client_accuracy"][k] for r in run.rounds]
        rows.append([
            f"{k} (new)" if k in new else str(k), str(run.train_sizes[k]) if k < len(run.train_sizes or []) else "",
            _pct(zero_shot[k] if k < len(zero_shot) else None),
            _pct(curve[-1]), _best_at(curve), fmt(run.rounds[-1]["selected"][k], 0, missing=""),  # None: no labeller
        ])
    return rows


def protocols(run: Run) -> list[tuple[Protocol, str, str, float | None, list[float | None]]]:
    """(its declaration, name, what it tests, its value before any round, its value after each round) of each
    evaluation protocol the run reports (docs/protocols.md), from the fields that declare one
    (fedur/train/round_fields.py): one whose every value is None is left out, but not a held-out set of the last round."""
    last = run.rounds[-1]
    new = set(last.get("new_clients") or [])
    training = [k for k in range(len(last["client_accuracy"])) if k not in new]
    words = {"covers": f"{len(training)} training client(s)", "new": last.get("new_clients")}
    found = []
    for key, p in ((f.key, f.protocol) for f in FIELDS if f.protocol is not None):
        before = run.zero_shot.get(p.zero_shot) if p.zero_shot else None
        if p.name is None:  # a dict: one protocol per key of the last round
            for name in last.get(key) or {}:
                values = [(r.get(key) or {}).get(name) for r in run.rounds]
                found.append((p, name, p.what(name), (before or {}).get(name), values))
        elif any(r.get(key) is not None for r in run.rounds):
            found.append((p, p.name, p.what.format(**words), before, [r.get(key) for r in run.rounds]))
    return found


def protocol_rows(run: Run) -> list[list[str]]:
    """One row per evaluation protocol the run reports (`protocols`): what it tests on what, its zero-shot value where
    there is one, its last round's and its best; then the row of summary.json's value that follows it (Protocol.then)."""
    if not run.rounds:
        return []
    rows = []
    for p, name, what, before, values in protocols(run):
        rows.append([name, what, _pct(before), _pct(values[-1]), _best_at(values)])
        value = (run.summary or {}).get(p.then[2]) if p.then else None
        if value is not None:
            rows.append([p.then[0], p.then[1], "", _pct(value), ""])
    return rows


def method_metric_rows(run: Run) -> list[list[str]]:
    """One row per metric the method's aggregate reported: its first and last value, its range over the rounds."""
    names = list(dict.fromkeys(name for r in run.rounds for name in (r.get("method") or {})))
    rows = []
    for name in names:
        values = [r["method"][name] for r in run.rounds if name in (r.get("method") or {})]
        rows.append([name, *(f"{v:.4g}" for v in (values[0], values[-1], min(values), max(values)))])
    return rows


def round_table(run: Run, table: str) -> tuple[list[str], list[list[str]]]:
    """fedur-report's per-round `table` ("privacy", "answers"): its header and a row per round that has its first
    field: the round, the table's columns (the fields that declare one: fedur/train/round_fields.py), the mean
    accuracy."""
    fields: list[Field] = [f for f in FIELDS if f.column is not None and f.column.table == table]
    header = ["round", *(f.column.header for f in fields), "mean accuracy"]
    return header, [[str(r["round"]), *(f.column.cell(r.get(f.key)) for f in fields), _pct(r.get("mean_accuracy"))]
                    for r in run.rounds if fields[0].key in r]


def privacy_rows(run: Run) -> list[list[str]]:
    """Privacy on: epsilon at delta spent after each round (and the clip), with how the run ended."""
    rows = round_table(run, "privacy")[1]
    stop = (run.summary or {}).get("privacy", {})
    if stop.get("stopped_at_target"):
        rows.append([f"stopped before {stop['stopped_before_round']}", f"target {stop['target_epsilon']:g}", "", ""])
    return rows


def clients_misbehave(run: Run) -> bool:
    """Whether the run's clients drop, lag or attack, or its server is asynchronous (summary.json's "system", or a
    round with uploads lost, late or surplus, or a server step, for a run still going)."""
    return "system" in (run.summary or {}) or any(r.get("dropped") or r.get("late") or r.get("surplus") or "version" in r
                                                  for r in run.rounds)


def client_answer_rows(run: Run) -> list[list[str]]:
    """Clients that drop, lag or attack: per round how many were asked, answered, lost, late and taken, and the
    virtual time; [] for a run where every asked client answered on time (`clients_misbehave`)."""
    return round_table(run, "answers")[1] if clients_misbehave(run) else []


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cell.replace("|", "/") for cell in line) + " |" for line in lines)


def markdown(runs: list[Run], pngs: list[Path]) -> str:
    header = ["run", "dataset", "partition", "clients", "rounds", "zero-shot mean", "final mean", "best mean @ round",
              "wall time", "status"]
    parts = [
        "# fedur runs",
        "Accuracy in %: the mean over clients of each client's accuracy on its own test set; a round number is the "
        "count of rounds completed (0: zero-shot CLIP).",
        table(header, [run_row(run) for run in runs]),
    ]
    for run in runs:
        status = "" if run.complete else " (incomplete: no summary.json yet)"
        parts.append(f"## {run.name}{status}\n\n`{run.path}`")
        parts.append(table(["client", "train images", "zero-shot", "final", "best @ round", "selected (last round)"],
                           client_rows(run)))
        protocols = protocol_rows(run)
        if protocols:
            parts.append("Evaluation protocols (docs/protocols.md):\n\n" + table(
                ["protocol", "what is tested", "zero-shot", "final", "best @ round"], protocols))
        privacy = privacy_rows(run)
        if privacy:
            delta = run.rounds[-1].get("delta")
            parts.append(f"Privacy (epsilon at delta {delta:g}, docs/privacy.md):\n\n" + table(
                round_table(run, "privacy")[0], privacy))
        steps = round_table(run, "server")[1]
        if steps:
            summary = (run.summary or {}).get("system", {}).get("server", {})
            said = f" ({summary['mode']}, concurrency {summary['concurrency']}, buffer {summary['buffer']})" if summary else ""
            parts.append(f"Server steps{said}; docs/asynchronous.md:\n\n" + table(round_table(run, "server")[0], steps))
        answers = client_answer_rows(run)
        if answers:
            system = (run.summary or {}).get("system", {})
            said = f"attackers {system['attackers']} ({system['attack']}), " if system.get("attackers") else ""
            parts.append(f"Clients that answered ({said}aggregator {system.get('aggregator', 'mean')}; docs/system.md):\n\n"
                         + table(round_table(run, "answers")[0], answers))
        parts += label_free_sections(run.rounds, run.zero_shot, run.summary)  # estimates, their errors, the choice, ECE
        metrics = method_metric_rows(run)
        if metrics:  # what the method's server reported (Aggregated.metrics)
            parts.append("Method metrics:\n\n" + table(["metric", "first round", "last round", "min", "max"], metrics))
    parts.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs))
    return "\n\n".join(parts) + "\n"


def plot(runs: list[Run], out: Path) -> list[Path]:
    """accuracy_mean.png (one line per run) and accuracy_clients_<run>.png for each run with accuracies (a run
    without test labels has none: its row in the tables is left empty, and it gets no plot)."""
    files = [out / "accuracy_mean.png"]
    mean_series = {
        run.name: run.curve([run.zero_shot.get("zero_shot_client_mean"), *(r["mean_accuracy"] for r in run.rounds)])
        for run in runs
    }
    title = "mean accuracy over clients per round (0: zero-shot CLIP)"
    save(line_plot(mean_series, title, "round", "accuracy (%)"), files[0])
    for run in runs:
        if not run.rounds or all(a is None for r in run.rounds for a in r["client_accuracy"]):
            continue
        zero_shot = run.zero_shot.get("zero_shot_client_accuracy") or [None] * len(run.rounds[0]["client_accuracy"])
        series = {
            f"client {k}": run.curve([zero_shot[k], *(r["client_accuracy"][k] for r in run.rounds)])
            for k in range(len(zero_shot))
        }
        path = out / f"accuracy_clients_{re.sub(r'[^A-Za-z0-9._-]+', '_', run.name)}.png"
        save(line_plot(series, f"{run.name}: accuracy of each client on its own test set", "round", "accuracy (%)"), path)
        files.append(path)
        protocols = protocol_series(run)
        if len(protocols) > 1:  # the personal mean and at least one other protocol
            path = out / f"accuracy_protocols_{re.sub(r'[^A-Za-z0-9._-]+', '_', run.name)}.png"
            save(line_plot(protocols, f"{run.name}: the evaluation protocols (docs/protocols.md)", "round", "accuracy (%)"), path)
            files.append(path)
    timed = virtual_time_series(runs)
    if timed:
        files.append(out / "accuracy_virtual_time.png")
        save(line_plot(timed, "mean accuracy over clients against the virtual clock (0: zero-shot CLIP; docs/system.md)",
                       "virtual seconds", "accuracy (%)", integer_x=False), files[-1])
    return files


def virtual_time_series(runs: list[Run]) -> dict[str, tuple[list[float], list[float | None]]]:
    """Each run's mean accuracy against its virtual clock (metrics.jsonl's `virtual_clock` after each round, 0 for
    zero-shot CLIP), for comparing runs whose clients drop, lag or attack: {} unless one of them has such clients
    (`clients_misbehave`). Runs without them are drawn too where their rounds have a clock (equal speeds: one step
    a virtual second), so a run with a deadline is seen against the same run without."""
    if not any(clients_misbehave(run) for run in runs):
        return {}
    evaluated = lambda run: [r for r in run.rounds if r.get("mean_accuracy") is not None]  # noqa: E731  (every round;
    # an asynchronous server's steps that evaluated, server.evaluate_every)
    return {run.name: ([0.0, *(r["virtual_clock"] for r in evaluated(run))],
                       [run.zero_shot.get("zero_shot_client_mean"), *(r["mean_accuracy"] for r in evaluated(run))])
            for run in runs if run.rounds and all("virtual_clock" in r for r in run.rounds)}


def protocol_series(run: Run) -> dict[str, tuple[list[int], list[float | None]]]:
    """Each protocol's curve over the rounds (0: zero-shot CLIP where it has a value), for those the run reports and
    whose field draws one (Protocol.curve)."""
    if not run.rounds:
        return {}
    return {p.curve or name: run.curve([before, *values]) for p, name, _, before, values in protocols(run)
            if p.curve is not None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fedur-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each a run.output_dir)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="folder for report.md and the PNGs")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except FedurError as err:
        print(f"fedur-report: error: {err.one_line()}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    pngs = plot(runs, args.out)
    text = markdown(runs, pngs)
    (args.out / "report.md").write_text(text)
    print(text)
    print("wrote " + ", ".join(str(p) for p in [args.out / "report.md", *pngs]))


if __name__ == "__main__":
    main()
