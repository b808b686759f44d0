"""fedur's figures with matplotlib (Agg, no display needed): client x class heatmaps of the split and of the
selected pseudo-labels, the confusion matrix, and accuracy curves. Each function returns a Figure; `save`
writes it as a PNG and closes it, and TensorBoard takes it directly (`SummaryWriter.add_figure`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: fedur runs on clusters without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

MAX_TICKS = 50  # more labels than this on an axis are thinned to every n-th
MAX_ANNOTATED_CELLS = 400  # counts are written into the cells of matrices up to this size


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
    width = min(max(4.0, 0.32 * cols + 2.5), 20.0)
    height = min(max(2.5, 0.32 * rows + 2.0), 20.0)
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
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
) -> Figure:
    """One line with markers per name -> (xs, ys); a None y breaks the line. The legend (up to 20
    names) sits to the right of the axes."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8), layout="constrained")
    for name, (xs, ys) in series.items():
        values = [np.nan if y is None else y for y in ys]
        ax.plot(list(xs), values, marker="o", markersize=3, linewidth=1.5, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, color="0.9")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if 0 < len(series) <= 20:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def save(fig: Figure, path: Path | None) -> None:
    """Write `fig` as a PNG (unless `path` is None) and close it."""
    if path is not None:
        fig.savefig(path, dpi=100)
    plt.close(fig)
