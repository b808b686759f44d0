"""How far can a client trust an accuracy estimated without labels, and what does choosing by it cost? FedUR, FedCoPL,
PromptFL and pFedMoAP with a label-free validation split (data.validation_fraction 0.2) and the label-free choice
(evaluation.select label_free), on the demo (configs/smoke.yaml, the baselines with their demo presets) and on tiny-clip
over the real CIFAR-10 JPEGs (configs/proxy/cifar10-tinyclip.yaml), over seeds; then a table of each estimator's error
against the true test accuracy and of the choice each estimator makes (docs/label-free.md).

    python benchmarks/label_free.py run demo --seeds 1,2,3,4,5 --workdir /tmp/label-free
    python benchmarks/label_free.py run proxy --seeds 1,2,3 --workdir /tmp/label-free     # $FEDUR_SHARED_DIR: tiny-clip, CIFAR-10
    python benchmarks/label_free.py table /tmp/label-free --out benchmarks/results/label_free
    python benchmarks/label_free.py run demo --seeds 1 --methods fedur --rounds 1 --workdir /tmp/lf-smoke   # the smallest

Every run is a fresh process (`python -m fedur.main`); a finished run in --workdir is reused. The table computes every
estimator's choice from the runs' metrics.jsonl with fedur.evaluation.choice (the run itself keeps the choice of
evaluation.estimator, whose summary.json must agree: it is checked). It exits non-zero when a run fails or disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedur.evaluation.choice import estimator_errors, label_free_choice  # noqa: E402
from fedur.evaluation.estimators import DEFAULT, ESTIMATORS  # noqa: E402

METHODS = {"fedur": "FedUR", "fedcopl": "FedCoPL", "promptfl": "PromptFL", "pfedmoap": "PFedMoAP"}
CHOOSERS = [e for e in ESTIMATORS if not e.startswith("agreement")]  # the estimators that can rank every candidate
# (evaluation.estimator: the choice each run keeps, mano's as the runs of benchmarks/results/label_free/ were made; the
# table recomputes every estimator's choice from the runs' metrics.jsonl, so this changes none of its numbers)
LABEL_FREE = ["--data.validation_fraction", "0.2", "--evaluation.select", "label_free", "--evaluation.estimator", "mano"]
DATASETS = {"demo": "the demo (configs/smoke.yaml: the demo CLIP on ten generated shapes, 4 clients, Dirichlet 0.5, 5 rounds)",
            "proxy": "tiny-clip on CIFAR-10 JPEGs (configs/proxy/cifar10-tinyclip.yaml: 10 clients, Dirichlet 0.1, 10 rounds)"}


def shared_dir() -> Path:
    return Path(os.environ.get("FEDUR_SHARED_DIR") or REPO.parent / "shared")


def cifar10(workdir: Path) -> Path:
    """The CIFAR-10 JPEG folder, extracted once from $FEDUR_SHARED_DIR/data/cifar10-jpg.tar.gz into workdir."""
    target = workdir / "cifar10-jpg"
    if not (target / "test").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(shared_dir() / "data" / "cifar10-jpg.tar.gz") as tar:
            tar.extractall(target, filter="data")
    return target


def command(dataset: str, method: str, seed: int, out: Path, workdir: Path, rounds: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "fedur.main"]
    if dataset == "demo":
        preset = REPO / "configs" / "presets" / "demo" / f"{method}.yaml"
        cmd += ["--config", str(REPO / "configs" / "smoke.yaml"), *(["--config", str(preset)] if preset.is_file() else [])]
    else:
        tiny = shared_dir() / "assets" / "tiny-clip"
        cmd += ["--config", str(REPO / "configs" / "proxy" / "cifar10-tinyclip.yaml"), "--dataset.root", str(cifar10(workdir)),
                "--model.config_file", str(tiny / "tinyclip-teacher-a.json"),
                "--model.pretrained", str(tiny / "tinyclip-teacher-a.pt")]
    cmd += ["--method", METHODS[method], *LABEL_FREE, "--run.seed", str(seed), "--run.output_dir", str(out),
            "--run.resume", "auto", "--run.progress", "false", "--run.figures", "false"]
    return cmd + (["--federation.rounds", str(rounds)] if rounds else [])


def run(args: argparse.Namespace) -> int:
    failed = 0
    for method in args.methods.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = args.workdir / args.dataset / f"{method}-seed{seed}"
            if (out / "summary.json").is_file():
                continue
            done = subprocess.run(command(args.dataset, method, seed, out, args.workdir, args.rounds), cwd=REPO,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}, capture_output=True,
                                  text=True)
            tail = (done.stderr.strip().splitlines() or [""])[-1][:200]
            print(f"{args.dataset} {method} seed {seed}: exit {done.returncode} {tail}", flush=True)
            failed += done.returncode != 0
    return 1 if failed else 0


def read(run_dir: Path) -> tuple[list[dict], dict, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((run_dir / "zero_shot.json").read_text()), json.loads((run_dir / "summary.json").read_text())


def measure(folder: Path) -> dict:
    """{method: {"runs": n, "errors": {estimator: {...}} per run, "choices": {estimator: choice} per run}} of every
    finished run in a dataset's folder; checks each run's own choice against the recomputed one."""
    found: dict = {}
    for run_dir in sorted(folder.glob("*-seed*")):
        if not (run_dir / "summary.json").is_file():
            continue
        method = run_dir.name.rsplit("-seed", 1)[0]
        rows, zero_shot, summary = read(run_dir)
        new = set(summary.get("new_clients") or [])
        training = [k for k in range(len(rows[-1]["client_accuracy"])) if k not in new]
        entry = found.setdefault(method, {"runs": [], "errors": [], "choices": []})
        entry["runs"].append(run_dir.name)
        entry["errors"].append(estimator_errors(rows, zero_shot, list(ESTIMATORS), training))
        entry["choices"].append({e: label_free_choice(rows, zero_shot, e, training) for e in CHOOSERS})
        kept, again = summary["label_free_choice"], entry["choices"][-1][summary["label_free_choice"]["estimator"]]
        if any(again[key] != value for key, value in kept.items()):  # (a key the run's fedur did not write: not compared)
            raise SystemExit(f"{run_dir}: the run's label-free choice differs from the one its metrics give")
    return found


def mean(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def below_zero_shot(choice: dict, error: float | None) -> int:
    """The clients whose choice is below their zero-shot accuracy by more than `error` (the estimator's MAE)."""
    if error is None:
        return 0
    return sum(1 for c in choice["clients"] if c["accuracy"] is not None and c["zero_shot_accuracy"] is not None
               and c["accuracy"] < c["zero_shot_accuracy"] - error)


def tables(dataset: str, found: dict) -> str:
    """The Markdown of one dataset: each estimator's error, then each estimator's choice against final, zero-shot and
    the oracle, per method (means over the seeds)."""
    out = [f"## {DATASETS[dataset]}", ""]
    out += ["Each estimator's error against the true test accuracy, mean over the seeds: MAE (points) over the clients "
            "and rounds, for the personal models, the server's model and zero-shot CLIP; rank correlation (Spearman) "
            "over the rounds of each client's estimate and accuracy, mean over the clients.", "",
            "| method | seeds | estimator | MAE personal | MAE server | MAE zero-shot | rank corr. personal | rank corr. server |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, entry in found.items():
        for e in ESTIMATORS:
            def pick(part: str, model: str, e: str = e, runs: list = entry["errors"]) -> float | None:
                return mean([run[e][part][model] for run in runs])
            out.append(f"| {METHODS[method]} | {len(entry['runs'])} | {e} | {fmt(pick('mae', 'personal'))} | "
                       f"{fmt(pick('mae', 'server'))} | {fmt(pick('mae', 'zero_shot'))} | "
                       f"{fmt(pick('rank_correlation', 'personal'))} | {fmt(pick('rank_correlation', 'server'))} |")
    out += ["", "The label-free choice by each estimator (accuracy %, mean over the seeds of the mean and of the worst "
            "client): against the final personal models, zero-shot CLIP and the oracle (the best candidate by true test "
            "accuracy). Goals: within 1 point of the oracle's mean; no client below its zero-shot accuracy by more than "
            "the estimator's MAE (personal, that run's): `below` counts those clients over the seeds.", "",
            "| method | estimator | chosen mean | chosen worst | final mean | final worst | zero-shot mean | zero-shot worst | "
            "oracle mean | oracle worst | regret | within 1 pt | below |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, entry in found.items():
        for e in CHOOSERS:
            choices = [run[e] for run in entry["choices"]]
            got = {key: mean([c[key] for c in choices]) for key in ("chosen_mean", "chosen_worst", "final_mean", "final_worst",
                                                                     "zero_shot_mean", "zero_shot_worst", "oracle_mean",
                                                                     "oracle_worst", "regret")}
            below = sum(below_zero_shot(c, err[e]["mae"]["personal"]) for c, err in zip(choices, entry["errors"]))
            within = "yes" if got["regret"] is not None and got["regret"] <= 1.0 else "no"
            out.append(f"| {METHODS[method]} | {e} | " + " | ".join(fmt(got[k]) for k in got) + f" | {within} | {below} |")
    return "\n".join(out + ranking(found)) + "\n"


def ranking(found: dict) -> list[str]:
    """The four methods' runs of a seed ranked as fedur-tables ranks a grid's runs (fedur/app/tables/ranking.py): by
    the default estimator's estimate of what the clients keep (their label-free choice), against the best by accuracy."""
    seeds = sorted({run.rsplit("-seed", 1)[1] for entry in found.values() for run in entry["runs"]}, key=int)
    out = ["", f"The methods' runs of each seed ranked without labels, as fedur-tables ranks a grid's runs: by the mean "
           f"{DEFAULT} estimate of the models the clients choose ({DEFAULT}'s choice), against the best by accuracy.", "",
           "| seed | chosen method | its estimate | its accuracy | best method | its accuracy | regret |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    regrets = []
    for seed in seeds:
        runs = [(METHODS[m], entry["choices"][i][DEFAULT]) for m, entry in found.items()
                for i, run in enumerate(entry["runs"]) if run.endswith(f"-seed{seed}")]
        if len(runs) < 2:
            continue
        chosen = max(runs, key=lambda r: r[1]["chosen_estimate_mean"])
        best = max(runs, key=lambda r: r[1]["chosen_mean"])
        regrets.append(best[1]["chosen_mean"] - chosen[1]["chosen_mean"])
        out.append(f"| {seed} | {chosen[0]} | {fmt(chosen[1]['chosen_estimate_mean'])} | {fmt(chosen[1]['chosen_mean'])} | "
                   f"{best[0]} | {fmt(best[1]['chosen_mean'])} | {fmt(regrets[-1])} |")
    return out + (["", f"Mean regret: {fmt(mean(regrets))} points."] if regrets else [])


def table(args: argparse.Namespace) -> int:
    parts, data = ["# Accuracy without labels: each estimator's error and the label-free choice", "",
                   f"`python benchmarks/label_free.py table {args.workdir} --out {args.out}` over the runs of "
                   "`python benchmarks/label_free.py run DATASET`, every run with "
                   f"`{' '.join(LABEL_FREE)}` (the run keeps mano's choice, which the table checks; every estimator's choice "
                   "is recomputed from its metrics.jsonl with fedur.evaluation.choice).", *([args.note] if args.note else [])], {}
    for dataset in DATASETS:
        folder = args.workdir / dataset
        if folder.is_dir():
            found = measure(folder)
            if found:
                data[dataset] = found
                parts += ["", tables(dataset, found)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "label_free.md").write_text("\n".join(parts) + "\n")
    (args.out / "label_free.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print("\n".join(parts))
    return 0 if data else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one dataset's grid")
    r.add_argument("dataset", choices=tuple(DATASETS))
    r.add_argument("--seeds", default="1,2,3")
    r.add_argument("--methods", default=",".join(METHODS))
    r.add_argument("--rounds", type=int, default=None, help="fewer rounds than the config's (a smoke of the benchmark)")
    r.add_argument("--workdir", type=Path, default=Path("/tmp/label-free"))
    t = sub.add_parser("table", help="the Markdown table of the finished runs")
    t.add_argument("workdir", type=Path)
    t.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "label_free")
    t.add_argument("--note", default="", help="a paragraph under the header (how and where the runs were made)")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    sys.exit(main())
