"""The generated shapes in four styles (`--dataset SyntheticDomains`): one domain per style, each domain's
images its own, the photo style today's `generate`, and the styles told apart by simple statistics."""

import hashlib

import numpy as np
import pytest

from fedur.data.datasets import DataOptions, DataUnavailableError, dataset_classes, prepare_dataset
from fedur.data.domains import SyntheticDomains
from fedur.data.synthetic import STYLES, generate

DOMAINS = ["photo", "sketch", "negative", "mosaic"]


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    "args, images, labels",  # sha256 prefixes of generate's output before it had styles
    [
        ((10, 3, 32, 5), "af87f0d1806816f3", "96c8c1fb23425f25"),
        ((4, 2, 16, (1, 0)), "87b3b2d1ad7a1a56", "180941be1558d749"),
        ((10, 2, 33, (7, 1)), "2edf0807328a2c40", "a1c493ce37b2209a"),
    ],
)
def test_photo_is_the_old_generate(args, images, labels):
    old, old_labels = generate(*args)
    photo, photo_labels = generate(*args, style="photo")
    assert (digest(old), digest(old_labels)) == (images, labels)
    assert np.array_equal(photo, old) and np.array_equal(photo_labels, old_labels)


def test_domains_names_and_counts():
    assert list(STYLES) == DOMAINS and dataset_classes()["synthetic_domains"] is SyntheticDomains
    ds = SyntheticDomains(classes=3, train_per_class=2, test_per_class=1, image_size=16).load(seed=4)
    assert ds.name == "synthetic_domains" and ds.domain_names == DOMAINS
    assert ds.classnames == ["circle", "square", "triangle"] and ds.template == "a photo of a {}."
    for split, per_class in ((ds.train, 2), (ds.test, 1)):
        n = 4 * 3 * per_class
        assert split.arrays.shape == (n, 16, 16, 3) and split.arrays.dtype == np.uint8
        assert split.domains.dtype == np.int64 and split.labels.dtype == np.int64
        assert split.domains.tolist() == [d for d in range(4) for _ in range(3 * per_class)]
        assert split.labels.tolist() == [c for _ in range(4) for c in range(3) for _ in range(per_class)]
    # prepare_dataset keeps a share of every (domain, class)
    kept = prepare_dataset(SyntheticDomains(3, 4, 1, 16), DataOptions(train_fraction=0.5), seed=0).train
    assert np.bincount(kept.domains * 3 + kept.labels).tolist() == [2] * 12


def test_a_subset_of_domains_keeps_each_domains_images():
    full = SyntheticDomains(3, 2, 1, 16).load(seed=7)
    part = SyntheticDomains(3, 2, 1, 16, domains=["mosaic", "sketch"]).load(seed=7)
    assert part.domain_names == ["mosaic", "sketch"]
    for split in ("train", "test"):
        a, b = getattr(full, split), getattr(part, split)
        for position, name in enumerate(part.domain_names):
            mine, theirs = b.domains == position, a.domains == DOMAINS.index(name)
            assert np.array_equal(b.arrays[mine], a.arrays[theirs]) and np.array_equal(b.labels[mine], a.labels[theirs])
    assert not np.array_equal(full.train.arrays, SyntheticDomains(3, 2, 1, 16).load(seed=8).train.arrays)
    assert np.array_equal(full.train.arrays, SyntheticDomains(3, 2, 1, 16).load(seed=7).train.arrays)


def test_the_styles_differ_visibly():
    seed = (3, 0, 1)
    photo, labels = generate(10, 2, 32, seed)
    sketch, sketch_labels = generate(10, 2, 32, seed, style="sketch")
    negative, _ = generate(10, 2, 32, seed, style="negative")
    mosaic, _ = generate(10, 2, 32, seed, style="mosaic")
    assert np.array_equal(labels, sketch_labels)
    # sketch: a light plain background, a thin dark outline
    grey = sketch.astype(np.float64).mean(axis=3)  # (N, 32, 32)
    assert (np.median(grey.reshape(len(grey), -1), axis=1) > 150).all()
    dark = (grey < 128).mean(axis=(1, 2))
    assert ((dark > 0.02) & (dark < 0.35)).all(), dark
    assert all(len(np.unique(image.reshape(-1, 3), axis=0)) < 40 for image in sketch), "no texture, no noise"
    # negative: the photo rendering of the same draws, inverted
    assert np.array_equal(negative, 255 - photo)
    # mosaic: constant on 4x4 blocks, the blocks' rounded means of the photo rendering
    blocks = mosaic.reshape(-1, 8, 4, 8, 4, 3)
    assert (blocks == blocks[:, :, :1, :, :1]).all()
    means = photo.reshape(-1, 8, 4, 8, 4, 3).astype(np.float64).mean(axis=(2, 4))
    assert np.abs(blocks[:, :, 0, :, 0].astype(np.float64) - means).max() <= 0.5
    assert not (photo.reshape(-1, 8, 4, 8, 4, 3) == photo.reshape(-1, 8, 4, 8, 4, 3)[:, :, :1, :, :1]).all()


def test_mosaic_of_a_side_that_four_does_not_divide():
    mosaic, _ = generate(2, 1, 10, seed=0, style="mosaic")
    assert mosaic.shape == (2, 10, 10, 3)
    assert (mosaic[:, 8:, 8:] == mosaic[:, 8:9, 8:9]).all() and (mosaic[:, :4, :4] == mosaic[:, :1, :1]).all()


def test_bad_domains_and_styles_are_refused():
    with pytest.raises(DataUnavailableError, match="has the domains photo, sketch, negative, mosaic; unknown: cartoon"):
        SyntheticDomains(domains=["photo", "cartoon"]).check()
    with pytest.raises(DataUnavailableError, match="give at least one"):
        SyntheticDomains(domains=[]).load(seed=0)
    with pytest.raises(DataUnavailableError, match="names a domain twice"):
        SyntheticDomains(domains=["sketch", "Sketch"]).check()
    with pytest.raises(DataUnavailableError, match="dataset.classes"):
        SyntheticDomains(classes=1).check()
    with pytest.raises(ValueError, match="style must be one of photo, sketch, negative, mosaic"):
        generate(2, 1, 16, seed=0, style="cartoon")


def test_it_parses_from_the_command_line():
    from fedur.app.cli import parse_config

    cfg = parse_config(["--config", "configs/tiny.yaml", "--dataset", "SyntheticDomains",
                           "--dataset.domains", "[photo, sketch]", "--dataset.train_per_class", "3"])
    assert isinstance(cfg.dataset, SyntheticDomains)
    assert cfg.dataset.domains == ["photo", "sketch"] and cfg.dataset.train_per_class == 3
    assert cfg.dataset.load(seed=0).domain_names == ["photo", "sketch"]
