"""What every dataset loads into, and the checks that turn a wrong on-disk layout into one clear error.

Every error names the path it looked at, what it expected there and what it found, so that a user can
fix the layout without reading the loader. `fedur.data.datasets` re-exports the types.
"""

from __future__ import annotations

import errno
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from fedur.errors import FedurError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


class DataUnavailableError(FedurError, RuntimeError):
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
    """What is there instead of `path`: the wrong kind of entry (a folder where a file was expected, a file
    where a folder was, on the way to it too), or the entries of its nearest existing parent folder."""
    if path.is_dir():
        return f"{path} is a folder, not a file"
    if path.exists():
        return f"{path} is a file, not a folder"
    missing = []
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        if folder.exists():
            return f"{folder} is a file, not a folder"
        missing.append(folder)
        folder = folder.parent
    try:
        entries = sorted(os.listdir(folder)) if folder.is_dir() else []
    except OSError as err:
        return f"cannot list {folder} {reason(err)}"
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


def reason(err: OSError) -> str:
    """Why a file or folder could not be read, and for a permission what to check: "(Permission denied); ..."."""
    hint = "; check its permissions" if isinstance(err, PermissionError) else ""
    return f"({err.strerror or err}){hint}"


def line_of(data: bytes, offset: int) -> int:
    """The 1-based line of byte `offset` in `data`."""
    return data.count(b"\n", 0, offset) + 1


def read_text(path: Path, setting: str | None = None) -> str:
    """The content of a UTF-8 text file, a byte-order mark dropped (as Windows editors save one). A file that is
    missing, a folder, unreadable or not UTF-8 is one DataUnavailableError naming it (`setting`: the option that
    names the file, e.g. data.classnames_file) and, for bytes that are not UTF-8, the line."""
    subject = f"{setting}={path}" if setting else str(path)
    if path.is_dir():
        raise DataUnavailableError(f"{subject} is a folder; give a text file")
    if not path.exists():
        raise DataUnavailableError(f"{subject} does not exist; {found(path)}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataUnavailableError(f"cannot read {subject} {reason(err)}") from err
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataUnavailableError(f"{path}:{line_of(data, err.start)}: not UTF-8 text (byte {data[err.start]:#04x}); "
                                   "save the file as UTF-8") from err


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line stripped) of the non-empty lines of a text file: errors name the file's own lines."""
    lines = enumerate(read_text(path).splitlines(), start=1)
    return [(number, line.strip()) for number, line in lines if line.strip()]


def read_class_names(path: Path, setting: str | None = None, current: list[str] | None = None) -> list[str]:
    """A class-names file: line i names label i - 1, each name stripped (trailing spaces, CRLF line ends and a
    byte-order mark are cleaned, blank lines after the last name dropped). Refused in one line naming the file
    (and the line): no class, a blank line before the last name (dropping it would move every later class onto
    the wrong label), a class named twice ('_' read as a space), a count other than that of the `current` names
    it replaces (when given), one class (no recognition task). `setting`: the option that names the file
    (data.classnames_file), for the messages."""
    subject = f"{setting}={path}" if setting else str(path)
    names = [line.strip() for line in read_text(path, setting).splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise DataUnavailableError(f"{subject} names no class; give one class name per line, in label order")
    first: dict[str, int] = {}  # name, '_' read as a space -> its line
    for number, name in enumerate(names, start=1):
        if not name:
            raise DataUnavailableError(
                f"{path}:{number}: blank line among the class names; line i names label i-1, so every class after "
                "it would take the wrong label: remove the line, or name the class"
            )
        key = name.replace("_", " ")
        if key in first:
            raise DataUnavailableError(f"{path}:{number}: class {key!r} is named again (first at line {first[key]}, "
                                       "'_' read as a space); give every class once")
        first[key] = number
    if current is not None and len(names) != len(current):
        shown = ", ".join(current[:5]) + (", ..." if len(current) > 5 else "")
        raise DataUnavailableError(f"{subject} has {len(names)} names but there are {len(current)} classes ({shown}); "
                                   "give one name per class, in label order")
    if len(names) == 1:
        raise DataUnavailableError(f"{subject} names one class ({names[0]!r}); recognition needs at least two: list "
                                   "every class CLIP chooses among, one per line")
    return names


def read_path_label_lines(path: Path, num_classes: int, names_source: Path | str) -> list[tuple[str, int]]:
    """(image path, label) from "<path> <label>" lines; the label must be one of the `num_classes` that
    `names_source` (a class-names file, or a description) names."""
    pairs = []
    for number, line in numbered_lines(path):
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


def entries(folder: Path) -> list[Path]:
    """Everything directly in `folder` (unsorted); a folder that cannot be listed is one error naming it."""
    try:
        names = os.listdir(folder)
    except NotADirectoryError as err:
        raise DataUnavailableError(f"{folder} is a file, not a folder") from err
    except OSError as err:
        raise DataUnavailableError(f"cannot list {folder} {reason(err)}") from err
    return [folder / name for name in names]


def check_name(path: Path, what: str) -> None:
    """A name that is not UTF-8 (bytes Python holds as surrogates) is refused: fedur writes the names of folders
    and images into partition.json, predictions and plots, which are UTF-8."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        raise DataUnavailableError(
            f"{what} {str(path)!r} has a name that is not valid UTF-8 ({os.fsencode(path.name)!r}); rename it in "
            "UTF-8 (fedur writes folder and image names into partition.json, predictions and plots)"
        ) from None


def is_folder(path: Path, what: str) -> bool:
    """Whether `path` is a folder; a symlink there that leads to no folder (broken, or a loop) is refused,
    naming it, rather than taken for an absent folder."""
    if path.is_dir():
        return True
    if path.is_symlink():
        try:
            os.stat(path)
        except OSError as err:
            why = "loops back on itself" if err.errno == errno.ELOOP else "leads nowhere"
            raise DataUnavailableError(f"{what} {path} is a symlink to {os.readlink(path)!r} that {why}; point it at "
                                       "a folder or remove it") from err
    return False


def subfolders(folder: Path, what: str) -> list[Path]:
    """The folders directly in `folder`, sorted by name (`what` names one: "class folder", "client folder"). A
    symlink that leads to no folder and a name that is not UTF-8 are refused, naming them: dropping them would
    silently lose a class or a client."""
    folders = [entry for entry in entries(folder) if is_folder(entry, what)]
    for entry in folders:
        check_name(entry, what)
    return sorted(folders, key=lambda entry: entry.name)


def image_files(folder: Path) -> list[str]:
    """The image files directly in `folder`, sorted; their names must be UTF-8 (`check_name`)."""
    files = sorted(str(entry) for entry in entries(folder) if entry.suffix.lower() in IMAGE_SUFFIXES)
    for file in files:
        check_name(Path(file), "image")
    return files
