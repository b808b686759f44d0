"""Generated shape images: a small recognition task with 10 classes, from a seed, in pure numpy.

A class is a shape, drawn as a filled silhouette: circle, square, triangle, star, cross, ring, heart,
arrow, moon, wave (`CLASSNAMES`, label = index). Everything else varies per image and says nothing
about the class:

- position: the centre moves up to `0.04 * size` from the image centre in x and in y (more defeats a
  ViT with 8 px patches on 32 px images: it has little translation invariance to learn it from);
- scale: the shape's outer radius is `U(0.27, 0.40) * size`;
- rotation: any angle (a rotated arrow is still an arrow);
- colours: a random foreground and background colour, one light and one dark (which is which is a
  coin flip), so the shape never vanishes but colour and brightness carry no class;
- background texture: flat, a linear gradient, stripes of random frequency and angle, or smooth
  blobs, at a random amplitude; plus Gaussian pixel noise of a random strength.

Silhouettes are rendered at 2x and averaged down, so edges are anti-aliased. Shapes are sized so
that their areas overlap across classes: no single pixel statistic gives the class away, but a
small ViT separates them well. Images and labels depend only on the arguments (one
`np.random.default_rng(seed)` draws every parameter).

`style` draws the same shapes in another look (`STYLES`, the domains of `--dataset SyntheticDomains`):

- "photo": the rendering above (the default; `generate`'s output without a style);
- "sketch": only the silhouette's outline, about `0.05 * size` wide, in a dark ink on a light plain paper
  colour: no texture, no noise;
- "negative": the photo rendering of the same draws, inverted (255 - pixel);
- "mosaic": the photo rendering of the same draws, averaged over 4x4 pixel blocks and upsampled back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

CLASSNAMES = ["circle", "square", "triangle", "star", "cross", "ring", "heart", "arrow", "moon", "wave"]

SUPERSAMPLE = 2  # fixed: _silhouettes averages 2x2 blocks
TEXTURES = ("flat", "gradient", "stripes", "blobs")
STYLES = ("photo", "sketch", "negative", "mosaic")
MOSAIC_BLOCK = 4  # pixels per side of a mosaic block


def _circle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u**2 + v**2 < 0.85**2


def _square(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(u), np.abs(v)) < 0.7


def _triangle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    # Equilateral, circumradius 1: inside the three half-planes n_k . (u, v) < 1/2.
    inside = np.ones(u.shape, dtype=bool)
    for k in range(3):
        phi = -np.pi / 2 + 2 * np.pi * k / 3
        inside &= u * np.cos(phi) + v * np.sin(phi) < 0.5
    return inside


def _star(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    radius, angle = np.hypot(u, v), np.arctan2(v, u)
    return radius < 0.38 + 0.62 * (0.5 + 0.5 * np.cos(5 * angle)) ** 2


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    au, av = np.abs(u), np.abs(v)
    return ((au < 0.27) & (av < 0.9)) | ((av < 0.27) & (au < 0.9))


def _ring(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    radius = np.hypot(u, v)
    return (radius > 0.5) & (radius < 0.9)


def _heart(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    x, y = 1.15 * u, 1.15 * v + 0.15  # the implicit curve spans about [-1.1, 1.1] x [-1, 1.2]
    x2, y2 = x * x, y * y
    t = x2 + y2 - 1
    return t * t * t < x2 * y2 * y


def _arrow(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    shaft = (np.abs(v) < 0.17) & (u > -0.9) & (u < 0.2)
    head = (u >= 0.2) & (u < 0.95) & (np.abs(v) < 0.6 * (0.95 - u) / 0.75)
    return shaft | head


def _moon(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (u**2 + v**2 < 0.9**2) & ((u - 0.45) ** 2 + v**2 > 0.72**2)


def _wave(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return (np.abs(v - 0.35 * np.sin(3.2 * u)) < 0.19) & (np.abs(u) < 0.95)


SHAPES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "circle": _circle, "square": _square, "triangle": _triangle, "star": _star, "cross": _cross,
    "ring": _ring, "heart": _heart, "arrow": _arrow, "moon": _moon, "wave": _wave,
}


def generate(
    num_classes: int, per_class: int, size: int, seed: int | Sequence[int], style: str = "photo"
) -> tuple[np.ndarray, np.ndarray]:
    """`per_class` images of each of the first `num_classes` shapes in `style` (one of `STYLES`): uint8
    (N, size, size, 3) and int64 labels (N,), N = num_classes * per_class, labels in blocks (0, 0, ..., 1, 1,
    ...). "photo" is the rendering of the module docstring; "negative" and "mosaic" transform the photo
    rendering of the same seed, "sketch" draws the same silhouettes' outlines."""
    if not 1 <= num_classes <= len(CLASSNAMES):
        # internal: Synthetic checks dataset.classes first
        raise ValueError(f"num_classes must be in [1, {len(CLASSNAMES)}], got {num_classes}")
    if per_class < 0 or size < 8:
        raise ValueError(f"need per_class >= 0 and size >= 8, got {per_class} and {size}")  # internal: the generator's own sizes
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")  # internal: the styles are fedur's
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)  # (N,)
    if style == "sketch":
        return _sketch(labels, size, rng), labels
    images = _photo(labels, size, rng)  # (N, size, size, 3) uint8
    if style == "negative":
        images = 255 - images
    elif style == "mosaic":
        images = _mosaic(images, MOSAIC_BLOCK)
    return images, labels


def _photo(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The "photo" rendering: (N, size, size, 3) uint8, every parameter drawn from `rng` in a fixed order."""
    n = len(labels)
    masks = _silhouettes(labels, size, rng)  # (N, size, size) float in [0, 1]
    light = 0.55 + 0.45 * rng.random((n, 3), dtype=np.float32)  # (N, 3)
    dark = 0.42 * rng.random((n, 3), dtype=np.float32)  # (N, 3)
    fg_light = rng.random(n) < 0.5  # (N,)
    fg = np.where(fg_light[:, None], light, dark)  # (N, 3)
    bg = np.where(fg_light[:, None], dark, light)  # (N, 3)
    texture = _textures(n, size, rng)  # (N, size, size)
    background = bg[:, None, None, :] + texture[..., None]  # (N, size, size, 3)
    pixels = masks[..., None] * fg[:, None, None, :] + (1 - masks[..., None]) * background  # (N, size, size, 3)
    noise_std = rng.uniform(0.0, 0.08, n).astype(np.float32)  # (N,)
    pixels = pixels + noise_std[:, None, None, None] * rng.standard_normal(pixels.shape, dtype=np.float32)
    return (np.clip(pixels, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)  # (N, size, size, 3)


def _sketch(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The "sketch" rendering: each silhouette's outline (anti-aliased, about 0.05 * size wide) in a dark
    ink colour on a light plain paper colour, (N, size, size, 3) uint8."""
    n = len(labels)
    shape = _coverage(labels, size, rng)  # (N, hi, hi) bool at SUPERSAMPLE x resolution
    width = max(2, round(0.05 * size * SUPERSAMPLE))  # line width in supersampled pixels
    outline = _downsample(shape & ~_erode(shape, width))  # (N, size, size) float in [0, 1]
    ink = 0.3 * rng.random((n, 3), dtype=np.float32)  # (N, 3) dark
    paper = 0.85 + 0.15 * rng.random((n, 3), dtype=np.float32)  # (N, 3) light
    pixels = outline[..., None] * ink[:, None, None, :] + (1 - outline[..., None]) * paper[:, None, None, :]
    return (np.clip(pixels, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)  # (N, size, size, 3)


def _erode(mask: np.ndarray, radius: int) -> np.ndarray:
    """(N, H, W) bool eroded by a disc of `radius` pixels; outside the image counts as background."""
    h, w = mask.shape[1:]
    padded = np.pad(mask, ((0, 0), (radius, radius), (radius, radius)), constant_values=False)
    eroded = mask.copy()
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            if dy * dy + dx * dx <= radius * radius:
                eroded &= padded[:, radius + dy : radius + dy + h, radius + dx : radius + dx + w]
    return eroded


def _mosaic(images: np.ndarray, block: int) -> np.ndarray:
    """(N, H, W, 3) uint8 averaged over `block` x `block` pixel blocks (rounded; the last row and column of
    blocks are smaller when `block` does not divide the side) and upsampled back: constant on each block."""
    h, w = images.shape[1:3]
    rows, cols = np.arange(0, h, block), np.arange(0, w, block)
    sums = np.add.reduceat(np.add.reduceat(images.astype(np.float64), rows, axis=1), cols, axis=2)  # (N, h', w', 3)
    counts = np.diff(np.append(rows, h))[:, None] * np.diff(np.append(cols, w))[None, :]  # (h', w')
    means = (sums / counts[None, :, :, None] + 0.5).astype(np.uint8)
    return means[:, np.arange(h) // block][:, :, np.arange(w) // block]  # (N, H, W, 3)


def _silhouettes(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """(N, size, size) coverage of each image's shape after a random similarity transform."""
    return _downsample(_coverage(labels, size, rng))


def _downsample(coverage: np.ndarray) -> np.ndarray:
    """(N, hi, hi) -> (N, size, size) float32: the mean over each SUPERSAMPLE x SUPERSAMPLE block."""
    coverage = coverage.astype(np.float32, copy=False)
    return 0.25 * (coverage[:, 0::2, 0::2] + coverage[:, 1::2, 0::2] + coverage[:, 0::2, 1::2] + coverage[:, 1::2, 1::2])


def _coverage(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """(N, hi, hi) bool, hi = SUPERSAMPLE * size: each image's shape after a random similarity transform,
    sampled at the supersampled pixel centres."""
    n, hi = len(labels), size * SUPERSAMPLE
    centre = (size / 2 + rng.uniform(-0.04, 0.04, (n, 2)) * size).astype(np.float32)  # (N, 2) pixels, (x, y)
    radius = (rng.uniform(0.27, 0.40, n) * size).astype(np.float32)  # (N,)
    theta = rng.uniform(0, 2 * np.pi, n)  # (N,)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)  # (N,) each
    grid = (np.arange(hi, dtype=np.float32) + 0.5) / SUPERSAMPLE  # (hi,) pixel-centre coordinates
    coverage = np.empty((n, hi, hi), dtype=bool)
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        dx = (grid[None, None, :] - centre[rows, 0, None, None]) / radius[rows, None, None]  # (n_c, 1, hi)
        dy = (centre[rows, 1, None, None] - grid[None, :, None]) / radius[rows, None, None]  # (n_c, hi, 1): up
        c, s = cos[rows, None, None], sin[rows, None, None]  # (n_c, 1, 1)
        u, v = c * dx + s * dy, c * dy - s * dx  # (n_c, hi, hi) shape-local coordinates, radius 1
        coverage[rows] = SHAPES[CLASSNAMES[label]](u, v)
    return coverage


def _textures(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(N, size, size) zero-mean-ish background patterns: flat, gradient, stripes or blobs."""
    kind = rng.integers(0, len(TEXTURES), n)  # (N,)
    amplitude = rng.uniform(0.04, 0.16, n).astype(np.float32)[:, None, None]  # (N, 1, 1)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size  # (size, size) each, in [0, 1)
    angle = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]  # (N, 1, 1)
    along = np.cos(angle) * xx + np.sin(angle) * yy  # (N, size, size)
    gradient = 2 * (along - along.mean(axis=(1, 2), keepdims=True))  # (N, size, size)
    frequency = rng.uniform(2.0, 6.0, n).astype(np.float32)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    stripes = np.sin(2 * np.pi * frequency * along + phase)  # (N, size, size)
    # Smooth blobs: a 4x4 grid of random values, upsampled bilinearly to size x size.
    coarse = rng.standard_normal((n, 4, 4)).astype(np.float32)  # (N, 4, 4)
    blobs = _upsample(coarse, size)  # (N, size, size)
    patterns = np.stack([np.zeros_like(stripes), gradient, stripes, blobs])  # (4, N, size, size)
    return amplitude * patterns[kind, np.arange(n)]  # (N, size, size)


def _upsample(coarse: np.ndarray, size: int) -> np.ndarray:
    """Bilinear (N, g, g) -> (N, size, size), corners aligned."""
    g = coarse.shape[1]
    pos = np.linspace(0, g - 1, size, dtype=np.float32)  # (size,)
    lo = np.minimum(pos.astype(np.int64), g - 2)
    frac = pos - lo  # (size,)
    rows = coarse[:, lo, :] * (1 - frac)[None, :, None] + coarse[:, lo + 1, :] * frac[None, :, None]  # (N, size, g)
    return rows[:, :, lo] * (1 - frac)[None, None, :] + rows[:, :, lo + 1] * frac[None, None, :]  # (N, size, size)
