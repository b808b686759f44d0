"""The per-client class histograms of the paper's label-skew splits on real CIFAR-10 images.

Runs one round of FedUR with tiny-clip (../shared/assets/tiny-clip) on the CIFAR-10 JPEGs of
../shared/data, once with Dirichlet beta=0.1 and once with quantity skew (10 clients), and writes
each run's partition.json / partition_{train,test}.png plus a Markdown summary.

    python benchmarks/partition_heatmaps.py --shared-dir ../shared [--out benchmarks/results/partitions]

`--data-root DIR` reads an extracted CIFAR-10 folder (any subset of it) instead of extracting the archive.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.learning_check import extract  # noqa: E402
from fedur.app.cli import parse_config  # noqa: E402
from fedur.app.run import run  # noqa: E402

SETTINGS = {"dirichlet-beta0.1": ["--federation.partition", "dirichlet", "--federation.beta", "0.1"],
            "quantity": ["--federation.partition", "quantity"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared-dir", type=Path, default=Path(os.environ.get("FEDUR_SHARED_DIR", "../shared")))
    parser.add_argument("--data-root", type=Path, help="an extracted CIFAR-10 folder (default: the shared archive, "
                                                        "extracted into --out)")
    parser.add_argument("--clients", type=int, default=10, help="at least 5: quantity skew gives each class 20%% of them")
    parser.add_argument("--threads", type=int, help="run.threads of the runs (default: fedur's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/partitions"))
    args = parser.parse_args(argv)
    tiny = args.shared_dir / "assets" / "tiny-clip"
    data = args.data_root or extract(args.shared_dir / "data" / "cifar10-jpg.tar.gz", args.out / "cifar10-jpg")
    shown = " ".join(sys.argv[1:] if argv is None else argv) or "--shared-dir ../shared"
    lines = [f"# Partition heatmaps on CIFAR-10 ({args.clients} clients, seed 1)", "",
             f"Command: `python benchmarks/partition_heatmaps.py {shown}`", ""]
    for name, partition in SETTINGS.items():
        run_dir = args.out / name
        if not (run_dir / "summary.json").exists():
            cfg = parse_config([
                "--model.name", "tinyclip-teacher-a", "--model.config_file", str(tiny / "tinyclip-teacher-a.json"),
                "--model.pretrained", str(tiny / "tinyclip-teacher-a.pt"), "--dataset", "ImageFolder",
                "--dataset.root", str(data), "--data.num_workers", "0", "--federation.num_clients", str(args.clients),
                "--federation.rounds", "1", "--federation.local_epochs", "1", "--run.output_dir", str(run_dir),
                *partition, *(["--run.threads", str(args.threads)] if args.threads else []),
            ])
            run(cfg)
        split = json.loads((run_dir / "partition.json").read_text())
        train = np.array(split["train"])
        lines += [f"## {name}", "", f"Images: `{run_dir}/partition_train.png`, `{run_dir}/partition_test.png`.", "",
                  "| client | " + " | ".join(split["classnames"]) + " | total | classes held |",
                  "| --- " * (len(split["classnames"]) + 3) + "|"]
        for k, row in enumerate(train):
            lines.append(f"| {k} | " + " | ".join(str(v) for v in row) + f" | {row.sum()} | {(row > 0).sum()} |")
        lines.append("")
    (args.out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
