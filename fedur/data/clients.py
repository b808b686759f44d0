"""Real federated data: every client's own folder of unlabelled train images (dataset ClientFolders).

    root/clients/<client>/train/<image>            the client's train images, no class folders, no labels
    root/clients/<client>/test/<class>/<image>     optional: the client's labelled test images (accuracy)
    root/clients/<client>/test/<image>             optional: the client's unlabelled test images (predictions)
    root/test/<class>/<image>                      optional: one labelled test set every client is tested on

Client ids follow the sorted folder names (Python's string order: name clients site_01, site_02, ... to keep
them in the order you mean); the number of clients is the number of folders. The class names come from
`data.classnames_file` (one per line, in label order); a test class folder is the class name, with '_'
read as a space. Run it with `federation.partition: clients`: nothing is drawn, each client trains on its
own images. docs/own-data.md shows a tree and what a run reports without labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from fedur.data.datasets import DEFAULT_TEMPLATE, Dataset
from fedur.data.images import (
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    entries,
    found,
    image_files,
    is_folder,
    subfolders,
)

CLIENTS = "clients"


class ClientFolders(Dataset):
    """Clients' own image folders: root/clients/<client>/train/* without labels; test images per client in
    class folders (root/clients/<client>/test/<class>/*), unlabelled (root/clients/<client>/test/*), shared
    (root/test/<class>/*), or none. Needs data.classnames_file and federation.partition=clients.

    Args:
        root: Dataset directory holding clients/<client>/train/ (and the optional test folders).
    """

    key = "clientfolders"
    needs_classnames: ClassVar[bool] = True  # prepare_dataset passes the names of data.classnames_file to load

    def __init__(self, root: str | None = None):
        self._set_root(root)

    def client_names(self) -> list[str]:
        """The clients' folder names in client-id order (sorted). A client folder that is a symlink leading
        nowhere, or whose name is not UTF-8, is refused (`subfolders`): a run would otherwise train without it."""
        folder = self._require_root() / CLIENTS
        if not is_folder(folder, "folder"):
            raise DataUnavailableError(f"dataset.root={self.root}: expected a folder {folder}/<client>/train/ per client; "
                                       f"{found(folder)}")
        names = [p.name for p in subfolders(folder, "client folder")]
        if not names:
            raise DataUnavailableError(f"{folder} holds no client folder; expected {folder}/<client>/train/<image>")
        return names

    def check(self) -> None:
        root = self._require_root()
        for name in self.client_names():
            train = root / CLIENTS / name / "train"
            if not is_folder(train, "train folder"):
                raise DataUnavailableError(f"client {name!r}: expected its train images in {train}/; {found(train)}")
            if not image_files(train):
                folders = sorted(p.name for p in entries(train) if p.is_dir())
                hint = (f" (it holds folders {folders[:3]}: train images sit directly in train/, without class "
                        "folders)") if folders else ""
                raise DataUnavailableError(f"client {name!r} has no train images in {train}{hint}")

    def load(self, seed: int, classnames: list[str] | None = None) -> ImageDataset:
        if classnames is None:
            raise DataUnavailableError("dataset ClientFolders needs data.classnames_file: a text file with one class "
                                       "name per line (the classes CLIP chooses among)")
        self.check()
        root, names = self._require_root(), self.client_names()
        label_of = class_labels(classnames)
        train_paths, train_clients = [], []
        for k, name in enumerate(names):
            files = image_files(root / CLIENTS / name / "train")
            train_paths += files
            train_clients += [k] * len(files)
        train = ImageSplit(None, paths=train_paths, clients=np.asarray(train_clients, dtype=np.int64))
        test = _test_split(root, names, label_of)
        return ImageDataset(self.key, list(label_of), DEFAULT_TEMPLATE, train, test, client_names=names)


def class_labels(classnames: list[str]) -> dict[str, int]:
    """Each class name (`_` read as a space, as in its test folder's name) -> its label, the file's line order."""
    label_of: dict[str, int] = {}
    for c, name in enumerate(classnames):
        key = name.replace("_", " ")
        if key in label_of:
            raise DataUnavailableError(f"data.classnames_file names class {key!r} twice (lines {label_of[key] + 1} and "
                                       f"{c + 1}, '_' read as a space); give every class once")
        label_of[key] = c
    return label_of


def _test_split(root: Path, names: list[str], label_of: dict[str, int]) -> ImageSplit:
    """The shared labelled test set (root/test/<class>/), or each client's own (labelled or not), or none."""
    own = [root / CLIENTS / name / "test" for name in names]
    with_test = [folder for folder in own if is_folder(folder, "test folder")]
    if is_folder(root / "test", "test folder"):
        if with_test:
            raise DataUnavailableError(f"{root}/test (a shared test set) and {with_test[0]} (a client's own) both exist; "
                                       "keep one of the two")
        paths, labels = _labelled(root / "test", label_of)
        return ImageSplit(labels, paths=paths)
    kinds = {folder: _kind(folder) for folder in with_test}
    if len(set(kinds.values()) - {"empty"}) > 1:
        labelled = next(f for f, kind in kinds.items() if kind == "classes")
        unlabelled = next(f for f, kind in kinds.items() if kind == "images")
        raise DataUnavailableError(f"{labelled} holds class folders but {unlabelled} holds images without them; give "
                                   "every client's test images in class folders, or none of them")
    labelled = "classes" in kinds.values()
    paths, labels, clients = [], [], []
    for k, folder in enumerate(own):
        if folder not in kinds or kinds[folder] == "empty":
            continue
        if labelled:
            files, classes = _labelled(folder, label_of)
            labels += classes.tolist()
        else:
            files = image_files(folder)
        paths += files
        clients += [k] * len(files)
    return ImageSplit(np.asarray(labels, dtype=np.int64) if labelled else None, paths=paths,
                      clients=np.asarray(clients, dtype=np.int64))


def _kind(folder: Path) -> str:
    """"classes" (class folders), "images" (images directly), or "empty"."""
    if subfolders(folder, "class folder"):
        if image_files(folder):
            raise DataUnavailableError(f"{folder} holds class folders and images beside them; put every test image "
                                       "in its class folder, or none of them")
        return "classes"
    return "images" if image_files(folder) else "empty"


def _labelled(folder: Path, label_of: dict[str, int]) -> tuple[list[str], np.ndarray]:
    """The images of `folder`/<class>/, labelled by the class-names file."""
    paths, labels = [], []
    for sub in subfolders(folder, "class folder"):
        name = sub.name.replace("_", " ")
        if name not in label_of:
            known = list(label_of)
            raise DataUnavailableError(
                f"test class folder {sub} is not a class of data.classnames_file ({', '.join(known[:5])}"
                f"{', ...' if len(known) > 5 else ''}); rename the folder or add the class to the file"
            )
        files = image_files(sub)
        paths += files
        labels += [label_of[name]] * len(files)
    return paths, np.asarray(labels, dtype=np.int64)
