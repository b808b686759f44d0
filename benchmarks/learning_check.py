"""Does FedUR learn on real images? FedUR vs FedCoPL vs zero-shot CLIP on CIFAR-10 with tiny-clip, on CPU.

tiny-clip (../shared/assets/tiny-clip) is a small CLIP trained on CIFAR-10 with deliberately noisy
captions: a real, biased zero-shot teacher (59% on the test set) that loads offline. This script
extracts the CIFAR-10 JPEGs from ../shared/data, then runs `fedur/main.py` once per variant with the
paper's schedule (10 clients, Dirichlet beta 0.1, 20 rounds x 10 local epochs, refresh every 5) on a
stratified fraction of the images, and writes a Markdown table of the results.

    python benchmarks/learning_check.py                        # ~40 min on 2 CPU cores
    python benchmarks/learning_check.py --variants fedur --seeds 1,2,3

Finished runs (same variant and seed in the same --workdir) are reused when rerun. `--data-root DIR` reads an
extracted CIFAR-10 folder (train/<class>/, test/<class>/; any subset of it) instead of extracting the archive.
Exits non-zero when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {
    "fedur": [],
    "fedcopl": ["--method", "FedCoPL"],
    # diagnostics of the aggregation protocol (what the server averages)
    "fedur-local": ["--method.share", "none"],
    "fedur-share-both": ["--method.share", "both"],
    "fedur-text-only": ["--model.visual_tokens", "0"],  # only the personal text prompt is trained
}


def extract(archive: Path, target: Path) -> Path:
    if not (target / "test").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
    return target


def run_variant(name: str, seed: int, args: argparse.Namespace, data_root: Path, tiny: Path) -> dict:
    out = args.workdir / f"{name}-seed{seed}"
    if (out / "summary.json").exists():
        print(f"[{name}] done before: {out}")
        return json.loads((out / "summary.json").read_text())
    cmd = [
        sys.executable, str(REPO / "fedur" / "main.py"),
        "--run.resume", "auto",  # an interrupted run continues from its last committed round
        "--model.name", "tinyclip-teacher-a",
        "--model.config_file", str(tiny / "tinyclip-teacher-a.json"),
        "--model.pretrained", str(tiny / "tinyclip-teacher-a.pt"),
        "--dataset", "ImageFolder", "--dataset.root", str(data_root), "--data.num_workers", "0",
        "--data.train_fraction", str(args.train_fraction), "--data.test_fraction", str(args.test_fraction),
        "--federation.num_clients", str(args.clients), "--federation.partition", "dirichlet", "--federation.beta", "0.1",
        "--federation.rounds", str(args.rounds), "--federation.local_epochs", str(args.local_epochs),
        "--federation.refresh_every", str(args.refresh_every),
        "--run.seed", str(seed), "--run.threads", str(args.threads), "--run.output_dir", str(out),
        *VARIANTS[name],
    ]
    print(f"[{name} seed {seed}] {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(f"[{name} seed {seed}] {time.perf_counter() - start:.0f} s", flush=True)
    return json.loads((out / "summary.json").read_text())


def table(results: dict[tuple[str, int], dict], args: argparse.Namespace) -> str:
    lines = [
        f"CIFAR-10 (tiny-clip), {args.clients} clients, Dirichlet beta 0.1: {args.rounds} rounds x {args.local_epochs} local "
        f"epochs, refresh every {args.refresh_every}; train fraction {args.train_fraction}, test fraction "
        f"{args.test_fraction}. Accuracies in %, mean over clients of each client's own test set.",
        "",
        "| method | seed | final | best (round) | zero-shot client mean | zero-shot global | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (name, seed), s in results.items():
        lines.append(
            f"| {name} | {seed} | {s['final_mean_accuracy']:.2f} | {s['best_mean_accuracy']:.2f} ({s['best_round']}) "
            f"| {s['zero_shot_client_mean']:.2f} | {s['zero_shot_global']:.2f} | {s['wall_seconds']:.0f} |"
        )
    seeds = sorted({seed for _, seed in results})
    if len(seeds) > 1:
        lines += ["", "| method | mean final over seeds | mean zero-shot client mean | gain |", "| --- | --- | --- | --- |"]
        for name in dict.fromkeys(name for name, _ in results):
            runs = [s for (n, _), s in results.items() if n == name]
            final = sum(r["final_mean_accuracy"] for r in runs) / len(runs)
            zero = sum(r["zero_shot_client_mean"] for r in runs) / len(runs)
            lines.append(f"| {name} ({len(runs)} seeds) | {final:.2f} | {zero:.2f} | {final - zero:+.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared-dir", type=Path, default=Path(os.environ.get("FEDUR_SHARED_DIR", REPO.parent / "shared")))
    parser.add_argument("--data-root", type=Path, help="an extracted CIFAR-10 folder (default: the shared archive, "
                                                        "extracted into --workdir)")
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "results" / "learning_check")
    parser.add_argument("--variants", default="fedur,fedcopl,fedur-local")
    parser.add_argument("--train-fraction", type=float, default=0.05)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=10)
    parser.add_argument("--refresh-every", type=int, default=5)
    parser.add_argument("--seeds", default="1", help="comma-separated, e.g. 1,2,3 (the paper's seeds)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", default="results.md", help="Markdown table written into --workdir")
    args = parser.parse_args(argv)

    tiny = args.shared_dir / "assets" / "tiny-clip"
    archive = args.shared_dir / "data" / "cifar10-jpg.tar.gz"
    if not tiny.is_dir() or not (args.data_root or archive).exists():
        sys.exit(f"needs {tiny} and {args.data_root or archive}: pass --shared-dir (or set FEDUR_SHARED_DIR) or --data-root")
    data_root = args.data_root or extract(archive, args.workdir / "cifar10-jpg")
    results = {
        (name, int(seed)): run_variant(name, int(seed), args, data_root, tiny)
        for seed in args.seeds.split(",")
        for name in args.variants.split(",")
    }
    report = table(results, args)
    (args.workdir / args.report).write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
