"""Datasets by name: class names, prompt template, and the train/test images with their labels.

Labels are held back from training: only the data split (simulation) and the monitoring of
pseudo-label accuracy read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from fedur.network import reachable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
DEFAULT_TEMPLATE = "a photo of a {}."
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SYNTHETIC_CLASSES = ["circle", "square", "triangle", "star", "cross", "ring", "arrow", "heart", "moon", "wave"]


class DataUnavailableError(RuntimeError):
    """The dataset cannot be loaded as configured; the message names the path and what was expected."""


@dataclass
class ImageSplit:
    """One split: labels (N,) and either file paths or decoded uint8 arrays (N, H, W, 3)."""

    labels: np.ndarray
    paths: list[str] | None = None
    arrays: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, index: int) -> Image.Image:
        if self.arrays is not None:
            return Image.fromarray(self.arrays[index])
        path = self.paths[index]
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except OSError as err:
            raise DataUnavailableError(f"cannot read image {path}: {err}") from err

    def subset(self, indices: np.ndarray) -> "ImageSplit":
        paths = [self.paths[i] for i in indices] if self.paths is not None else None
        arrays = self.arrays[indices] if self.arrays is not None else None
        return ImageSplit(self.labels[indices], paths, arrays)


@dataclass
class ImageDataset:
    name: str
    classnames: list[str]
    template: str
    train: ImageSplit
    test: ImageSplit

    @property
    def num_classes(self) -> int:
        return len(self.classnames)


def build_dataset(
    name: str,
    root: str | None,
    classnames_file: str | None = None,
    template: str | None = None,
    download: bool = True,
    train_fraction: float = 1.0,
    test_fraction: float = 1.0,
    seed: int = 1,
    synthetic_classes: int = 5,
    synthetic_train_per_class: int = 60,
    synthetic_test_per_class: int = 20,
    synthetic_image_size: int = 32,
) -> ImageDataset:
    if name == "imagefolder":
        dataset = load_imagefolder(_require_root(name, root), classnames_file)
    elif name == "cifar10":
        dataset = load_cifar10(_require_root(name, root), download)
    elif name == "synthetic":
        dataset = make_synthetic(
            synthetic_classes, synthetic_train_per_class, synthetic_test_per_class, synthetic_image_size, seed
        )
    else:
        raise DataUnavailableError(f"unknown data.name={name!r}; use imagefolder, cifar10 or synthetic")
    if template is not None:
        if template.count("{}") != 1:
            raise DataUnavailableError(f"data.template={template!r} must contain exactly one '{{}}'")
        dataset.template = template
    rng = np.random.RandomState(seed)
    dataset.train = dataset.train.subset(stratified_subset(dataset.train.labels, train_fraction, rng))
    dataset.test = dataset.test.subset(stratified_subset(dataset.test.labels, test_fraction, rng))
    return dataset


def check_available(name: str, root: str | None, download: bool) -> None:
    """Fail before any compute when the data cannot be had (no network, wrong path)."""
    if name == "synthetic":
        return
    root = _require_root(name, root)
    if name == "imagefolder":
        for split in ("train", "test"):
            if not (Path(root) / split).is_dir():
                raise DataUnavailableError(
                    f"data.root={root}: expected folders {root}/train/<class>/ and {root}/test/<class>/ "
                    f"with images; {root}/{split} is missing."
                )
    elif name == "cifar10" and not (Path(root) / "cifar-10-batches-py").is_dir():
        if not download or not reachable("www.cs.toronto.edu"):
            reason = "data.download is false" if not download else "www.cs.toronto.edu is unreachable (offline?)"
            raise DataUnavailableError(
                f"CIFAR-10 is not under data.root={root} and {reason}.\n"
                f"  Download {CIFAR10_URL} and extract it into {root} (so that {root}/cifar-10-batches-py/ "
                "exists),\n  or use data.name=imagefolder with data.root pointing at train/<class>/ and "
                "test/<class>/ image folders."
            )


def _require_root(name: str, root: str | None) -> str:
    if not root:
        raise DataUnavailableError(f"data.name={name} needs data.root (the dataset directory)")
    return os.path.expanduser(root)


def load_imagefolder(root: str, classnames_file: str | None = None) -> ImageDataset:
    """root/train/<class>/<image> and root/test/<class>/<image>; class index = sorted folder order."""
    check_available("imagefolder", root, download=False)
    folders = {split: sorted(p.name for p in (Path(root) / split).iterdir() if p.is_dir()) for split in ("train", "test")}
    if not folders["train"]:
        raise DataUnavailableError(f"{root}/train has no class folders; expected {root}/train/<class>/<image>")
    if folders["train"] != folders["test"]:
        only_train = sorted(set(folders["train"]) - set(folders["test"]))
        only_test = sorted(set(folders["test"]) - set(folders["train"]))
        raise DataUnavailableError(
            f"{root}: train and test must have the same class folders; only in train: {only_train[:5]}, "
            f"only in test: {only_test[:5]}"
        )
    classes = folders["train"]
    splits = {}
    for split in ("train", "test"):
        paths, labels = [], []
        for label, folder in enumerate(classes):
            files = sorted(
                str(p) for p in (Path(root) / split / folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES
            )
            if not files:
                raise DataUnavailableError(
                    f"{root}/{split}/{folder} has no images (looked for {', '.join(IMAGE_SUFFIXES)})"
                )
            paths += files
            labels += [label] * len(files)
        splits[split] = ImageSplit(np.asarray(labels, dtype=np.int64), paths=paths)
    classnames = [c.replace("_", " ") for c in classes]
    if classnames_file is not None:
        classnames = read_classnames(classnames_file, expected=len(classes), folders=classes)
    return ImageDataset("imagefolder", classnames, DEFAULT_TEMPLATE, splits["train"], splits["test"])


def read_classnames(path: str, expected: int, folders: list[str]) -> list[str]:
    if not Path(path).is_file():
        raise DataUnavailableError(f"data.classnames_file={path} does not exist")
    names = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if len(names) != expected:
        raise DataUnavailableError(
            f"data.classnames_file={path} has {len(names)} names but there are {expected} class folders "
            f"({', '.join(folders[:5])}{', ...' if expected > 5 else ''}); give one name per folder, in sorted folder order"
        )
    return [n.replace("_", " ") for n in names]


def load_cifar10(root: str, download: bool) -> ImageDataset:
    from torchvision.datasets import CIFAR10

    check_available("cifar10", root, download)
    splits = {}
    for split, train in (("train", True), ("test", False)):
        data = CIFAR10(root, train=train, download=download)
        splits[split] = ImageSplit(np.asarray(data.targets, dtype=np.int64), arrays=data.data)  # (N, 32, 32, 3)
    return ImageDataset("cifar10", list(CIFAR10_CLASSES), DEFAULT_TEMPLATE, splits["train"], splits["test"])


def make_synthetic(num_classes: int, train_per_class: int, test_per_class: int, size: int, seed: int) -> ImageDataset:
    """Images whose class shows in their colour and stripe orientation, with per-image noise."""
    if not 2 <= num_classes <= len(SYNTHETIC_CLASSES):
        raise DataUnavailableError(f"data.synthetic_classes must be in [2, {len(SYNTHETIC_CLASSES)}]")
    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    splits = {}
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        labels = np.repeat(np.arange(num_classes), per_class)
        images = np.empty((len(labels), size, size, 3), dtype=np.uint8)
        for i, c in enumerate(labels):
            hue = 2 * np.pi * c / num_classes
            colour = 0.5 + 0.35 * np.cos(hue + np.array([0.0, 2.1, 4.2]))  # (3,)
            angle = np.pi * c / num_classes + rng.normal(0, 0.15)
            stripes = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * (np.cos(angle) * xx + np.sin(angle) * yy) + rng.uniform(0, 6.3))
            pixels = colour * (0.6 + 0.4 * stripes[..., None]) + rng.normal(0, 0.08, (size, size, 3))
            images[i] = (np.clip(pixels, 0, 1) * 255).astype(np.uint8)
        splits[split] = ImageSplit(labels.astype(np.int64), arrays=images)
    names = SYNTHETIC_CLASSES[:num_classes]
    return ImageDataset("synthetic", names, DEFAULT_TEMPLATE, splits["train"], splits["test"])


def stratified_subset(labels: np.ndarray, fraction: float, rng: np.random.RandomState) -> np.ndarray:
    """Sorted indices keeping round(fraction * n_c) (at least 1) samples of every class c."""
    if not 0 < fraction <= 1:
        raise DataUnavailableError(f"data fractions must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    keep = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        keep.append(rng.choice(members, size=max(1, round(fraction * len(members))), replace=False))
    return np.sort(np.concatenate(keep))
