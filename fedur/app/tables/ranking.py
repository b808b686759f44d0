"""A grid's runs ranked without labels: in each column and seed, the run a user without labels would deploy is the one
whose models the label-free estimate rates highest (summary.json's label_free_choice's chosen_estimate_mean, else
final_estimated_mean: the mean over the clients of the estimate of what each keeps); the regret is how much true
accuracy that costs against choosing by the test accuracy (docs/label-free.md). A row of a grid is a method or a
setting (a learning-rate sweep is rows of one method), so this chooses among them."""

from __future__ import annotations

from fedur.app.tables.grids import RunSpec
from fedur.app.tables.runner import read_summary


def scores(summary: dict) -> tuple[float | None, float | None]:
    """(the run's estimate, its true mean accuracy) of what its clients keep: their label-free choice, or their final
    models."""
    choice = summary.get("label_free_choice") or {}
    if choice.get("chosen_estimate_mean") is not None:
        return choice["chosen_estimate_mean"], choice.get("chosen_mean")
    return summary.get("final_estimated_mean"), summary.get("final_mean_accuracy")


def ranked(specs: list[RunSpec]) -> list[dict]:
    """Per column and seed with at least two finished runs that have an estimate: the run chosen by the estimate and
    its accuracy, the best run by accuracy and its accuracy, the regret (points)."""
    groups: dict[tuple[str, int], list[tuple[RunSpec, float, float | None]]] = {}
    for spec in specs:
        if spec.column.runs is not None:  # a column that shows other numbers of another column's runs: ranked there
            continue
        summary = read_summary(spec.run_dir)
        estimate, accuracy = scores(summary) if summary else (None, None)
        if estimate is not None:
            groups.setdefault((spec.column.key, spec.seed), []).append((spec, estimate, accuracy))
    out = []
    for (column, seed), runs in groups.items():
        if len(runs) < 2:
            continue
        chosen = max(runs, key=lambda r: r[1])  # the first on ties: grid order
        known = [r for r in runs if r[2] is not None]
        best = max(known, key=lambda r: r[2]) if known else None
        regret = None if best is None or chosen[2] is None else best[2] - chosen[2]
        out.append({"column": column, "seed": seed, "runs": len(runs), "chosen": " / ".join(chosen[0].row.labels),
                     "chosen_estimate": chosen[1], "chosen_accuracy": chosen[2],
                     "best": None if best is None else " / ".join(best[0].row.labels),
                     "best_accuracy": None if best is None else best[2], "regret": regret})
    return out


def markdown(specs: list[RunSpec]) -> list[str]:
    """The section of table.md (no lines where no column has two finished runs with an estimate)."""
    found = ranked(specs)
    if not found:
        return []
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["## Runs ranked without labels", "",
             "Per column and seed, the run whose clients' kept models the label-free estimate rates highest (what a user "
             "without labels would deploy) against the best run by test accuracy; regret = best - chosen (points; "
             "docs/label-free.md).", "",
             "| column | seed | runs | chosen by the estimate | its estimate | its accuracy | best by accuracy | its accuracy | regret |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in found:
        lines.append(f"| {r['column']} | {r['seed']} | {r['runs']} | {r['chosen']} | {fmt(r['chosen_estimate'])} | "
                     f"{fmt(r['chosen_accuracy'])} | {r['best'] or '—'} | {fmt(r['best_accuracy'])} | {fmt(r['regret'])} |")
    regrets = [r["regret"] for r in found if r["regret"] is not None]
    if regrets:
        lines += ["", f"Mean regret over {len(regrets)} column x seed choice(s): {sum(regrets) / len(regrets):.2f} points."]
    return lines + [""]
