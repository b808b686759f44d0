"""Multi-domain datasets for feature skew: DomainNet and OfficeHome, and SyntheticDomains (the demo's shapes in
four styles, generated: feature skew and leave-one-domain-out on CPU).

Every sample carries the index of its domain (`ImageSplit.domains`, into `ImageDataset.domain_names`),
which the domain partitions read. `dataset.domains` selects and orders the domains; labels do not depend
on that choice, so a class has the same label whichever domains are loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from jsonargparse.typing import OpenUnitInterval, PositiveInt

import fedur.data.synthetic as synthetic
from fedur.data.datasets import DEFAULT_TEMPLATE, Dataset
from fedur.data.images import (
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    check_every_class,
    check_images_exist,
    image_files,
    path_split,
    read_path_label_lines,
    require_dir,
    require_file,
    subfolders,
)

DOMAIN_TEMPLATE = "a photo of a {}."  # the paper does not say; CLIP's default, as for CIFAR
DOMAINNET_DOMAINS = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
DOMAINNET_CLASSES = 345
# The 10-class subset of FedBN (med-air/FedBN, utils/data_utils.py::DomainNetDataset), also used by FedOTP.
DOMAINNET_FEDBN_CLASSES = [
    "bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill", "wine_glass", "zebra",
]
OFFICEHOME_DOMAINS = ["Art", "Clipart", "Product", "Real_World"]
OFFICEHOME_CLASSES = 65


def _key(name: str) -> str:
    return name.lower().replace(" ", "_")


def select_domains(requested: list[str] | None, available: list[str], dataset: str) -> list[str]:
    """The domains to load, in the requested order (all when None); matched ignoring case and ' ' vs '_'."""
    if requested is None:
        return list(available)
    by_key = {_key(d): d for d in available}
    unknown = [d for d in requested if _key(d) not in by_key]
    if unknown or not requested:
        raise DataUnavailableError(
            f"dataset.domains={requested}: {dataset} has the domains {', '.join(available)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "; give at least one")
        )
    chosen = [by_key[_key(d)] for d in requested]
    if len(set(chosen)) != len(chosen):
        raise DataUnavailableError(f"dataset.domains={requested} names a domain twice")
    return chosen


def check_domainnet(root: Path, domains: list[str] | None) -> None:
    for domain in select_domains(domains, DOMAINNET_DOMAINS, "domainnet"):
        for split in ("train", "test"):
            require_file(root / f"{domain}_{split}.txt", f"DomainNet's official split file {domain}_{split}.txt")
        require_dir(root / domain, f"DomainNet's {domain} images ({domain}.zip extracted)")


def load_domainnet(root: Path, domains: list[str] | None = None, num_classes: int = 10) -> ImageDataset:
    """root/<domain>_{train,test}.txt: the official "<domain>/<class>/<file> <label>" lists; the images
    under root/<domain>/<class>/<file>. `num_classes` 10 keeps FedBN's subset, 345 all classes; labels are
    re-indexed 0..C-1 in the official label order."""
    if num_classes not in (10, DOMAINNET_CLASSES):
        raise DataUnavailableError(f"dataset.classes must be 10 or 345, got {num_classes}")
    chosen = select_domains(domains, DOMAINNET_DOMAINS, "domainnet")
    check_domainnet(root, chosen)
    listed: dict[tuple[str, str], list[tuple[str, str, int]]] = {}  # (domain, split) -> (path, class, label)
    official: dict[str, int] = {}  # class folder -> official label
    for domain in chosen:
        for split in ("train", "test"):
            listfile = root / f"{domain}_{split}.txt"
            rows = []
            for path, label in read_path_label_lines(listfile, DOMAINNET_CLASSES, "DomainNet's official label set"):
                parts = path.split("/")
                if len(parts) != 3 or parts[0] != domain:
                    raise DataUnavailableError(
                        f"{listfile}: expected '{domain}/<class>/<file> <label>' lines, found {path!r}"
                    )
                if official.setdefault(parts[1], label) != label:
                    raise DataUnavailableError(
                        f"{listfile}: class {parts[1]!r} has label {label} here and {official[parts[1]]} elsewhere"
                    )
                rows.append((path, parts[1], label))
            listed[domain, split] = rows
    if num_classes == 10:
        absent = [c for c in DOMAINNET_FEDBN_CLASSES if c not in official]
        if absent:
            raise DataUnavailableError(
                f"DomainNet split files under {root} do not list the classes {', '.join(absent)} of the 10-class subset"
            )
        folders = sorted(DOMAINNET_FEDBN_CLASSES, key=official.__getitem__)
    else:
        if len(official) != DOMAINNET_CLASSES:
            raise DataUnavailableError(
                f"DomainNet split files under {root} list {len(official)} classes; dataset.classes=345 "
                "needs the complete official files"
            )
        folders = sorted(official, key=official.__getitem__)
    label_of = {folder: i for i, folder in enumerate(folders)}
    names = [folder.replace("_", " ") for folder in folders]
    splits = {}
    for split in ("train", "test"):
        paths, labels, domain_ids = [], [], []
        for d, domain in enumerate(chosen):
            kept = [(os.path.join(root, path), label_of[c]) for path, c, _ in listed[domain, split] if c in label_of]
            check_images_exist([p for p, _ in kept], str(root / f"{domain}_{split}.txt"))
            paths += [p for p, _ in kept]
            labels += [label for _, label in kept]
            domain_ids += [d] * len(kept)
        check_every_class(labels, names, f"the {split} split files of {', '.join(chosen)}")
        splits[split] = path_split(paths, labels, domain_ids)
    return ImageDataset("domainnet", names, DOMAIN_TEMPLATE, splits["train"], splits["test"], chosen)


class DomainNet(Dataset):
    """DomainNet (6 domains), with its official split files.

    root/<domain>_{train,test}.txt and the images under root/<domain>/<class>/. Every sample carries its
    domain (for feature skew: federation.partition domain or domain_dirichlet).

    Args:
        root: Dataset directory holding <domain>_train.txt, <domain>_test.txt and the extracted <domain>/ folders.
        domains: The domains to load, in this order (null: all: clipart, infograph, painting, quickdraw, real,
            sketch).
        classes: The 10-class subset of federated work (FedBN, FedOTP) or all 345.
    """

    key = "domainnet"

    def __init__(self, root: str, domains: list[str] | None = None, classes: Literal[10, 345] = 10):
        self._set_root(root)
        self.domains, self.classes = domains, classes

    def check(self) -> None:
        check_domainnet(self._require_root(), self.domains)

    def load(self, seed: int) -> ImageDataset:
        return load_domainnet(self._require_root(), self.domains, self.classes)


def _officehome_folder(root: Path, domain: str) -> Path:
    """The official archive spells 'Real World' with a space; many copies use 'Real_World'."""
    for candidate in (domain, domain.replace("_", " ")):
        if (root / candidate).is_dir():
            return root / candidate
    return require_dir(root / domain, f"OfficeHome's {domain} folder of <class>/<image> folders")


def check_officehome(root: Path, domains: list[str] | None) -> None:
    for domain in select_domains(domains, OFFICEHOME_DOMAINS, "officehome"):
        _officehome_folder(root, domain)


def load_officehome(
    root: Path, domains: list[str] | None = None, holdout_fraction: float = 0.2, holdout_seed: int = 0
) -> ImageDataset:
    """root/<domain>/<class>/<image> for the domains Art, Clipart, Product, Real_World ('Real World'
    also accepted), 65 class folders in each. Class name = folder with '_' read as a space, lower-cased;
    label = sorted folder order. There is no official split: a seeded share `holdout_fraction` of every
    (domain, class) is held out as the test split (`stratified_holdout`)."""
    if not 0 < holdout_fraction < 1:
        raise DataUnavailableError(f"dataset.holdout_fraction must be in (0, 1), got {holdout_fraction}")
    chosen = select_domains(domains, OFFICEHOME_DOMAINS, "officehome")
    folders = {d: _officehome_folder(root, d) for d in chosen}
    classes = {d: [p.name for p in subfolders(folder, "class folder")] for d, folder in folders.items()}
    reference = classes[chosen[0]]
    for domain in chosen:
        if len(classes[domain]) != OFFICEHOME_CLASSES or classes[domain] != reference:
            differ = sorted(set(classes[domain]) ^ set(reference))
            detail = f", differing from {chosen[0]} in: {', '.join(differ[:5])}" if differ else ""
            raise DataUnavailableError(
                f"expected {OFFICEHOME_CLASSES} class folders in {folders[domain]} (the same in every domain); "
                f"found {len(classes[domain])}{detail}"
            )
    paths, labels, domain_ids = [], [], []
    for d, domain in enumerate(chosen):
        for label, name in enumerate(reference):
            files = image_files(folders[domain] / name)
            if not files:
                raise DataUnavailableError(f"{folders[domain] / name} has no images; expected <image> files there")
            paths += files
            labels += [label] * len(files)
            domain_ids += [d] * len(files)
    names = [name.replace("_", " ").lower() for name in reference]
    labels_arr, domains_arr = np.asarray(labels, dtype=np.int64), np.asarray(domain_ids, dtype=np.int64)
    test = stratified_holdout(domains_arr * len(names) + labels_arr, holdout_fraction, holdout_seed)
    check_every_class(labels_arr[test], names, f"the held-out test split of {root}")
    everything = path_split(paths, labels, domain_ids)
    return ImageDataset(
        "officehome", names, DOMAIN_TEMPLATE, everything.subset(np.flatnonzero(~test)),
        everything.subset(np.flatnonzero(test)), chosen,
    )


class OfficeHome(Dataset):
    """OfficeHome (4 domains, 65 classes), with a seeded held-out test split.

    root/<domain>/<class>/<image>. There is no official test split: a seeded, stratified share of every
    (domain, class) is held out as the test split.

    Args:
        root: Dataset directory holding the Art, Clipart, Product and Real_World (or 'Real World') folders.
        domains: The domains to load, in this order (null: all: Art, Clipart, Product, Real_World).
        holdout_fraction: Seeded, stratified share of each domain and class held out as the test split.
        holdout_seed: Seed of that held-out split; fixed apart from run.seed so every run tests on the same
            images.
    """

    key = "officehome"

    def __init__(
        self, root: str, domains: list[str] | None = None, holdout_fraction: OpenUnitInterval = 0.2,
        holdout_seed: int = 0,
    ):
        self._set_root(root)
        self.domains, self.holdout_fraction, self.holdout_seed = domains, float(holdout_fraction), int(holdout_seed)

    def check(self) -> None:
        check_officehome(self._require_root(), self.domains)

    def load(self, seed: int) -> ImageDataset:
        return load_officehome(self._require_root(), self.domains, self.holdout_fraction, self.holdout_seed)


def stratified_holdout(groups: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Bool mask (N,), True = held out: in every group of n samples, round(fraction * n) of them, at least
    one and at most n - 1 (a group of one stays in train), drawn by `np.random.RandomState(seed)`, groups
    in ascending order. Depends only on the group sizes and the seed, not on the run's seed."""
    rng = np.random.RandomState(seed)
    held = np.zeros(len(groups), dtype=bool)
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        n = len(members)
        count = 0 if n == 1 else min(max(int(np.floor(fraction * n + 0.5)), 1), n - 1)
        held[rng.permutation(members)[:count]] = True
    return held


class SyntheticDomains(Dataset):
    """Generated shapes in four styles, one domain each, drawn from the seed: feature skew on CPU.

    The first `classes` shapes of `fedur.data.synthetic`, drawn as a photo (Synthetic's rendering), a sketch
    (the outline only, dark on a light plain background), a negative (the photo's colours inverted) and a
    mosaic (the photo in 4x4 pixel blocks). Every sample carries its domain (federation.partition domain or
    domain_dirichlet). A domain's train split comes from the stream (seed, 0, d), its test split from (seed,
    1, d), d its place in photo, sketch, negative, mosaic: a domain has the same images whichever domains are
    loaded.

    Args:
        classes: Number of classes (shapes), 2 to 10.
        train_per_class: Train images per class and domain.
        test_per_class: Test images per class and domain.
        image_size: Side of the generated images in pixels.
        domains: The domains to load, in this order (null: all: photo, sketch, negative, mosaic).
    """

    key = "synthetic_domains"
    DOMAINS: ClassVar[tuple[str, ...]] = synthetic.STYLES

    def __init__(
        self, classes: int = 10, train_per_class: PositiveInt = 60, test_per_class: PositiveInt = 20,
        image_size: PositiveInt = 32, domains: list[str] | None = None,
    ):
        # plain ints: jsonargparse's restricted int types would promote NumPy's float32 arithmetic to float64
        self.classes, self.train_per_class, self.test_per_class = int(classes), int(train_per_class), int(test_per_class)
        self.image_size = int(image_size)
        self.domains = None if domains is None else list(domains)

    def chosen_domains(self) -> list[str]:
        """The domains to load, in the requested order (all when `domains` is None); unknown names refused."""
        return select_domains(self.domains, list(self.DOMAINS), self.key)

    def check(self) -> None:
        if not 2 <= self.classes <= len(synthetic.CLASSNAMES):
            raise DataUnavailableError(f"dataset.classes must be in [2, {len(synthetic.CLASSNAMES)}]")
        self.chosen_domains()

    def load(self, seed: int) -> ImageDataset:
        self.check()
        chosen = self.chosen_domains()
        splits = {}
        for stream, (split, per_class) in enumerate((("train", self.train_per_class), ("test", self.test_per_class))):
            images, labels, domains = [], [], []
            for position, domain in enumerate(chosen):
                drawn, drawn_labels = synthetic.generate(
                    self.classes, per_class, self.image_size, seed=(seed, stream, self.DOMAINS.index(domain)),
                    style=domain,
                )
                images.append(drawn)
                labels.append(drawn_labels)
                domains.append(np.full(len(drawn_labels), position, dtype=np.int64))
            splits[split] = ImageSplit(np.concatenate(labels), arrays=np.concatenate(images),
                                       domains=np.concatenate(domains))
        names = synthetic.CLASSNAMES[: self.classes]
        return ImageDataset(self.key, names, DEFAULT_TEMPLATE, splits["train"], splits["test"], chosen)
