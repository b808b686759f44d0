"""The cross-dataset protocol on the demo: every finished run of a grid column, tested by fedur-cross-dataset on
other shape datasets, as a Markdown table (docs/protocols.md).

    fedur-tables demo-protocols --seeds 1,2,3 --out OUT
    python benchmarks/cross_dataset_demo.py OUT/demo-protocols/demo-protocols --out benchmarks/results/protocols/cross-dataset.md

The demo's CLIP knows only shapes, so the targets are shapes too: SyntheticDomains' sketch and mosaic (the
same ten names in another style: a cross-domain test) and a fresh Synthetic draw of five of the ten shapes
(another class set: the server's model classifies among those five names). Each cell: the server model's
accuracy, mean ± sample std over the seeds, and beside it zero-shot CLIP's on the same images. Exits non-zero
when a run cannot be tested. `--test-per-class N` draws N test images per class of every target instead (a
smoke of the script: tests/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from fedur.app.cross_dataset import cross_dataset

TARGETS = {
    "sketch": ["--dataset", "SyntheticDomains", "--dataset.domains", "[sketch]", "--dataset.test_per_class", "20"],
    "mosaic": ["--dataset", "SyntheticDomains", "--dataset.domains", "[mosaic]", "--dataset.test_per_class", "20"],
    "5 shapes": ["--dataset", "Synthetic", "--dataset.classes", "5", "--dataset.test_per_class", "40"],
}


def cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    return f"{mean:.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("column", type=Path, help="a grid column's folder: <row>/seed<k>/ run directories")
    parser.add_argument("--out", type=Path, help="write the table here too")
    parser.add_argument("--test-per-class", type=int, help="test images per class of every target (default: each target's own)")
    args = parser.parse_args(argv)
    targets = {name: [*flags, *(["--dataset.test_per_class", str(args.test_per_class)] if args.test_per_class else [])]
               for name, flags in TARGETS.items()}  # the later flag wins
    rows = sorted(p for p in args.column.iterdir() if p.is_dir())
    lines = ["| method | " + " | ".join(f"{t} (server) | {t} (zero-shot)" for t in TARGETS) + " |",
             "|---|" + "---|---|" * len(TARGETS)]
    failed = 0
    for row in rows:
        results = {t: ([], []) for t in TARGETS}
        for run in sorted(row.glob("seed*")):
            if not (run / "summary.json").is_file():
                continue
            for target, flags in targets.items():
                try:
                    result = cross_dataset(run, [*flags, "--run.progress", "false"])
                except Exception as err:  # noqa: BLE001 (reported and counted: the script then fails)
                    print(f"{run}: {target}: {err}", file=sys.stderr)
                    failed += 1
                    continue
                results[target][0].append(result["accuracy"])
                results[target][1].append(result["zero_shot_accuracy"])
        lines.append(f"| {row.name} | " + " | ".join(f"{cell(s)} | {cell(z)}" for s, z in results.values()) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
