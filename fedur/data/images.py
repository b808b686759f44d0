"""What every dataset loads into, and the checks that turn a wrong on-disk layout into one clear error.

Every error names the path it looked at, what it expected there and what it found, so that a user can
fix the layout without reading the loader. `fedur.data.datasets` re-exports the types.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


class DataUnavailableError(RuntimeError):
    """The dataset cannot be loaded as configured; the message names the path and what was expected."""


@dataclass
class ImageSplit:
    """One split: labels (N,) (None: the images have no labels), either file paths or decoded uint8 arrays
    (N, H, W, 3), for multi-domain datasets the domain of each sample (N,), an index into
    `ImageDataset.domain_names`, and for data that comes already federated the client holding each sample
    (N,), an index into `ImageDataset.client_names` (None: the split is fedur's to make, or a test set every
    client shares)."""

    labels: np.ndarray | None
    paths: list[str] | None = None
    arrays: np.ndarray | None = None
    domains: np.ndarray | None = None
    clients: np.ndarray | None = None

    def __len__(self) -> int:
        if self.labels is not None:
            return len(self.labels)
        return len(self.paths) if self.paths is not None else len(self.arrays)

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    def without_labels(self) -> ImageSplit:
        """The same images with no labels: what training gets once the split is made."""
        return ImageSplit(None, self.paths, self.arrays, self.domains, self.clients)

    def load(self, index: int) -> Image.Image:
        if self.arrays is not None:
            return Image.fromarray(self.arrays[index])
        path = self.paths[index]
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except OSError as err:
            raise DataUnavailableError(f"cannot read image {path}: {err}") from err

    def subset(self, indices: np.ndarray) -> ImageSplit:
        paths = [self.paths[i] for i in indices] if self.paths is not None else None
        arrays = self.arrays[indices] if self.arrays is not None else None
        domains = self.domains[indices] if self.domains is not None else None
        clients = self.clients[indices] if self.clients is not None else None
        labels = self.labels[indices] if self.labels is not None else None
        return ImageSplit(labels, paths, arrays, domains, clients)


@dataclass
class ImageDataset:
    name: str
    classnames: list[str]
    template: str
    train: ImageSplit
    test: ImageSplit
    domain_names: list[str] | None = None
    """Multi-domain datasets: the loaded domains, in `dataset.domains` order; `split.domains` indexes it."""
    client_names: list[str] | None = None
    """Data that comes already federated: the clients' names, in client-id order; `split.clients` indexes it."""

    @property
    def num_classes(self) -> int:
        return len(self.classnames)


def path_split(paths: list[str], labels: list[int], domains: list[int] | None = None) -> ImageSplit:
    """An ImageSplit over image files, with int64 labels (N,) and domains (N,)."""
    domain_array = None if domains is None else np.asarray(domains, dtype=np.int64)
    return ImageSplit(np.asarray(labels, dtype=np.int64), paths=list(paths), domains=domain_array)


def found(path: Path, limit: int = 8) -> str:
    """What is there instead of `path`: the entries of its nearest existing parent folder."""
    missing = []
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    entries = sorted(os.listdir(folder)) if folder.is_dir() else []
    shown = ", ".join(entries[:limit]) + (f", ... ({len(entries)} entries)" if len(entries) > limit else "")
    prefix = f"{missing[-1]} does not exist; " if missing else ""
    return prefix + (f"found only: {shown} (in {folder})" if entries else f"{folder} is empty")


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataUnavailableError(f"expected {what} at {path}; {found(path)}")
    return path


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DataUnavailableError(f"expected {what} at {path}/; {found(path)}")
    return path


def read_lines(path: Path) -> list[str]:
    """The non-empty lines of a text file, stripped."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_path_label_lines(path: Path, num_classes: int, names_source: Path | str) -> list[tuple[str, int]]:
    """(image path, label) from "<path> <label>" lines; the label must be one of the `num_classes` that
    `names_source` (a class-names file, or a description) names."""
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.rsplit(maxsplit=1)  # the path may hold spaces; the label is the last field
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise DataUnavailableError(f"{path}:{number}: expected '<image path> <integer label>', found {line!r}")
        label = int(fields[1])
        if not 0 <= label < num_classes:
            raise DataUnavailableError(
                f"{path}:{number}: label {label} is outside 0..{num_classes - 1}: {names_source} names "
                f"{num_classes} classes; the class names and the split file do not match"
            )
        pairs.append((fields[0], label))
    if not pairs:
        raise DataUnavailableError(f"{path} lists no images; expected '<image path> <label>' lines")
    return pairs


def check_images_exist(paths: list[str], listed_in: str) -> None:
    """Every listed image is on disk. One directory listing per folder, not one stat per image, so
    this stays fast for the 600,000 images of DomainNet."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        folder, name = os.path.split(path)
        by_folder[folder].append(name)
    missing = []
    for folder, names in by_folder.items():
        present = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        missing += [os.path.join(folder, name) for name in names if name not in present]
    if missing:
        raise DataUnavailableError(
            f"{len(missing)} of the {len(paths)} images listed in {listed_in} are missing, e.g. {missing[0]}; "
            f"{found(Path(missing[0]))}"
        )


def check_every_class(labels: list[int] | np.ndarray, classnames: list[str], where: str) -> None:
    """Every class has at least one image: a class without one is a broken download or a wrong names file."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classnames))
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        shown = ", ".join(f"{classnames[c]!r} (label {c})" for c in empty[:5])
        raise DataUnavailableError(
            f"{len(empty)} of {len(classnames)} classes have no images in {where}: {shown}"
            f"{', ...' if len(empty) > 5 else ''}"
        )


def image_files(folder: Path) -> list[str]:
    """The image files directly in `folder`, sorted."""
    return sorted(str(p) for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
