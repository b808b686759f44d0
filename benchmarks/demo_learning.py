"""Does FedUR learn on the demo? FedUR, FedCoPL and GDA-U vs zero-shot on configs/smoke.yaml, over seeds, on CPU.

The demo CLIP (fedur/model/weights/fedur-demo.pt, see its model card) separates the ten shapes well but
names them wrongly in a structured way: zero-shot is ~55%, a linear probe ~94%. This runs
`fedur/main.py --config configs/smoke.yaml` once per variant and seed and writes a Markdown table of
zero-shot client mean, final mean and gain; `tests/test_learning.py` takes its margin from it.

    python benchmarks/demo_learning.py                    # 5 seeds x 3 variants, ~5 min on 2 CPU cores
    python benchmarks/demo_learning.py --seeds 1,2,3 --variants fedur

Every run is a fresh process; finished runs in the same --workdir are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {
    "fedur": [],
    "fedcopl": ["--method", "FedCoPL"],  # no class weights, no negatives
    "gdau": ["--method", "GDAU"],  # training-free: EM of a Gaussian discriminant from zero-shot, ensembled with it
}


def run(variant: str, seed: int, args: argparse.Namespace) -> dict:
    out = args.workdir / f"{variant}-seed{seed}"
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    cmd = [
        sys.executable, str(REPO / "fedur" / "main.py"), "--config", str(args.config),
        "--run.seed", str(seed), "--federation.partition_seed", str(seed),  # a demo of its own per seed
        "--run.output_dir", str(out), "--run.progress", "false", *VARIANTS[variant],
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"[{variant} seed {seed}] failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    print(
        f"[{variant} seed {seed}] zero-shot {summary['zero_shot_client_mean']:.2f}  final "
        f"{summary['final_mean_accuracy']:.2f}  ({time.perf_counter() - start:.0f} s)", flush=True,
    )
    return summary


def table(results: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| method | seed | zero-shot client mean | final mean | gain |",
        "|---|---|---|---|---|",
    ]
    for variant, by_seed in results.items():
        gains = []
        for seed, s in by_seed.items():
            gain = s["final_mean_accuracy"] - s["zero_shot_client_mean"]
            gains.append(gain)
            lines.append(
                f"| {variant} | {seed} | {s['zero_shot_client_mean']:.2f} | {s['final_mean_accuracy']:.2f} | {gain:+.2f} |"
            )
        lines.append(f"| {variant} | min / mean gain | | | {min(gains):+.2f} / {sum(gains) / len(gains):+.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedur-demo-learning"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "demo_learning.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {v: {seed: run(v, seed, args) for seed in seeds} for v in args.variants.split(",")}
    text = (
        f"# FedUR, FedCoPL and GDA-U on the demo ({args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config})\n\n"
        f"`python benchmarks/demo_learning.py --seeds {args.seeds} --variants {args.variants}`: one process per run, "
        "mean client accuracy (%) on each client's test split.\n\n" + table(results) + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
