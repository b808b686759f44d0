"""A dataset of a user's own, outside fedur: images listed in a CSV file (one row per image: its path relative to
the file, its class name, and train or test), wherever they lie on disk; the class names are the file's, in the
order they first appear. A dataset of your own in one file:

    PYTHONPATH=. python fedur/main.py --config configs/smoke.yaml --dataset examples.listed_images.ListedImages \\
        --dataset.file /data/mine/images.csv

    path,class,split
    photos/0001.jpg,cat,train
    photos/0002.jpg,dog,test
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedur.data.datasets import DEFAULT_TEMPLATE, Dataset, ImageDataset, ImageSplit
from fedur.data.images import DataUnavailableError

COLUMNS = ("path", "class", "split")


class ListedImages(Dataset):
    """Images listed in a CSV file with the columns path, class and split (train or test)."""

    key = "listed_images"
    result_neutral = ("file",)  # where the list lies does not change what a run computes; its content does

    def __init__(self, file: str | None = None, template: str = DEFAULT_TEMPLATE) -> None:
        """
        Args:
            file: The CSV file; a row's path is relative to the file's folder (or absolute).
            template: The zero-shot prompt with one {} for the class name.
        """
        self.file, self.template, self.root = file, template, None

    @property
    def cache_key(self) -> str:
        """The image cache's name for these images: the list's own path (there is no dataset.root)."""
        return f"{self.key}:{Path(self.file).expanduser().resolve() if self.file else ''}"

    def check(self) -> None:
        """Before any compute: the list exists and has the columns."""
        self.rows()

    def rows(self) -> list[dict[str, str]]:
        if self.file is None:
            raise DataUnavailableError("dataset ListedImages needs --dataset.file: a CSV of path,class,split rows")
        path = Path(self.file).expanduser()
        if not path.is_file():
            raise DataUnavailableError(f"dataset.file={path} does not exist; give the CSV that lists the images")
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise DataUnavailableError(f"{path}: the columns must be {','.join(COLUMNS)}, not {reader.fieldnames}")
            rows = list(reader)
        wrong = [r["split"] for r in rows if r["split"] not in ("train", "test")]
        if wrong:
            raise DataUnavailableError(f"{path}: split must be train or test, found {wrong[0]!r}")
        return rows

    def load(self, seed: int) -> ImageDataset:
        rows, folder = self.rows(), Path(self.file).expanduser().parent
        classes = list(dict.fromkeys(r["class"] for r in rows))  # in the order they first appear

        def split(name: str) -> ImageSplit:
            mine = [r for r in rows if r["split"] == name]
            labels = np.asarray([classes.index(r["class"]) for r in mine], dtype=np.int64)
            return ImageSplit(labels, paths=[str(folder / r["path"]) for r in mine])

        return ImageDataset(self.key, classes, self.template, split("train"), split("test"))
