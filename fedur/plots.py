"""fedur's figures with matplotlib (Agg, no display needed): client x class heatmaps of the split and of the
selected pseudo-labels, the confusion matrix, and accuracy curves. Each function returns a Figure; `save`
writes it as a PNG and closes it; `rendered` draws it once into pixels that a PNG and TensorBoard both take.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # before pyplot: fedur runs on clusters without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

MAX_TICKS = 50  # more labels than this on an axis are thinned to every n-th
MAX_ANNOTATED_CELLS = 400  # counts are written into the cells of matrices up to this size
CHAR_INCH = 0.065  # the width of a character of a tick label (fontsize 8), for the margins


def heatmap(
    matrix: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    normalize_rows: bool = False,
    colorbar_label: str = "images",
) -> Figure:
    """Counts (R, C) as coloured cells, rows top to bottom, coloured by value (or by value / row sum
    with `normalize_rows`, e.g. a confusion matrix of unequal classes); small matrices show the counts."""
    matrix = np.asarray(matrix, dtype=float)
    rows, cols = matrix.shape
    if normalize_rows:
        sums = matrix.sum(axis=1, keepdims=True)
        shade = np.divide(matrix, sums, out=np.zeros_like(matrix), where=sums > 0)  # (R, C) in [0, 1]
        colorbar_label = "share of the row"
    else:
        shade = matrix
    # The margins from the labels' lengths (fontsize 8: about 0.065 inch a character), not measured from the drawn
    # text: a figure draws once, where a layout engine would draw its text again to measure it.
    left = 0.25 + CHAR_INCH * max((len(label) for label in row_labels), default=1)
    bottom = 0.25 + CHAR_INCH * max((len(label) for label in col_labels), default=1)
    width = min(max(4.0, 0.32 * cols + 1.5 + left), 20.0)
    height = min(max(2.5, 0.32 * rows + 0.8 + bottom), 20.0)
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=left / width, right=1 - 1.1 / width, bottom=bottom / height, top=1 - 0.4 / height)
    image = ax.imshow(shade, cmap="viridis", aspect="auto", interpolation="nearest", vmin=0)
    fig.colorbar(image, ax=ax, label=colorbar_label, fraction=0.04, pad=0.02)
    _ticks(ax.set_yticks, row_labels, rows, rotation=0)
    _ticks(ax.set_xticks, col_labels, cols, rotation=90)
    ax.set_title(title)
    if rows * cols <= MAX_ANNOTATED_CELLS:
        top = shade.max() if shade.size else 0.0
        for r in range(rows):
            for c in range(cols):
                ink = "white" if shade[r, c] < 0.6 * top else "black"
                ax.text(c, r, f"{matrix[r, c]:g}", ha="center", va="center", color=ink, fontsize=8)
    return fig


def _ticks(set_ticks, labels: Sequence[str], count: int, rotation: int) -> None:
    step = max(1, math.ceil(count / MAX_TICKS))
    positions = list(range(0, count, step))
    set_ticks(positions, [labels[i] for i in positions], rotation=rotation, fontsize=8)


def line_plot(
    series: dict[str, tuple[Sequence[float], Sequence[float | None]]],
    title: str,
    xlabel: str,
    ylabel: str,
    integer_x: bool = True,
) -> Figure:
    """One line with markers per name -> (xs, ys); a None y breaks the line. The legend (up to 20
    names) sits to the right of the axes. `integer_x`: ticks at whole numbers only (rounds)."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8), layout="constrained")
    for name, (xs, ys) in series.items():
        values = [np.nan if y is None else y for y in ys]
        ax.plot(list(xs), values, marker="o", markersize=3, linewidth=1.5, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, color="0.9")
    if integer_x:
        ax.xaxis.get_major_locator().set_params(integer=True)
    if 0 < len(series) <= 20:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def reliability_diagram(models: dict[str, list[dict]], title: str) -> Figure:
    """The reliability diagram of each model (name -> its bins' points: fedur.evaluation.calibration.reliability, each
    {"confidence", "accuracy", "images", "low", "high"} in %): accuracy against mean confidence per bin, a marker's
    area by the bin's images, and the diagonal of perfect calibration."""
    fig, ax = plt.subplots(figsize=(6.4, 5.2), layout="constrained")
    ax.plot([0, 100], [0, 100], color="0.6", linestyle="--", linewidth=1, label="perfectly calibrated")
    for name, points in models.items():
        total = sum(p["images"] for p in points) or 1
        xs, ys = [p["confidence"] for p in points], [p["accuracy"] for p in points]
        line = ax.plot(xs, ys, linewidth=1.2, label=name)[0]
        ax.scatter(xs, ys, s=[max(8.0, 400.0 * p["images"] / total) for p in points], color=line.get_color(), alpha=0.6)
    ax.set(xlim=(0, 100), ylim=(0, 100), xlabel="confidence (%), 15 equal-width bins", ylabel="accuracy (%)", title=title)
    ax.grid(True, color="0.9")
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    return fig


Series = dict[str, tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]]


def band_plot(series: Series, title: str, xlabel: str, ylabel: str, log_x: bool = False) -> Figure:
    """One line per name -> (xs, means, lows, highs), with a shaded band from low to high (e.g. the seeds'
    spread); the legend (up to 24 names) to the right of the axes."""
    return band_panels({"": series}, title, xlabel, ylabel, log_x)


def band_panels(panels: dict[str, Series], title: str, xlabel: str, ylabel: str, log_x: bool = False) -> Figure:
    """`band_plot` with one panel per name (side by side, each with its own y scale); the legend of the last."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 + 4.0 * len(panels), 5.0), layout="constrained", squeeze=False)
    for ax, (panel, series) in zip(axes[0], panels.items()):
        for name, (xs, means, lows, highs) in series.items():
            (line,) = ax.plot(list(xs), list(means), marker="o", markersize=3, linewidth=1.5, label=name)
            if any(lo != hi for lo, hi in zip(lows, highs)):
                ax.fill_between(list(xs), list(lows), list(highs), color=line.get_color(), alpha=0.15, linewidth=0)
        xs_all = sorted({float(x) for xs, *_ in series.values() for x in xs})
        if log_x:
            ax.set_xscale("log")
            ax.set_xticks(xs_all)
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the swept values labelled
        elif xs_all and all(x.is_integer() for x in xs_all):
            ax.get_xaxis().set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if panel:
            ax.set_title(panel, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(True, color="0.9")
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    if 0 < len(list(panels.values())[-1]) <= 24:
        axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def bar_chart(
    groups: Sequence[str],
    bars: dict[str, tuple[Sequence[float | None], Sequence[float | None], Sequence[float | None]]],
    title: str,
    ylabel: str,
) -> Figure:
    """Grouped bars: for each name -> (values, errors, marks), one bar per group (None: no bar) with its error
    bar, and a black tick at its mark (e.g. the worst client's accuracy). With one group, the names label the
    bars on the x axis instead of a legend. Distinct colours up to 20 names."""
    n_bars = max(len(bars), 1)
    colors = plt.get_cmap("tab10" if n_bars <= 10 else "tab20").colors
    single = len(groups) == 1
    width = 0.8 if single else 0.8 / n_bars
    size = 0.45 * n_bars + 2.5 if single else 0.35 * len(groups) * n_bars + 3.0
    fig, ax = plt.subplots(figsize=(min(max(6.0, size), 22.0), 5.0), layout="constrained")
    for i, (name, (values, errors, marks)) in enumerate(bars.items()):
        xs = [float(i)] if single else [g + (i - (n_bars - 1) / 2) * width for g in range(len(groups))]
        present = [(x, v, e or 0.0, m) for x, v, e, m in zip(xs, values, errors, marks) if v is not None]
        if not present:
            continue
        px, pv, pe, pm = zip(*present)
        ax.bar(px, pv, width=width * 0.95, yerr=pe, capsize=2, label=name, color=colors[i % len(colors)],
               error_kw={"linewidth": 0.8})
        marked = [(x, m) for x, m in zip(px, pm) if m is not None]
        if marked:
            ax.scatter(*zip(*marked), marker="_", s=120 if not single else 400, color="black", linewidths=1.5,
                       zorder=3, label="worst client" if not any(h.get_label() == "worst client" for h in ax.collections)
                       else None)
    if single:
        ax.set_xticks(range(n_bars), list(bars), rotation=35, ha="right", fontsize=8)
        ax.set_xlabel(groups[0])
    else:
        ax.set_xticks(range(len(groups)), list(groups), rotation=20 if len(groups) > 4 else 0, fontsize=8)
    ax.set_title("\n".join(textwrap.fill(line, 80) for line in title.splitlines()), fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", color="0.9")
    ax.set_axisbelow(True)
    if single:
        ax.legend(handles=[h for h in ax.collections if h.get_label() == "worst client"], loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    elif 0 < len(bars) <= 24:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def save_figure(fig: Figure, stem: Path) -> list[Path]:
    """`fig` as stem.png and stem.pdf; closes it and returns the two paths."""
    paths = [stem.parent / f"{stem.name}.png", stem.parent / f"{stem.name}.pdf"]  # not with_suffix: join0.1
    stem.parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return paths


def save(fig: Figure, path: Path | None) -> None:
    """Write `fig` as a PNG (unless `path` is None) and close it."""
    if path is not None:
        fig.savefig(path, dpi=100)
    plt.close(fig)


def rendered(fig: Figure) -> np.ndarray:
    """(H, W, 3) uint8: the figure drawn once at its own dpi (100), for a PNG and TensorBoard alike."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def write_png(pixels: np.ndarray, path: Path) -> None:
    """(H, W, 3) uint8 pixels as a PNG file."""
    from PIL import Image

    Image.fromarray(pixels).save(path, format="PNG")


def close(fig: Figure) -> None:
    plt.close(fig)
