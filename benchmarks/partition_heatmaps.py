"""The per-client class histograms of the paper's label-skew splits on real CIFAR-10 images.

Runs one round of FedUR with tiny-clip (../shared/assets/tiny-clip) on the CIFAR-10 JPEGs of
../shared/data, once with Dirichlet beta=0.1 and once with quantity skew (10 clients), and writes
each run's partition.json / partition_{train,test}.png plus a Markdown summary.

    python benchmarks/partition_heatmaps.py --shared-dir ../shared [--out benchmarks/results/partitions]
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
from fedur.main import parse_config, run  # noqa: E402

SETTINGS = {"dirichlet-beta0.1": ["--federation.partition", "dirichlet", "--federation.beta", "0.1"],
            "quantity": ["--federation.partition", "quantity"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared-dir", type=Path, default=Path(os.environ.get("FEDUR_SHARED_DIR", "../shared")))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/partitions"))
    args = parser.parse_args()
    tiny = args.shared_dir / "assets" / "tiny-clip"
    data = extract(args.shared_dir / "data" / "cifar10-jpg.tar.gz", args.out / "cifar10-jpg")
    lines = ["# Partition heatmaps on CIFAR-10 (10 clients, seed 1)", "",
             "Command: `python benchmarks/partition_heatmaps.py --shared-dir ../shared`", ""]
    for name, partition in SETTINGS.items():
        run_dir = args.out / name
        if not (run_dir / "summary.json").exists():
            cfg, config_yaml = parse_config([
                "--model.name", "tinyclip-teacher-a", "--model.config_file", str(tiny / "tinyclip-teacher-a.json"),
                "--model.pretrained", str(tiny / "tinyclip-teacher-a.pt"), "--dataset", "ImageFolder",
                "--dataset.root", str(data), "--data.num_workers", "0", "--federation.num_clients", "10",
                "--federation.rounds", "1", "--federation.local_epochs", "1", "--run.output_dir", str(run_dir),
                *partition,
            ])
            run(cfg, config_yaml)
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


if __name__ == "__main__":
    main()
