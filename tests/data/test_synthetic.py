"""The generated shapes: a class is its silhouette, and nothing else about an image tells the class."""

import numpy as np
import pytest

from fedur.data.synthetic import CLASSNAMES, SHAPES, generate


def test_generate_is_seeded_and_balanced():
    images, labels = generate(10, 6, 24, seed=5)
    again, _ = generate(10, 6, 24, seed=5)
    assert images.shape == (60, 24, 24, 3) and images.dtype == np.uint8
    assert labels.tolist() == [c for c in range(10) for _ in range(6)]
    assert np.array_equal(images, again)
    assert not np.array_equal(images, generate(10, 6, 24, seed=(5, 1))[0])


def test_shapes_are_distinct_silhouettes():
    v, u = np.mgrid[1:-1:96j, -1:1:96j]  # shape-local coordinates, radius 1
    masks = {name: SHAPES[name](u, v) for name in CLASSNAMES}
    for name, mask in masks.items():
        assert 0.1 < mask.mean() < 0.9, f"{name} fills part of its box"
    for i, a in enumerate(CLASSNAMES):
        for b in CLASSNAMES[:i]:
            assert (masks[a] != masks[b]).mean() > 0.08, f"{a} and {b} differ in outline"


def test_colour_and_brightness_carry_no_class():
    images, labels = generate(10, 200, 32, seed=0)
    means = np.stack([images[labels == c].reshape(-1, 3).mean(axis=0) for c in range(10)])  # (10, 3)
    assert np.abs(means - means.mean(axis=0)).max() < 12, "per-class mean colour stays near the overall mean"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_classes"):
        generate(11, 1, 32, seed=0)
    with pytest.raises(ValueError, match="size >= 8"):
        generate(2, 1, 4, seed=0)
