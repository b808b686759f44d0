"""What a round costs with many small clients, one by one or in groups (run.clients_per_step), side by side
with an older checkout of fedur.

fedur's tiny random-init CLIP (configs/tiny.yaml) on 5,000 generated images (10 shapes x 500) split IID
over K = 10, 100 or 1,000 clients, a pseudo-label refresh every round, 1 local epoch, on 1 or 2 ranks
(`fabric run --accelerator cpu`). Every cell is a whole `fedur/main.py` run; its rounds' `round_seconds`
and `phase_seconds` (refresh, train, aggregate, evaluate) come from its metrics.jsonl, the first round left
out (warm-up). Runs of the compared settings alternate, so that load from other work falls on all of them.

    python benchmarks/many_clients.py                                  # this checkout, K = 10, 100, 1000
    python benchmarks/many_clients.py --before /tmp/fedur-old          # and an older checkout beside it
    python benchmarks/many_clients.py --clients 2 --groups 1 --ranks 1 --rounds 2 --train-per-class 2 \
        --test-per-class 1 --out /tmp/many.md                           # a smoke: one small run

Results: benchmarks/results/many_clients.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("refresh", "train", "aggregate", "evaluate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(repo: Path, clients: int, group: int, rounds: int, legacy: bool, train: int = 500, test: int = 50) -> list[str]:
    """The run's flags (`train` / `test` images per class of the 10 shapes); `legacy`: a checkout from before
    datasets were plugins (its config and data flags)."""
    data = (["--config", str(repo / "tests" / "tiny.yaml"), "--data.name", "synthetic", "--data.synthetic_classes", "10",
             "--data.synthetic_train_per_class", str(train), "--data.synthetic_test_per_class", str(test)] if legacy else
            ["--config", str(repo / "configs" / "tiny.yaml"), "--dataset", "Synthetic", "--dataset.classes", "10",
             "--dataset.train_per_class", str(train), "--dataset.test_per_class", str(test)])
    return [*data, "--federation.num_clients", str(clients), "--federation.partition", "iid",
            "--federation.min_train_per_client", "1", "--federation.rounds", str(rounds), "--federation.local_epochs", "1",
            "--federation.refresh_every", "1", "--run.clients_per_step", str(group), "--run.progress", "false"]


def run(repo: Path, argv: list[str], ranks: int, workdir: Path) -> dict:
    out = workdir / f"run-{time.monotonic_ns()}"
    if ranks == 1:
        head = [sys.executable, str(repo / "fedur" / "main.py")]
    else:
        head = [str(Path(sys.executable).parent / "fabric"), "run", "--accelerator", "cpu", "--devices", str(ranks),
                "--main-port", str(free_port()), str(repo / "fedur" / "main.py")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo)}
    start = time.perf_counter()
    done = subprocess.run([*head, *argv, "--run.output_dir", str(out)], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # the first: warm-up
    return {
        "wall": time.perf_counter() - start,
        "round": [r["round_seconds"] for r in rows],
        **{p: [r["phase_seconds"][p] for r in rows] for p in PHASES},
        "accuracy": json.loads((out / "summary.json").read_text())["final_mean_accuracy"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--groups", default="1,10", help="run.clients_per_step values")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--rounds", type=int, default=4, help="at least 2: the first is left out")
    parser.add_argument("--train-per-class", type=int, default=500, help="generated train images per shape")
    parser.add_argument("--test-per-class", type=int, default=50, help="generated test images per shape")
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell (alternating)")
    parser.add_argument("--before", type=Path, help="an older fedur checkout, measured side by side")
    parser.add_argument("--before-legacy", action="store_true", default=True,
                        help="the older checkout takes the pre-plugin data flags (data.name, tests/tiny.yaml)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "many_clients.md")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first round is left out (warm-up)")
    versions = {"now": (REPO, False)}
    if args.before:
        versions["before"] = (args.before.resolve(), args.before_legacy)
    cells = [(k, g, r) for k in map(int, args.clients.split(",")) for g in map(int, args.groups.split(","))
             for r in map(int, args.ranks.split(","))]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fedur-many-clients-") as tmp:
        for repeat in range(args.repeats):
            for k, g, r in cells:
                for version, (repo, legacy) in versions.items():  # alternating versions within a cell
                    key = f"{version}|{k}|{g}|{r}"
                    got = run(repo, settings(repo, k, g, args.rounds, legacy, args.train_per_class, args.test_per_class),
                              r, Path(tmp))
                    cell = results.setdefault(key, {"round": [], **{p: [] for p in PHASES}, "accuracy": got["accuracy"]})
                    for name in ("round", *PHASES):
                        cell[name] += got[name]
                    print(f"[{repeat + 1}/{args.repeats}] {version:6} K={k:<5} group {g:<3} ranks {r}: round "
                          f"{statistics.median(got['round']):.3f} s, " + ", ".join(
                              f"{p} {statistics.median(got[p]):.3f}" for p in PHASES), flush=True)
    lines = [
        "# A round with many small clients",
        "",
        f"`python benchmarks/many_clients.py {' '.join(argv)}`: fedur's tiny CLIP, {10 * args.train_per_class:,} generated "
        f"images IID over K clients, a refresh every round, 1 local epoch, CPU (2 cores); median seconds over rounds "
        f"2-{args.rounds} (the first left out) of every run of the cell. Groups: run.clients_per_step.",
        "",
        "| version | clients | group | ranks | round (s) | refresh | train | aggregate | evaluate | round vs one by one |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, cell in results.items():
        version, k, g, r = key.split("|")
        med = {n: statistics.median(cell[n]) for n in ("round", *PHASES)}
        alone = results.get(f"{version}|{k}|1|{r}")
        ratio = f"x{statistics.median(alone['round']) / med['round']:.2f} faster" if alone and g != "1" else ""
        lines.append(f"| {version} | {k} | {g} | {r} | {med['round']:.3f} | " + " | ".join(f"{med[p]:.3f}" for p in PHASES)
                     + f" | {ratio} |")
    if args.before:
        lines += ["", "| clients | group | ranks | round: before / now |", "|---|---|---|---|"]
        for k, g, r in cells:
            a, b = results[f"before|{k}|{g}|{r}"], results[f"now|{k}|{g}|{r}"]
            lines.append(f"| {k} | {g} | {r} | x{statistics.median(a['round']) / statistics.median(b['round']):.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
