"""PNG figures drawn with PIL (matplotlib is not a dependency): heatmaps (client x class, confusion) and
line plots (accuracy per round). Each returns an RGB PIL image; `chw` turns one into the (3, H, W)
uint8 array TensorBoard's `add_image` takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# viridis at 5 stops: perceptually ordered, readable in grey, white text on the dark end
VIRIDIS = np.array([(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)], dtype=float)
# matplotlib's tab10: distinct line colours; series beyond 10 reuse them
TAB10 = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]
WHITE, BLACK, GRID = (255, 255, 255), (0, 0, 0), (225, 225, 225)
FONT_SIZE = 12


def font() -> ImageFont.ImageFont:
    return ImageFont.load_default(size=FONT_SIZE)  # Pillow's bundled font: no system font needed


def colormap(value: float) -> tuple[int, int, int]:
    """Viridis colour of `value` in [0, 1] (clipped), interpolated linearly between the stops."""
    x = min(max(float(value), 0.0), 1.0) * (len(VIRIDIS) - 1)
    low = min(int(x), len(VIRIDIS) - 2)
    rgb = VIRIDIS[low] + (x - low) * (VIRIDIS[low + 1] - VIRIDIS[low])
    return tuple(int(round(c)) for c in rgb)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values (steps of 1, 2 or 5 times a power of ten) covering [low, high]."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    return [round(first + i * step, 10) for i in range(int(math.ceil((high - first) / step - 1e-9)) + 1)]


def heatmap(
    matrix: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    normalize_rows: bool = False,
) -> Image.Image:
    """Counts (R, C) as coloured cells, rows top to bottom; colour by value / max (or / row max with
    `normalize_rows`, e.g. a confusion matrix of unequal classes). Counts are written into cells large
    enough to hold them; labels are thinned to every n-th when cells are small."""
    matrix = np.asarray(matrix, dtype=float)
    rows, cols = matrix.shape
    scale = matrix.max(axis=1, keepdims=True) if normalize_rows else np.full((rows, 1), matrix.max())
    shade = np.divide(matrix, scale, out=np.zeros_like(matrix), where=scale > 0)  # (R, C) in [0, 1]
    cell = int(min(40, max(2, 720 // max(rows, cols))))
    f = font()
    label_w = max(int(f.getlength(s)) for s in row_labels) + 8 if rows else 0
    label_h = max(int(f.getlength(s)) for s in col_labels) + 8 if cols else 0  # column labels are vertical
    left, top = label_w + 10, 30
    width, height = left + cols * cell + 10, top + rows * cell + label_h + 10
    image = Image.new("RGB", (max(width, int(f.getlength(title)) + 20), height), WHITE)
    draw = ImageDraw.Draw(image)
    draw.text((10, 8), title, fill=BLACK, font=f)
    annotate = cell >= 24 and all(len(f"{v:g}") * 7 < cell for v in matrix.flat)
    for r in range(rows):
        for c in range(cols):
            x, y = left + c * cell, top + r * cell
            draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=colormap(shade[r, c]))
            if annotate:
                ink = WHITE if shade[r, c] < 0.6 else BLACK
                draw.text((x + cell / 2, y + cell / 2), f"{matrix[r, c]:g}", fill=ink, font=f, anchor="mm")
    step = max(1, math.ceil((FONT_SIZE + 2) / cell))  # labels at least a line height apart
    for r in range(0, rows, step):
        draw.text((left - 4, top + r * cell + cell / 2), row_labels[r], fill=BLACK, font=f, anchor="rm")
    for c in range(0, cols, step):
        _vertical_text(image, col_labels[c], left + c * cell + cell // 2, top + rows * cell + 4, f)
    return image


def _vertical_text(image: Image.Image, text: str, center_x: int, top: int, f: ImageFont.ImageFont) -> None:
    """Paste `text` rotated 90 degrees (reading bottom to top), centred on center_x, starting at top."""
    w, h = int(f.getlength(text)) + 2, FONT_SIZE + 4
    patch = Image.new("RGB", (w, h), WHITE)
    ImageDraw.Draw(patch).text((1, h / 2), text, fill=BLACK, font=f, anchor="lm")
    patch = patch.rotate(90, expand=True)  # (h, w): text now reads upwards
    image.paste(patch, (center_x - patch.width // 2, top))


def line_plot(
    series: dict[str, tuple[Sequence[float], Sequence[float | None]]],
    title: str,
    xlabel: str,
    ylabel: str,
    size: tuple[int, int] = (760, 440),
) -> Image.Image:
    """One line per entry name -> (xs, ys); a None y breaks the line. A legend on the right lists up to
    20 names (more lines than that are drawn without one)."""
    f = font()
    points = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys) if y is not None]
    xs_all, ys_all = [p[0] for p in points] or [0.0], [p[1] for p in points] or [0.0]
    x_ticks = nice_ticks(min(xs_all), max(xs_all), 6)
    y_ticks = nice_ticks(min(ys_all), max(ys_all), 6)
    legend = list(series)[:20] if len(series) <= 20 else []
    legend_w = max(int(f.getlength(name)) for name in legend) + 55 if legend else 0
    width, height = size[0] + legend_w, size[1]
    left, right, top, bottom = 60, width - legend_w - 10, 48, height - 45
    image = Image.new("RGB", (width, height), WHITE)
    draw = ImageDraw.Draw(image)

    def to_px(x: float, y: float) -> tuple[float, float]:
        fx = (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0])
        fy = (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0])
        return left + fx * (right - left), bottom - fy * (bottom - top)

    for y in y_ticks:
        _, py = to_px(x_ticks[0], y)
        draw.line([left, py, right, py], fill=GRID)
        draw.text((left - 6, py), f"{y:g}", fill=BLACK, font=f, anchor="rm")
    for x in x_ticks:
        px, _ = to_px(x, y_ticks[0])
        draw.line([px, top, px, bottom], fill=GRID)
        draw.text((px, bottom + 6), f"{x:g}", fill=BLACK, font=f, anchor="mt")
    draw.rectangle([left, top, right, bottom], outline=BLACK)
    draw.text((10, 8), title, fill=BLACK, font=f)
    draw.text(((left + right) / 2, height - 8), xlabel, fill=BLACK, font=f, anchor="mb")
    draw.text((10, top - 18), ylabel, fill=BLACK, font=f)
    for i, (xs, ys) in enumerate(series.values()):
        colour = TAB10[i % len(TAB10)]
        segment: list[tuple[float, float]] = []
        for x, y in [*zip(xs, ys), (None, None)]:  # the sentinel flushes the last segment
            if y is not None:
                segment.append(to_px(x, y))
                continue
            if len(segment) > 1:
                draw.line(segment, fill=colour, width=2)
            for px, py in segment:
                draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
            segment = []
    for i, name in enumerate(legend):
        y = top + 8 + i * (FONT_SIZE + 6)
        draw.line([right + 15, y, right + 35, y], fill=TAB10[i % len(TAB10)], width=3)
        draw.text((right + 40, y), name, fill=BLACK, font=f, anchor="lm")
    return image


def chw(image: Image.Image) -> np.ndarray:
    """(3, H, W) uint8: the layout TensorBoard's add_image expects by default."""
    return np.asarray(image.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1).copy()
