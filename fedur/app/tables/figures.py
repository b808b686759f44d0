"""A grid's figures, as PNG and PDF beside its table: a bar chart of every table (the worst client marked), the
paper's Figure 3 (accuracy against the number of clients and the joining rate, one line per method, a band for
the seeds' spread) and its Figure 2 (the clients' prompt divergence per round, visual and text prompts)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from fedur.app.tables.grids import FINAL, SYSTEM_PREFIX, Grid, RunSpec
from fedur.metrics import round_numbers
from fedur.plots import band_panels, band_plot, bar_chart, save_figure

FIGURE3_SETTINGS = ("clients", "join")  # Column.setting prefixes of figure3's columns: clients<K>, join<rate>
DIVERGENCE = "drift_diversity"  # FedVLS's drift diversity of the clients' updates (fedur/federated/divergence.py)
PROMPT_LABELS = {"visual": "visual prompt", "text_ctx": "text prompt", "text_local": "local text prompt"}


def write_figures(grid: Grid, cells: dict, specs: list[RunSpec], folder: Path) -> list[Path]:
    """Every figure the grid's finished runs allow; returns the files written."""
    files = []
    for section in dict.fromkeys(c.section for c in grid.columns):
        files += table_bars(grid, cells, section, folder)
    files += figure3(grid, cells, folder)
    files += privacy_figure(grid, cells, folder)
    files += virtual_time_figure(grid, specs, folder)
    for column in (c for c in grid.columns if c.runs is None):  # a reading column's runs are its owner's
        files += figure2(grid, [s for s in specs if s.column is column], folder)
    return files


def _stem(text: str) -> str:
    """A file name from a label: "CIFAR10, joining rate (10 clients)" -> "cifar10-joining-rate-10-clients"."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def table_bars(grid: Grid, cells: dict, section: str, folder: Path) -> list[Path]:
    """The section's table as grouped bars (one group per column, one bar per row): the mean over the seeds with
    its standard deviation, and the worst client's accuracy (mean over the seeds) marked on each bar."""
    columns = [c for c in grid.columns if c.section == section]
    rows = [r for r in grid.rows if any((r.key, c.key) in cells and cells[(r.key, c.key)].mean is not None for c in columns)]
    if not rows:
        return []
    groups = [c.label for c in columns]
    bars = {}
    for row in rows:
        found = [cells.get((row.key, c.key)) for c in columns]
        bars[" ".join(label for label in row.labels if label != "-")] = (
            [None if cell is None else cell.mean for cell in found],
            [None if cell is None else cell.std for cell in found],
            [None if cell is None else cell.worst_mean for cell in found],
        )
    personal = all(c.value in (None, FINAL) for c in columns) and all(r.value == FINAL for r in rows)
    ylabel = "final mean accuracy over clients (%)" if personal else "final accuracy (%), as each column says"
    fig = bar_chart(groups, bars, f"{grid.title}\n{section}", ylabel)
    keys = [c.key for c in columns]
    return save_figure(fig, folder / f"table-{_stem(keys[0] if len(keys) == 1 else f'{keys[0]}-to-{keys[-1]}')}")


def figure3_series(grid: Grid, cells: dict, prefix: str) -> dict[str, tuple[list, list, list, list]]:
    """Figure 3's lines for the columns `prefix`<x> ("clients" or "join"): "<row>, <dataset>" -> (xs, means over
    the seeds, lowest seed, highest seed), sorted by x."""
    columns = [c for c in grid.columns if c.setting.startswith(prefix)]
    series = {}
    for dataset in dict.fromkeys(c.dataset for c in columns):
        for row in grid.rows:
            points = []
            for column in (c for c in columns if c.dataset == dataset):
                cell = cells.get((row.key, column.key))
                if cell is not None and cell.value:
                    values = list(cell.value.values())
                    points.append((float(column.setting[len(prefix):]), statistics.fmean(values), min(values), max(values)))
            if points:
                series[f"{' '.join(row.labels)}, {dataset}"] = tuple(list(t) for t in zip(*sorted(points)))
    return series


def figure3(grid: Grid, cells: dict, folder: Path) -> list[Path]:
    """Figure 3: final accuracy against the number of clients (columns clients<K>) and against the joining rate
    (columns join<rate>), one line per row and dataset, a band from the lowest to the highest seed."""
    files = []
    for prefix, what, xlabel in (("clients", "number of clients", "number of clients K (every client joins)"),
                                 ("join", "joining rate", "joining rate (the fraction of clients in each round)")):
        series = figure3_series(grid, cells, prefix)
        if series:
            fig = band_plot(series, f"{grid.title}\naccuracy against the {what}", xlabel,
                            "final mean accuracy over clients (%)", log_x=prefix == "clients")
            files += save_figure(fig, folder / f"figure3-{prefix}")
    return files


PRIVACY_SETTING = "privacy-"  # Column.setting of the privacy grid's columns: privacy-<mode>-<epsilon>, privacy-none


def privacy_series(grid: Grid, cells: dict, section: str) -> dict[str, tuple[list, list, list, list]]:
    """Accuracy against epsilon: "<row>, <mode>" -> (epsilons, means over the seeds, lowest seed, highest seed), the
    run without privacy drawn at the right of the largest epsilon (x = 4 x the largest: "none")."""
    columns = [c for c in grid.columns if c.section == section and c.setting.startswith(PRIVACY_SETTING)]
    finite = [float(c.setting.rsplit("-", 1)[1]) for c in columns if not c.setting.endswith("-none")]
    if not finite:
        return {}
    none_x = 4 * max(finite)
    series = {}
    for row in grid.rows:
        for mode in dict.fromkeys(c.setting.split("-")[1] for c in columns if not c.setting.endswith("-none")):
            points = []
            for column in columns:
                parts = column.setting.split("-")
                if column.setting.endswith("-none") or parts[1] == mode:
                    cell = cells.get((row.key, column.key))
                    if cell is not None and cell.value:
                        values = list(cell.value.values())
                        x = none_x if column.setting.endswith("-none") else float(parts[2])
                        points.append((x, statistics.fmean(values), min(values), max(values)))
            if len(points) > 1:
                series[f"{' '.join(label for label in row.labels if label != '-')}, {mode}"] = tuple(list(t) for t in zip(*sorted(points)))
    return series


def privacy_figure(grid: Grid, cells: dict, folder: Path) -> list[Path]:
    """Accuracy against epsilon (the privacy grid): one panel per accuracy section, one line per method and mode, a
    band from the lowest to the highest seed; the rightmost point of each line is the run without privacy."""
    sections = [s for s in dict.fromkeys(c.section for c in grid.columns) if "accuracy" in s]
    panels = {section: privacy_series(grid, cells, section) for section in sections}
    panels = {section: series for section, series in panels.items() if series}
    if not panels:
        return []
    fig = band_panels(panels, f"{grid.title}\naccuracy against epsilon (delta 1e-5; the rightmost point: no privacy)",
                      "epsilon (log scale)", "final accuracy (%)", log_x=True)
    xs = sorted({x for series in panels.values() for xs, *_ in series.values() for x in xs})
    for ax in fig.axes:  # the rightmost point is the run without privacy, not an epsilon
        ax.set_xticks(xs, [f"{x:g}" for x in xs[:-1]] + ["none"])
    return save_figure(fig, folder / "privacy-accuracy-epsilon")


def virtual_time_series(grid: Grid, specs: list[RunSpec]) -> dict[str, dict[str, dict[str, tuple[list, list, list, list]]]]:
    """Accuracy against virtual time, of the columns whose setting is SYSTEM_PREFIX's (docs/system.md,
    docs/asynchronous.md): section -> row label -> column label -> (the round's (or server step's) virtual clock, mean
    over the seeds; the personal mean accuracy, mean over the seeds; its lowest; its highest), from zero-shot CLIP at
    0; the steps that did not evaluate left out."""
    curves: dict[str, dict[str, dict[str, dict[int, list[tuple[float, float]]]]]] = {}
    for spec in specs:
        if spec.column.runs is not None or not spec.column.setting.startswith(SYSTEM_PREFIX):
            continue
        path, summary = spec.run_dir / "metrics.jsonl", spec.run_dir / "summary.json"
        if not summary.is_file() or not path.is_file():
            continue
        zero = json.loads(summary.read_text()).get("zero_shot_client_mean")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        points = [(0, 0.0, zero), *((n, r.get("virtual_clock"), r.get("mean_accuracy")) for r, n in zip(rows, round_numbers(rows)))]
        row = " ".join(label for label in spec.row.labels if label != "-")
        by_round = curves.setdefault(spec.column.section, {}).setdefault(row, {}).setdefault(spec.column.label, {})
        for number, clock, accuracy in points:
            if clock is not None and accuracy is not None:
                by_round.setdefault(number, []).append((clock, accuracy))
    return {section: {row: {column: (rounds := sorted(by_round),
                                     [statistics.fmean(c for c, _ in by_round[r]) for r in rounds],
                                     [statistics.fmean(a for _, a in by_round[r]) for r in rounds],
                                     [min(a for _, a in by_round[r]) for r in rounds],
                                     [max(a for _, a in by_round[r]) for r in rounds])[1:]
                            for column, by_round in columns.items()}
                      for row, columns in rows.items()}
            for section, rows in curves.items()}


def virtual_time_figure(grid: Grid, specs: list[RunSpec], folder: Path) -> list[Path]:
    """The accuracy against virtual time of the system and asynchronous grids, one figure per section of their columns
    (the asynchronous grid's: each speed spread): one panel per method, one line per column (all answer, lost uploads,
    a deadline, FedBuff, FedAsync, ...), the mean over the seeds with a band from the lowest to the highest seed's
    accuracy; the synchronous and asynchronous runs on one axis."""
    sections = virtual_time_series(grid, specs)
    several = len({c.section for c in grid.columns if c.runs is None and c.setting.startswith(SYSTEM_PREFIX)}) > 1
    files = []
    for section, panels in sections.items():
        fig = band_panels(panels, f"{grid.title}, {section}\npersonal accuracy against virtual time (0: zero-shot CLIP)",
                          "virtual seconds (mean over the seeds)", "mean accuracy over clients (%)")
        stem = "accuracy-virtual-time" + (f"-{_stem(section.split(', ')[-1])}" if several else "")
        files += save_figure(fig, folder / stem)
    return files


def divergence_series(specs: list[RunSpec]) -> dict[str, dict[str, tuple[list, list, list, list]]]:
    """Figure 2's lines from the finished runs' metrics.jsonl: prompt -> row label -> (rounds, mean drift diversity
    over the seeds, lowest, highest), for rows whose clients hold both a visual and a text prompt."""
    curves: dict[str, dict[str, dict[int, list[float]]]] = {}  # prompt -> row label -> round -> values over seeds
    for spec in specs:
        path = spec.run_dir / "metrics.jsonl"
        if not (spec.run_dir / "summary.json").is_file() or not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row, number in zip(rows, round_numbers(rows)):
            divergence = row.get("prompt_divergence") or {}
            if not {"visual", "text_ctx"} <= set(divergence):
                break
            for prompt, values in divergence.items():
                value = values.get(DIVERGENCE)
                if value is not None:
                    by_round = curves.setdefault(prompt, {}).setdefault(" ".join(spec.row.labels), {})
                    by_round.setdefault(number, []).append(value)
    return {prompt: {label: (rounds := sorted(by_round), [statistics.fmean(by_round[r]) for r in rounds],
                             [min(by_round[r]) for r in rounds], [max(by_round[r]) for r in rounds])
                     for label, by_round in rows.items()}
            for prompt, rows in curves.items()}


def figure2(grid: Grid, specs: list[RunSpec], folder: Path) -> list[Path]:
    """Figure 2 for one column: the drift diversity of the clients' prompt updates per round, one panel per prompt
    (visual, text) with a line per row whose clients hold both (FedUR and its kin); the mean over the seeds with
    a band from the lowest to the highest."""
    series = divergence_series(specs)
    if not series:
        return []
    panels = {PROMPT_LABELS.get(p, p): series[p] for p in sorted(series, key=lambda p: list(PROMPT_LABELS).index(p)
                                                                    if p in PROMPT_LABELS else len(PROMPT_LABELS))}
    column = specs[0].column
    fig = band_panels(panels, f"{grid.title}\nprompt divergence of the clients' updates, {column.label}", "round",
                      "drift diversity, sum |d_k|^2 / |sum d_k|^2\n(1/K: the clients agree; larger: their updates cancel)")
    return save_figure(fig, folder / f"figure2-{_stem(column.key)}")
