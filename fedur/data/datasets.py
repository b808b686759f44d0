"""Datasets by name: class names, prompt template, and the train/test images with their labels.

Labels are held back from training: only the data split (simulation) and the monitoring of
pseudo-label accuracy read them. The paper's datasets live in `cifar.py`, `benchmarks.py` (DTD,
RESISC45, CUB, UCF101) and `domains.py` (DomainNet, OfficeHome); this module dispatches by name and
holds your own image folders and the generated smoke-test images.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedur.data.benchmarks import (
    check_cub,
    check_dtd,
    check_resisc45,
    check_ucf101,
    load_cub,
    load_dtd,
    load_resisc45,
    load_ucf101,
)
from fedur.data.cifar import check_cifar, load_cifar
from fedur.data import synthetic
from fedur.data.domains import check_domainnet, check_officehome, load_domainnet, load_officehome
from fedur.data.images import (  # re-exported: the rest of fedur imports the types from here
    IMAGE_SUFFIXES,
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    found,
    image_files,
    read_lines,
)

__all__ = [
    "IMAGE_SUFFIXES", "DataUnavailableError", "ImageDataset", "ImageSplit", "build_dataset", "check_available",
    "load_imagefolder", "load_cifar", "make_synthetic", "stratified_subset", "DATASETS",
]

DEFAULT_TEMPLATE = "a photo of a {}."
DATASETS = (
    "imagefolder", "cifar10", "cifar100", "dtd", "resisc45", "cub", "ucf101", "domainnet", "officehome", "synthetic",
)
MULTI_DOMAIN = ("domainnet", "officehome")


def build_dataset(
    name: str,
    root: str | None,
    classnames_file: str | None = None,
    template: str | None = None,
    download: bool = True,
    train_fraction: float = 1.0,
    test_fraction: float = 1.0,
    seed: int = 1,
    synthetic_classes: int = 10,
    synthetic_train_per_class: int = 60,
    synthetic_test_per_class: int = 20,
    synthetic_image_size: int = 32,
    *,
    domains: list[str] | None = None,
    domainnet_classes: int = 10,
    holdout_fraction: float = 0.2,
    holdout_seed: int = 0,
    ucf101_include_val: bool = False,
) -> ImageDataset:
    """Load `name` from `root`, checking its layout; then override class names / template when given, and
    keep a stratified `train_fraction` / `test_fraction` (per class, and per domain when there are domains)."""
    _check_domains_apply(name, domains)
    if name == "synthetic":
        dataset = make_synthetic(
            synthetic_classes, synthetic_train_per_class, synthetic_test_per_class, synthetic_image_size, seed
        )
    else:
        path = Path(_require_root(name, root))
        if name == "imagefolder":
            dataset = load_imagefolder(str(path))
        elif name in ("cifar10", "cifar100"):
            dataset = load_cifar(name, str(path), download)
        elif name == "dtd":
            dataset = load_dtd(path)
        elif name == "resisc45":
            dataset = load_resisc45(path)
        elif name == "cub":
            dataset = load_cub(path)
        elif name == "ucf101":
            dataset = load_ucf101(path, ucf101_include_val)
        elif name == "domainnet":
            dataset = load_domainnet(path, domains, domainnet_classes)
        elif name == "officehome":
            dataset = load_officehome(path, domains, holdout_fraction, holdout_seed)
        else:
            raise DataUnavailableError(f"unknown data.name={name!r}; use one of {', '.join(DATASETS)}")
    if classnames_file is not None:
        dataset.classnames = read_classnames(classnames_file, dataset.classnames)
    if template is not None:
        if template.count("{}") != 1:
            raise DataUnavailableError(f"data.template={template!r} must contain exactly one '{{}}'")
        dataset.template = template
    rng = np.random.RandomState(seed)
    for split in ("train", "test"):
        part: ImageSplit = getattr(dataset, split)
        strata = part.labels if part.domains is None else part.domains * dataset.num_classes + part.labels
        fraction = train_fraction if split == "train" else test_fraction
        setattr(dataset, split, part.subset(stratified_subset(strata, fraction, rng)))
    return dataset


def check_available(name: str, root: str | None, download: bool, *, domains: list[str] | None = None) -> None:
    """Fail before any compute when the data cannot be had (no network, wrong path, unknown domain). Looks
    only for the files a layout needs; `build_dataset` reads and checks their content."""
    _check_domains_apply(name, domains)
    if name == "synthetic":
        return
    if name not in DATASETS:
        raise DataUnavailableError(f"unknown data.name={name!r}; use one of {', '.join(DATASETS)}")
    path = Path(_require_root(name, root))
    if name == "imagefolder":
        for split in ("train", "test"):
            if not (path / split).is_dir():
                raise DataUnavailableError(
                    f"data.root={root}: expected folders {root}/train/<class>/ and {root}/test/<class>/ "
                    f"with images; {root}/{split} is missing ({found(path / split)})."
                )
    elif name in ("cifar10", "cifar100"):
        check_cifar(name, path, download)
    elif name == "domainnet":
        check_domainnet(path, domains)
    elif name == "officehome":
        check_officehome(path, domains)
    else:
        {"dtd": check_dtd, "resisc45": check_resisc45, "cub": check_cub, "ucf101": check_ucf101}[name](path)


def _check_domains_apply(name: str, domains: list[str] | None) -> None:
    if domains is not None and name not in MULTI_DOMAIN:
        raise DataUnavailableError(f"data.domains is for {' and '.join(MULTI_DOMAIN)}; data.name={name} has no domains")


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
            files = image_files(Path(root) / split / folder)
            if not files:
                raise DataUnavailableError(
                    f"{root}/{split}/{folder} has no images (looked for {', '.join(IMAGE_SUFFIXES)})"
                )
            paths += files
            labels += [label] * len(files)
        splits[split] = ImageSplit(np.asarray(labels, dtype=np.int64), paths=paths)
    classnames = [c.replace("_", " ") for c in classes]
    if classnames_file is not None:
        classnames = read_classnames(classnames_file, classnames)
    return ImageDataset("imagefolder", classnames, DEFAULT_TEMPLATE, splits["train"], splits["test"])


def read_classnames(path: str, current: list[str]) -> list[str]:
    """One name per line replacing `current`, in label order (sorted folder order for imagefolder)."""
    if not Path(path).is_file():
        raise DataUnavailableError(f"data.classnames_file={path} does not exist")
    names = read_lines(Path(path))
    if len(names) != len(current):
        raise DataUnavailableError(
            f"data.classnames_file={path} has {len(names)} names but there are {len(current)} classes "
            f"({', '.join(current[:5])}{', ...' if len(current) > 5 else ''}); give one name per class, in label order"
        )
    return [n.replace("_", " ") for n in names]


def make_synthetic(num_classes: int, train_per_class: int, test_per_class: int, size: int, seed: int) -> ImageDataset:
    """The first `num_classes` shapes of `fedur.data.synthetic` (circle, square, ...), drawn from `seed`: the
    train split from the stream (seed, 0), the test split from (seed, 1)."""
    if not 2 <= num_classes <= len(synthetic.CLASSNAMES):
        raise DataUnavailableError(f"data.synthetic_classes must be in [2, {len(synthetic.CLASSNAMES)}]")
    splits = {}
    for stream, (split, per_class) in enumerate((("train", train_per_class), ("test", test_per_class))):
        images, labels = synthetic.generate(num_classes, per_class, size, seed=(seed, stream))
        splits[split] = ImageSplit(labels, arrays=images)
    names = synthetic.CLASSNAMES[:num_classes]
    return ImageDataset("synthetic", names, DEFAULT_TEMPLATE, splits["train"], splits["test"])


def stratified_subset(labels: np.ndarray, fraction: float, rng: np.random.RandomState) -> np.ndarray:
    """Sorted indices keeping round(fraction * n_c) (at least 1) samples of every stratum c (a class, or a
    (domain, class) pair)."""
    if not 0 < fraction <= 1:
        raise DataUnavailableError(f"data fractions must be in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    keep = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        keep.append(rng.choice(members, size=max(1, round(fraction * len(members))), replace=False))
    return np.sort(np.concatenate(keep))
