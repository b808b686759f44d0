"""What privacy costs the pseudo-label selection, from a privacy grid's runs (`fedur-tables demo-privacy`): per method
and setting, the pseudo-label accuracy of the selected images and how many were selected (means over the refreshes
and the seeds), the personal accuracy, epsilon at the end, and the histogram attack's total variation, beside the run
without privacy.

    fedur-tables demo-privacy --seeds 1,2,3 --jobs 2 --out runs/tables
    python benchmarks/privacy_selection.py runs/tables/demo-privacy > benchmarks/results/privacy/demo-selection.md

Exits non-zero when the folder holds no finished run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def run_numbers(run: Path) -> dict | None:
    """One finished run's numbers (None: not finished)."""
    if not (run / "summary.json").is_file():
        return None
    summary = json.loads((run / "summary.json").read_text())
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    refreshes = [r for r in rounds if r.get("refreshed")]
    hits = [statistics.fmean(a for a in r["pseudo_label_accuracy"] if a is not None) for r in refreshes
            if any(a is not None for a in r["pseudo_label_accuracy"])]
    selected = [sum(r["selected"]) for r in refreshes]
    leak = run / "attack" / "histograms.json"
    return {
        "accuracy": summary["final_mean_accuracy"],
        "pseudo_label_accuracy": statistics.fmean(hits) if hits else None,
        "selected": statistics.fmean(selected) if selected else None,
        "epsilon": (summary.get("privacy") or {}).get("epsilon"),
        "histogram_tv": json.loads(leak.read_text()).get("mean_tv") if leak.is_file() else None,
    }


def setting_order(column: Path) -> tuple:
    """none first, then central and local, each by epsilon."""
    parts = column.name.removeprefix("demo-privacy-").split("-")
    mode = {"none": 0, "central": 1, "local": 2}.get(parts[0], 3)
    return (mode, float(parts[1].removeprefix("eps")) if len(parts) > 1 and parts[1].startswith("eps") else 0.0, column.name)


def mean_of(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.fmean(present):.2f}" if present else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", type=Path, help="the grid's folder (<--out>/demo-privacy)")
    args = parser.parse_args(argv)
    columns = sorted((p for p in args.grid.iterdir() if p.is_dir() and p.name.startswith("demo-privacy-")), key=setting_order)
    methods = sorted({m.name for c in columns for m in c.iterdir() if m.is_dir()})
    lines = ["| method | setting | seeds | personal acc. | pseudo-label acc. | selected per refresh | epsilon | histogram TV |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    found = 0
    for method in methods:
        for column in columns:
            runs = [n for n in (run_numbers(s) for s in sorted((column / method).glob("seed*")) if s.is_dir()) if n]
            if not runs:
                continue
            found += len(runs)
            setting = column.name.removeprefix("demo-privacy-")
            lines.append(f"| {method} | {setting} | {len(runs)} | " + " | ".join(
                mean_of([r[key] for r in runs]) for key in ("accuracy", "pseudo_label_accuracy", "selected", "epsilon",
                                                            "histogram_tv")) + " |")
    if not found:
        print(f"no finished run under {args.grid}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
