"""Datasets as plugins: a `Dataset` subclass per dataset, with its own typed options, chosen with `--dataset`.

A subclass's `__init__` takes only its own options (jsonargparse turns them into `--dataset.<option>` and
their docstring into the help); `check()` looks for the files before any compute and `load(seed)` reads
them into an `ImageDataset` (class names, prompt template, train/test images with their labels).
`prepare_dataset` then applies the dataset-independent `data:` options (class-name file, template,
stratified fractions). The registry (`dataset_classes`) is derived from the subclasses, so a dataset of
your own is one class: subclass `Dataset`, give it a `key`, import it (jsonargparse imports a class given
by its dotted path: `--dataset my_module.MyData`).

Labels are held back from training: only the data split (simulation) and the monitoring of
pseudo-label accuracy read them; once the split is made, the rank's train split has none
(fedur/train/setup.py). Data that comes federated (clients.py: each client's own folder) has no train
labels. The paper's datasets live in `cifar.py`, `benchmarks.py` (DTD, RESISC45, CUB, UCF101) and
`domains.py` (DomainNet, OfficeHome), CoOp's suite in `coop.py` and ImageNet with its shifted test sets in
`imagenet.py`; this module holds the base class, your own image folders and the
generated smoke-test images.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from jsonargparse.typing import PositiveInt

import fedur.data.synthetic as synthetic
from fedur.data.images import (  # re-exported: the rest of fedur imports the types from here
    IMAGE_SUFFIXES,
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    found,
    image_files,
    is_folder,
    read_class_names,
    subfolders,
)
from fedur.errors import PluginError

__all__ = [
    "IMAGE_SUFFIXES",
    "DataOptions",
    "DataUnavailableError",
    "Dataset",
    "ImageDataset",
    "ImageFolder",
    "ImageSplit",
    "Synthetic",
    "dataset_classes",
    "load_imagefolder",
    "prepare_dataset",
    "stratified_subset",
]

DEFAULT_TEMPLATE = "a photo of a {}."
BUILT_IN_MODULES = (
    "fedur.data.datasets", "fedur.data.cifar", "fedur.data.benchmarks", "fedur.data.domains", "fedur.data.clients",
    "fedur.data.coop", "fedur.data.imagenet",
)


class Dataset:
    """A dataset: a short `key`, where it lives (`root`), a quick file check and the full load.

    A subclass sets `key`, takes only its own options in `__init__`, stores each under its own name (the
    `repr` shows them; a `root` option through `_set_root`) and documents them in an `Args:` section (the
    `--dataset.<option>` help). Its `load` returns an `ImageDataset` named by its `key`.
    """

    key: ClassVar[str]
    """Short lowercase name ("cifar10", "dtd", ...): `ImageDataset.name`, the reference partition's and the
    per-dataset tables' key, the image cache's key and the name in run summaries."""
    root: str | None = None
    """The dataset directory, `~` expanded (None for generated data)."""
    test_only: ClassVar[bool] = False
    """True for a test set that nothing trains on (ImageNet's shifted sets): its train split is empty, `fedur` refuses
    to train on it, and `fedur-cross-dataset` tests a finished run on it."""
    needs_classnames: ClassVar[bool] = False
    """True for data that names no classes itself (ClientFolders): `prepare_dataset` reads
    data.classnames_file and calls `load(seed, classnames=...)`."""
    # How the dataset describes itself to tables, configs and resumes (as fedur.methods.Method does):
    label: ClassVar[str] = ""
    """Its name in tables and figures ("CIFAR10", "RESISC45"); default: the class name."""
    added_settings: ClassVar[dict[str, Any]] = {}
    """Constructor arguments added after runs were made, with the value such runs ran with: they resume and stay
    in their table when the argument now has that value."""
    result_neutral: ClassVar[tuple[str, ...]] = ("root", "download")
    """Constructor arguments that do not change what a run computes (where the files are, whether a missing
    archive may be downloaded): a resume may change them freely."""
    old_keys: ClassVar[dict[str, str]] = {
        "data.name": "--dataset CLASS ({names})",
        "data.root": "--dataset.root",
    }
    """Keys of fedur before datasets were classes, and what replaces them (fedur/app/cli.py names them in its errors;
    "{names}": fedur's dataset class names)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "key", None) is None and not cls.__name__.startswith("_"):  # a dataset naming no key (a
            cls.key = cls.__name__.lower()  # private base excepted): its class name, lowercased
        if "label" not in cls.__dict__:
            cls.label = cls.__name__

    def check(self) -> None:
        """Fail before any compute when the data cannot be had (no network, wrong path, unknown domain):
        looks only for the files the layout needs; `load` reads and checks their content. Generated data
        (this default) has nothing to look for."""

    def load(self, seed: int) -> ImageDataset:
        """Read the dataset, checking its layout. `seed` is for generated data; files ignore it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement load(seed)")  # internal: the abstract hook

    def client_names(self) -> list[str] | None:
        """Data that comes already federated (each client's own folder): the clients in client-id order, found
        without loading (federation.num_clients becomes their number). None: fedur splits the data."""
        return None

    @property
    def cache_key(self) -> str:
        """The dataset's name in the image cache's file names and digests: "<key>:<absolute root as given>"
        ("<key>:" without a root). The root is taken as given, not `~`-expanded, so that caches built before
        datasets were plugins keep their keys."""
        given = getattr(self, "_given_root", self.root)
        return f"{self.key}:{os.path.abspath(given) if given else ''}"

    def _set_root(self, root: str | None) -> None:
        self._given_root = root
        self.root = os.path.expanduser(root) if root else None

    def _require_root(self) -> Path:
        if not self.root:
            raise DataUnavailableError(f"dataset {type(self).__name__} needs dataset.root (the dataset directory)")
        return Path(self.root)

    def __repr__(self) -> str:
        parameters = inspect.signature(type(self).__init__).parameters.values()
        named = [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n, None)!r}' for n in named)})"


def dataset_classes() -> dict[str, type[Dataset]]:
    """key -> class of every `Dataset` subclass imported so far (fedur's own are imported here), found
    through `__subclasses__` recursively. A subclass that does not set its own `key` is a variant of its
    parent (or an abstract base) and is not listed; two classes setting the same key are an error."""
    for module in BUILT_IN_MODULES:
        importlib.import_module(module)
    registry: dict[str, type[Dataset]] = {}
    pending = list(Dataset.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending += cls.__subclasses__()
        key = cls.__dict__.get("key")
        if key is None:
            continue
        if key in registry and registry[key] is not cls:
            raise PluginError(f"the datasets {_dotted(registry[key])} and {_dotted(cls)} both have the key {key!r}")
        registry[key] = cls
    return registry


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class DataOptions:
    """What `prepare_dataset` changes on any loaded dataset (the `data:` options of the same names)."""

    classnames_file: str | None = None
    """Text file (UTF-8, `~` expanded) with one class name per line, in label order (line 1: label 0); replaces
    the dataset's own class names."""
    template: str | None = None
    """Zero-shot prompt template with exactly one `{}`; replaces the dataset's own."""
    train_fraction: float = 1.0
    """Keep this stratified, seeded fraction of the train split."""
    test_fraction: float = 1.0
    """Keep this stratified, seeded fraction of the test split."""


def prepare_dataset(source: Dataset, options: DataOptions, seed: int) -> ImageDataset:
    """`source.load(seed)`, then the class names from `options.classnames_file` and the template when
    given, and a stratified `train_fraction` / `test_fraction` (per class, and per (domain, class) when
    there are domains) drawn from `np.random.RandomState(seed)`: train first, then test."""
    if source.needs_classnames:
        if options.classnames_file is None:
            raise DataUnavailableError(f"dataset {type(source).__name__} names no classes: give data.classnames_file, "
                                       "a text file with one class name per line")
        names_file = Path(options.classnames_file).expanduser()
        dataset = source.load(seed, classnames=read_class_names(names_file, "data.classnames_file"))
    else:
        dataset = source.load(seed)
    if dataset.name != source.key:
        raise PluginError(
            f"{type(source).__name__}.load returned a dataset named {dataset.name!r}; name it {source.key!r}, its key"
        )
    if options.classnames_file is not None and not source.needs_classnames:
        dataset.classnames = read_classnames(options.classnames_file, dataset.classnames)
    if dataset.num_classes < 2:  # any dataset, a user's too: one class is no recognition task
        shown = ", ".join(map(repr, dataset.classnames[:5]))
        raise DataUnavailableError(
            f"dataset {type(source).__name__} has {dataset.num_classes} class{'' if dataset.num_classes == 1 else 'es'}"
            f"{f' ({shown})' if shown else ''}; recognition needs at least two classes"
        )
    if options.template is not None:
        if options.template.count("{}") != 1:
            raise DataUnavailableError(f"data.template={options.template!r} must contain exactly one '{{}}'")
        dataset.template = options.template
    rng = np.random.RandomState(seed)
    for split, fraction in (("train", options.train_fraction), ("test", options.test_fraction)):
        part: ImageSplit = getattr(dataset, split)
        strata = part.labels if part.labelled else np.zeros(len(part), dtype=np.int64)
        strata = strata if part.domains is None else part.domains * dataset.num_classes + strata
        if part.clients is not None:  # every client keeps its fraction
            strata = part.clients * (int(strata.max(initial=0)) + 1) + strata
        setattr(dataset, split, part.subset(stratified_subset(strata, fraction, rng)))
    return dataset


class ImageFolder(Dataset):
    """Your own images, one folder per class.

    root/train/<class>/<image> and root/test/<class>/<image>, the same class folders in both; class index =
    sorted folder order, class name = folder name with '_' read as a space.

    Args:
        root: Dataset directory holding train/<class>/ and test/<class>/ image folders.
    """

    key = "imagefolder"

    def __init__(self, root: str | None = None):
        self._set_root(root)

    def check(self) -> None:
        check_imagefolder(self._require_root())

    def load(self, seed: int) -> ImageDataset:
        return load_imagefolder(self._require_root())


def check_imagefolder(root: Path) -> None:
    for split in ("train", "test"):
        if not is_folder(root / split, "folder"):
            there = found(root / split)  # a file where the folder should be, or what is there instead
            raise DataUnavailableError(
                f"dataset.root={root}: expected folders {root}/train/<class>/ and {root}/test/<class>/ "
                f"with images; {there if (root / split).exists() else f'{root}/{split} is missing ({there})'}."
            )


def load_imagefolder(root: str | Path) -> ImageDataset:
    """root/train/<class>/<image> and root/test/<class>/<image>; class index = sorted folder order."""
    root = Path(root)
    check_imagefolder(root)
    folders = {split: [p.name for p in subfolders(root / split, "class folder")] for split in ("train", "test")}
    if not folders["train"]:
        raise DataUnavailableError(f"{root}/train has no class folders; expected {root}/train/<class>/<image>")
    if len(folders["train"]) == 1:
        raise DataUnavailableError(f"{root}/train has one class folder ({folders['train'][0]!r}); recognition needs at "
                                   f"least two classes: add a folder per class to {root}/train/ and {root}/test/")
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
            files = image_files(root / split / folder)
            if not files:
                raise DataUnavailableError(
                    f"{root}/{split}/{folder} has no images (looked for {', '.join(IMAGE_SUFFIXES)})"
                )
            paths += files
            labels += [label] * len(files)
        splits[split] = ImageSplit(np.asarray(labels, dtype=np.int64), paths=paths)
    classnames = [c.replace("_", " ") for c in classes]
    return ImageDataset("imagefolder", classnames, DEFAULT_TEMPLATE, splits["train"], splits["test"])


class Synthetic(Dataset):
    """Small generated images for smoke runs, drawn from the seed: one shape per class.

    The first `classes` shapes of `fedur.data.synthetic` (circle, square, ...); the train split from the
    stream (seed, 0), the test split from (seed, 1).

    Args:
        classes: Number of classes (shapes), 2 to 10.
        train_per_class: Train images per class.
        test_per_class: Test images per class.
        image_size: Side of the generated images in pixels.
    """

    key = "synthetic"

    def __init__(
        self, classes: int = 10, train_per_class: PositiveInt = 60, test_per_class: PositiveInt = 20,
        image_size: PositiveInt = 32,
    ):
        # plain ints: jsonargparse's restricted int types would promote NumPy's float32 arithmetic to float64
        self.classes, self.train_per_class, self.test_per_class = int(classes), int(train_per_class), int(test_per_class)
        self.image_size = int(image_size)

    def check(self) -> None:
        if not 2 <= self.classes <= len(synthetic.CLASSNAMES):
            raise DataUnavailableError(f"dataset.classes must be in [2, {len(synthetic.CLASSNAMES)}]")

    def load(self, seed: int) -> ImageDataset:
        self.check()
        splits = {}
        for stream, (split, per_class) in enumerate((("train", self.train_per_class), ("test", self.test_per_class))):
            images, labels = synthetic.generate(self.classes, per_class, self.image_size, seed=(seed, stream))
            splits[split] = ImageSplit(labels, arrays=images)
        names = synthetic.CLASSNAMES[: self.classes]
        return ImageDataset("synthetic", names, DEFAULT_TEMPLATE, splits["train"], splits["test"])


def read_classnames(path: str, current: list[str]) -> list[str]:
    """One name per line replacing `current`, in label order (sorted folder order for imagefolder), '_' read as a
    space; the file is checked as `read_class_names` checks it, its count against `current`."""
    return [n.replace("_", " ") for n in read_class_names(Path(path).expanduser(), "data.classnames_file", current)]


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
