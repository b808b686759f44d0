"""Fetching a dataset into the layout its loader reads: torchvision's own download where torchvision has the
dataset, CoOp's split files from Google Drive, and otherwise one line that says what to fetch by hand and from where.

torchvision downloads a dataset into a folder of its own naming (`<root>/food-101/images`, `<root>/eurosat/2750`);
`fetch_torchvision` lets it download into a staging folder inside the dataset's root, then moves what the loader
reads to where CoOp's DATASETS.md puts it (`<root>/images`, `<root>/2750`), so that a downloaded copy and one a user
extracted by hand are the same files in the same places. The download itself (URLs, checksums, extraction) is
torchvision's, unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedur.data.images import DataUnavailableError
from fedur.network import reachable

STAGING = ".fedur-download"  # inside the dataset's root, removed once its contents are moved
DRIVE_HOST = "drive.google.com"


@dataclass(frozen=True)
class TorchvisionSource:
    """A torchvision dataset class whose `download=True` fetches the images, and where its files go.

    moves: (path under the staging folder torchvision downloads into, path under the dataset's root), in order; a
    source ending in "/*" moves every entry of that folder into the destination folder."""

    name: str
    host: str
    moves: tuple[tuple[str, str], ...]
    kwargs: dict = field(default_factory=dict)


def fetch_torchvision(root: Path, source: TorchvisionSource) -> None:
    """Download the dataset with torchvision into root/.fedur-download/, move what the loader reads into place and
    remove the staging folder. A download torchvision refuses or that fails is one DataUnavailableError."""
    import torchvision.datasets

    staging = root / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    try:
        getattr(torchvision.datasets, source.name)(str(staging), download=True, **source.kwargs)
    except (RuntimeError, ValueError, OSError) as err:
        raise DataUnavailableError(f"torchvision could not download {source.name} into {staging} "
                                   f"({type(err).__name__}: {err}); fetch it by hand (docs/datasets.md)") from err
    for src, dst in source.moves:
        target = root / dst
        if src.endswith("/*"):
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted((staging / src[:-2]).iterdir()):
                os.replace(entry, target / entry.name)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / src, target)
    shutil.rmtree(staging)


def drive_link(file_id: str) -> str:
    return f"https://drive.google.com/file/d/{file_id}/view"


def fetch_split_file(root: Path, filename: str, file_id: str) -> None:
    """CoOp's split file from Google Drive (torchvision's `download_file_from_google_drive`, which needs gdown)."""
    from torchvision.datasets.utils import download_file_from_google_drive

    try:
        download_file_from_google_drive(file_id, str(root), filename)
    except (RuntimeError, OSError) as err:
        raise DataUnavailableError(f"could not download {filename} ({type(err).__name__}: {err}); download it from "
                                   f"{drive_link(file_id)} into {root}") from err
    if not (root / filename).is_file():
        raise DataUnavailableError(f"{filename} did not arrive in {root}; download it from {drive_link(file_id)}")


def gdown_installed() -> bool:
    """torchvision downloads from Google Drive through gdown, an optional package."""
    return importlib.util.find_spec("gdown") is not None


def why_not_downloadable(download: bool, hosts: list[str]) -> str | None:
    """Why a missing part cannot be fetched now ("dataset.download is false", "<host> is unreachable (offline?)", gdown
    missing for a file on Google Drive), or None when it can."""
    if not download:
        return "dataset.download is false"
    for host in hosts:
        if not reachable(host):
            return f"{host} is unreachable (offline?)"
    if DRIVE_HOST in hosts and not gdown_installed():
        return "downloading from Google Drive needs gdown (pip install gdown)"
    return None
