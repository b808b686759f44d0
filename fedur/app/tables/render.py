"""A grid's results as the paper prints them: Markdown and CSV, from the runs' summary.json files.

Each cell: the mean over the seeds that finished and the sample standard deviation (n - 1; none for one
seed), the worst client (min over clients of the final per-client accuracy) averaged over the seeds and
its min over the seeds, the paper's number and the difference mean - paper. Every row is the mean over the
clients, zero-shot CLIP's too; the zero-shot row also shows `zero_shot_global` (CLIP on the whole test set,
the paper's protocol), which its difference from the paper is taken against.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from fedur.app.tables import ranking
from fedur.app.tables.figures import write_figures
from fedur.app.tables.grids import ACCURACIES, FINAL, PROTOCOLS, Column, Grid, Row, RunSpec
from fedur.app.tables.paper import PAPER_AVERAGE, paper_value
from fedur.app.tables.runner import extra_flags, read_summary, summary_value

MISSING = "—"


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def stdev(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


@dataclass
class Cell:
    row: Row
    column: Column
    seeds: list[int]  # the seeds asked for
    value: dict[int, float] = field(default_factory=dict)  # seed -> the cell's number
    worst: dict[int, float] = field(default_factory=dict)  # seed -> min over clients of the final accuracy
    client_mean: dict[int, float] = field(default_factory=dict)  # seed -> mean over clients (final)
    zero_shot_global: dict[int, float] = field(default_factory=dict)
    zero_shot_client_mean: dict[int, float] = field(default_factory=dict)
    best_mean: dict[int, float] = field(default_factory=dict)
    basis: dict[int, float] = field(default_factory=dict)  # seed -> the value the paper's number compares with
    missing: list[RunSpec] = field(default_factory=list)
    absent: list[int] = field(default_factory=list)  # seeds whose finished run has no such number (n/a)
    paper: float | None = None

    @property
    def n(self) -> int:
        return len(self.value)

    @property
    def mean(self) -> float | None:
        return mean(list(self.value.values()))

    @property
    def std(self) -> float | None:
        return stdev(list(self.value.values()))

    @property
    def worst_mean(self) -> float | None:
        return mean(list(self.worst.values()))

    @property
    def worst_min(self) -> float | None:
        return min(self.worst.values()) if self.worst else None

    @property
    def basis_mean(self) -> float | None:
        """The mean of what the paper's number measures: the cell's value, or the row's `paper_basis`."""
        return mean(list(self.basis.values())) if self.row.paper_basis else self.mean

    @property
    def diff(self) -> float | None:
        return None if self.basis_mean is None or self.paper is None else self.basis_mean - self.paper


def collect(grid: Grid, specs: list[RunSpec]) -> dict[tuple[str, str], Cell]:
    """(row key, column key) -> Cell, read from the summary.json of every run in `specs`."""
    cells: dict[tuple[str, str], Cell] = {}
    for spec in specs:
        key = (spec.row.key, spec.column.key)
        if key not in cells:
            paper = None
            for table in grid.paper_tables:
                paper = paper_value(table, spec.column.dataset, spec.column.setting, spec.row.key)
                if paper is not None:
                    break
            cells[key] = Cell(spec.row, spec.column, [], paper=paper)
        cell = cells[key]
        cell.seeds.append(spec.seed)
        summary = read_summary(spec.run_dir)
        if summary and spec.column.target:  # the virtual seconds to a fraction of another run's final accuracy
            target = read_summary(target_run(spec))
            if not target:
                cell.missing.append(spec)
                continue
            value = time_to(spec.run_dir, spec.column.target[1] * target[FINAL])
        else:
            value = summary_value(summary, spec.value) if summary else None
        if summary and value is None:  # finished, without this number (a training-free method's adapted new client)
            cell.absent.append(spec.seed)
            continue
        if not isinstance(value, (int, float)):
            cell.missing.append(spec)
            continue
        cell.value[spec.seed] = float(value)
        if spec.row.paper_basis and spec.value == FINAL and isinstance(summary.get(spec.row.paper_basis), (int, float)):
            cell.basis[spec.seed] = float(summary[spec.row.paper_basis])
        clients = summary.get("final_client_accuracy") or summary.get("zero_shot_client_accuracy") or []
        new = set(summary.get("new_clients") or [])
        measured = [c for k, c in enumerate(clients) if c is not None and k not in new]  # a client without test images: none
        if measured and spec.value == FINAL:  # the worst client: of the personal protocol
            cell.worst[spec.seed] = float(min(measured))
        for name, target in (("final_mean_accuracy", cell.client_mean), ("zero_shot_global", cell.zero_shot_global),
                             ("zero_shot_client_mean", cell.zero_shot_client_mean),
                             ("best_mean_accuracy", cell.best_mean)):
            if isinstance(summary.get(name), (int, float)):
                target[spec.seed] = float(summary[name])
    return cells


def target_run(spec: RunSpec) -> Path:
    """The run of the same row and seed in the column a target column reads its target from (Column.target)."""
    return spec.out / spec.grid.name / spec.column.target[0] / spec.row.key / f"seed{spec.seed}"


def time_to(run_dir: Path, accuracy: float) -> float | None:
    """The virtual seconds a run took to reach `accuracy` (%) of personal accuracy: its zero-shot 0, else the virtual
    clock of its first round or server step at or above it (metrics.jsonl); None: never."""
    summary = read_summary(run_dir) or {}
    if (summary.get("zero_shot_client_mean") or 0.0) >= accuracy:
        return 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("mean_accuracy") is not None and row["mean_accuracy"] >= accuracy:
            return row.get("virtual_clock")
    return None


def fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return MISSING
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return ""
    if cell.mean is None and cell.absent and not cell.missing:
        text = "n/a"  # the runs finished and do not have this number
    elif cell.mean is None:
        text = f"{MISSING} (0/{len(cell.seeds)})"
    else:
        text = fmt(cell.mean) + (f" ± {fmt(cell.std)}" if cell.std is not None else "")
        if cell.n < len(cell.seeds):
            text += f" [{cell.n}/{len(cell.seeds)} seeds]"
        if cell.worst:
            text += f" · worst {fmt(cell.worst_mean)} ({fmt(cell.worst_min)})"
        if cell.row.paper_basis and cell.basis:
            text += f" · whole test set {fmt(cell.basis_mean)}"
    if cell.paper is not None:
        text += f" · paper {fmt(cell.paper)}" + (f" (Δ {fmt(cell.diff, signed=True)})" if cell.diff is not None else "")
    return text


def sections(grid: Grid) -> dict[str, list[Column]]:
    out: dict[str, list[Column]] = {}
    for column in grid.columns:
        out.setdefault(column.section, []).append(column)
    return out


def row_average(grid: Grid, cells: dict, row: Row, columns: list[Column]) -> str:
    """The Average column: mean of the row's cell means over the section (when every column of the
    section has one, unfiltered), and the paper's own Average."""
    every = [c for c in grid.columns if c.section == columns[0].section]
    means = [cells[(row.key, c.key)].mean for c in every if (row.key, c.key) in cells]
    ours = statistics.fmean(means) if len(means) == len(every) and None not in means else None
    paper = None
    for table in grid.paper_tables:
        paper = PAPER_AVERAGE.get(table, {}).get(columns[0].setting, {}).get(row.key)
        if paper is not None:
            break
    text = fmt(ours)
    if paper is not None:
        text += f" · paper {fmt(paper)}" + (f" (Δ {fmt(ours - paper, signed=True)})" if ours is not None else "")
    return text


LEGEND = ("Each cell: the final accuracy as a mean over the clients of each client's accuracy on its own test "
          "set, mean ± sample standard deviation over the seeds ([n/N seeds] when some are missing) · worst: the "
          "worst client's final accuracy, mean over the seeds (min over the seeds) · paper: the paper's number "
          "(Δ = mean − paper). Zero-shot CLIP is measured the same way; beside it, its accuracy on the whole test "
          "set, the paper's zero-shot protocol, which its Δ compares with.")


PROTOCOL_LEGEND = ("Each cell: the number its column shows (below), mean ± sample standard deviation over the seeds "
                   "([n/N seeds] when some are missing) · worst (personal columns): the worst training client's final "
                   "accuracy, mean over the seeds (min over the seeds). Columns that read the same runs show other "
                   "numbers of each run.")


def markdown(grid: Grid, cells: dict, specs: list[RunSpec], seeds: list[int]) -> str:
    runs = {s.run_dir for s in specs}  # columns that read another's runs share them
    done = sum((run / "summary.json").is_file() for run in runs)
    shown = list(dict.fromkeys(s.value.split(".")[0] for s in specs))
    lines = [f"# {grid.title}", "",
             f"`fedur-tables {grid.name}`, seeds {', '.join(map(str, seeds))}: {done} of {len(runs)} runs finished.", "",
             LEGEND if shown == [FINAL] else PROTOCOL_LEGEND, "", f"Protocol: {PROTOCOLS[grid.protocol]}.", ""]
    if shown != [FINAL]:  # a table of other numbers than the personal mean says which each column shows
        labels = {key: dict.fromkeys(c.label for c in grid.columns if (c.value or FINAL).split(".")[0] == key) for key in shown}
        lines += ["What the cells show:", *(f"- {'; '.join(labels[key])}: {ACCURACIES.get(key, key)}" for key in shown), ""]
        # (each label once: a grid's sections, such as demo-async's speed spreads, repeat their columns' labels)
    finished = list({s.run_dir: s for s in specs if (s.run_dir / "summary.json").is_file()}.values())
    extras: dict[str, list[RunSpec]] = {}
    for spec in finished:
        extras.setdefault(extra_flags(spec.log), []).append(spec)
    if set(extras) - {""}:
        lines.append("Flags after `--` (they override the grid's settings):")
        for flags, runs in sorted(extras.items()):
            which = (f"all {len(runs)} finished runs" if len(runs) == len(finished)
                     else f"{len(runs)} runs: " + ", ".join(s.name for s in runs))
            lines.append(f"- `{flags}`: {which}" if flags else f"- none: {which}")
        lines.append("")
    weightings: dict[str, int] = {}
    for spec in finished:
        weightings[run_weighting(spec)] = weightings.get(run_weighting(spec), 0) + 1
    if weightings:
        lines += ["Server averaging of the shared prompts (each run's `method.weighting`): " + ", ".join(
            f"{WEIGHTINGS.get(w, w)} ({n} runs)" for w, n in sorted(weightings.items())) + ".", ""]
    shown_rows = [r for r in grid.rows if any((r.key, c.key) in cells for c in grid.columns)]
    for section, columns in sections(grid).items():
        columns = [c for c in columns if any((r.key, c.key) in cells for r in shown_rows)]
        if not columns:
            continue
        header = [*grid.label_headers, *(c.label for c in columns)] + (["Average"] if grid.average else [])
        lines += [f"## {section}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for row in shown_rows:
            texts = [cell_text(cells.get((row.key, c.key))) for c in columns]
            if grid.average:
                texts.append(row_average(grid, cells, row, columns))
            lines.append("| " + " | ".join([*row.labels, *texts]) + " |")
        lines.append("")
    lines += ranking.markdown(specs)  # the run a user without labels would deploy, and the regret
    missing = [s for c in cells.values() for s in c.missing]
    if missing:
        lines += [f"Missing runs ({len(missing)}):", ""]
        for spec in missing:
            log = f": see {spec.log}" if spec.log.is_file() else ": not run"
            lines.append(f"- {spec.name}{log}")
        lines.append("")
    lines += [f"Note: {note}" for note in grid.notes]
    return "\n".join(lines).rstrip() + "\n"


WEIGHTINGS = {"selected": "weighted by selected pseudo-labels", "data": "weighted by train images",
              "uniform": "unweighted", "none": "no average (nothing shared, or statistics summed)"}


def run_weighting(spec: RunSpec) -> str:
    """How a finished run's server weighted the clients: its method's `weighting` ('none' for a method without
    one: zero-shot, GDA-U)."""
    summary = read_summary(spec.run_dir) or {}
    method = (summary.get("settings") or {}).get("method") or {}
    return (method.get("init_args") or {}).get("weighting", "none")


# CSV field -> Cell attribute.
CELL_FIELDS = {"mean": "mean", "std": "std", "n": "n", "worst": "worst_mean", "worst_min": "worst_min",
               "paper": "paper", "diff": "diff"}


def wide_csv(grid: Grid, cells: dict) -> str:
    """The paper's shape: one line per row, for every column its mean, std, n, worst, worst_min, paper, diff."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["row", *grid.label_headers, *(f"{c.key} {f}" for c in grid.columns for f in CELL_FIELDS)])
    for row in grid.rows:
        if not any((row.key, c.key) in cells for c in grid.columns):
            continue
        values = []
        for column in grid.columns:
            cell = cells.get((row.key, column.key))
            values += [num(getattr(cell, a)) if cell else "" for a in CELL_FIELDS.values()]
        writer.writerow([row.key, *row.labels, *values])
    return buffer.getvalue()


def num(value) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def long_csv(grid: Grid, cells: dict) -> str:
    """One line per cell with everything: also the per-client mean, zero-shot numbers and each seed's value."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["grid", "row", "column", "dataset", "setting", "value_key", *CELL_FIELDS, "seeds", "values",
                     "client_mean", "zero_shot_global", "zero_shot_client_mean", "best_mean", "missing_seeds"])
    for cell in cells.values():
        writer.writerow([
            grid.name, cell.row.key, cell.column.key, cell.column.dataset, cell.column.setting,
            cell.column.value or cell.row.value,
            *(num(getattr(cell, a)) for a in CELL_FIELDS.values()),
            " ".join(map(str, cell.seeds)), " ".join(f"{cell.value[s]:.4f}" for s in sorted(cell.value)),
            num(mean(list(cell.client_mean.values()))), num(mean(list(cell.zero_shot_global.values()))),
            num(mean(list(cell.zero_shot_client_mean.values()))), num(mean(list(cell.best_mean.values()))),
            " ".join(str(s.seed) for s in cell.missing),
        ])
    return buffer.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """Whole or not at all: parallel SLURM tasks may render the same table at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render(grid: Grid, specs: list[RunSpec], seeds: list[int], folder: Path) -> tuple[dict, list[Path]]:
    """Write folder/table.md, table.csv (the paper's shape), cells.csv (one line per cell) and the figures
    (fedur/app/tables/figures.py), as PNG and PDF."""
    cells = collect(grid, specs)
    files = [folder / "table.md", folder / "table.csv", folder / "cells.csv"]
    for path, text in zip(files, (markdown(grid, cells, specs, seeds), wide_csv(grid, cells), long_csv(grid, cells))):
        write_atomic(path, text)
    return cells, files + write_figures(grid, cells, specs, folder)
