"""CIFAR-10 and CIFAR-100 from their python archives (the standard 50,000 / 10,000 split)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedur.data.datasets import Dataset
from fedur.data.images import DataUnavailableError, ImageDataset, ImageSplit, found, reason
from fedur.network import reachable

CIFAR_HOST = "www.cs.toronto.edu"
CIFAR_TEMPLATE = "a photo of a {}."  # FedCoPL's data/dataset_prompts.py


class CifarArchive(NamedTuple):
    """The python version of a CIFAR archive, as torchvision.datasets.CIFAR10/100 describe it."""

    title: str
    url: str
    tgz_md5: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    names_key: str


CIFAR = {
    "cifar10": CifarArchive(
        "CIFAR-10", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
        "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "batches.meta",
        "label_names",
    ),
    "cifar100": CifarArchive(
        "CIFAR-100", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
        "cifar-100-python", ("train",), ("test",), "meta", "fine_label_names",
    ),
}


def check_cifar(name: str, root: Path, download: bool) -> None:
    archive = CIFAR[name]
    if (root / archive.folder).is_dir():
        return
    if not download or not reachable(CIFAR_HOST):
        reason = "dataset.download is false" if not download else f"{CIFAR_HOST} is unreachable (offline?)"
        raise DataUnavailableError(
            f"{archive.title} is not under dataset.root={root} and {reason}.\n"
            f"  Download {archive.url} and extract it into {root} (so that {root}/{archive.folder}/ "
            "exists),\n  or use the dataset ImageFolder with dataset.root pointing at train/<class>/ and "
            "test/<class>/ image folders."
        )


def load_cifar(name: str, root: str, download: bool) -> ImageDataset:
    """The CIFAR-10/100 python archive under root/cifar-10-batches-py or root/cifar-100-python, downloaded
    (through torchvision, md5-checked) when missing and allowed. The pickles are read here, without
    torchvision's per-file md5 check, so that small copies in the same format load too. Class names from
    the archive's meta file, '_' read as a space (CIFAR-100: 'aquarium fish')."""
    archive = CIFAR[name]
    base = Path(root) / archive.folder
    check_cifar(name, Path(root), download)
    if not base.is_dir():
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(archive.url, root, filename=Path(archive.url).name, md5=archive.tgz_md5)
    names = [str(n).replace("_", " ") for n in _unpickle(base / archive.meta_file)[archive.names_key]]
    splits = {}
    for split, files in (("train", archive.train_files), ("test", archive.test_files)):
        images, labels = [], []
        for file_name in files:
            entry = _unpickle(base / file_name)
            images.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))  # channel planes
            labels += list(entry["labels"] if "labels" in entry else entry["fine_labels"])
        arrays = np.ascontiguousarray(np.concatenate(images).transpose(0, 2, 3, 1))  # (N, 32, 32, 3)
        splits[split] = ImageSplit(np.asarray(labels, dtype=np.int64), arrays=arrays)
    return ImageDataset(name, names, CIFAR_TEMPLATE, splits["train"], splits["test"])


class _CifarArchive(Dataset):
    """CIFAR-10 or CIFAR-100 by its `key`; the public subclasses document the options."""

    def __init__(self, root: str, download: bool = True):
        self._set_root(root)
        self.download = download

    def check(self) -> None:
        check_cifar(self.key, self._require_root(), self.download)

    def load(self, seed: int) -> ImageDataset:
        return load_cifar(self.key, str(self._require_root()), self.download)


class CIFAR10(_CifarArchive):
    """CIFAR-10 (torchvision's python archive, 50,000 train / 10,000 test images, 10 classes).

    Args:
        root: Dataset directory holding cifar-10-batches-py/ (downloaded there when missing and allowed).
        download: Download the archive into root when it is missing.
    """

    key = "cifar10"

    def __init__(self, root: str, download: bool = True):
        super().__init__(root, download)


class CIFAR100(_CifarArchive):
    """CIFAR-100 (torchvision's python archive, 50,000 train / 10,000 test images, 100 fine classes).

    Args:
        root: Dataset directory holding cifar-100-python/ (downloaded there when missing and allowed).
        download: Download the archive into root when it is missing.
    """

    key = "cifar100"

    def __init__(self, root: str, download: bool = True):
        super().__init__(root, download)


def _unpickle(path: Path) -> dict:
    if not path.is_file():
        raise DataUnavailableError(f"expected the CIFAR file {path.name} at {path}; {found(path)}")
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataUnavailableError(f"{path} is not a CIFAR python pickle ({err}); download the archive again") from err
    except OSError as err:
        raise DataUnavailableError(f"cannot read {path} {reason(err)}") from err
