"""ImageNet and its four shifted test sets, in the layouts of CoOp's DATASETS.md
(https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md), read as CoOp's `datasets/imagenet*.py` read them.

Every one of them holds CoOp's `classnames.txt` ("<wnid> <class name>" per line, CLIP's cleaned names, the 1,000
classes in ImageNet's label order: CoOp's Google Drive copy; the four shifted sets carry a copy of ImageNet's). The
class folders are read in sorted order, as CoOp lists them, and each folder's class name is looked up by its wnid.

- ImageNet: root/images/train/<wnid>/ and root/images/val/<wnid>/ (the validation set sorted into class folders);
  train = images/train, test = images/val (CoOp's: "follow standard practice to perform evaluation on the val set").
- ImageNetV2 (matched frequency): root/imagenetv2-matched-frequency-format-val/<i>/ with i = 0..999, ImageNet's
  label i (CoOp's ImageNetV2.read_data).
- ImageNetSketch: root/images/<wnid>/, all 1,000 classes.
- ImageNetA, ImageNetR: root/imagenet-a/<wnid>/ and root/imagenet-r/<wnid>/, 200 of ImageNet's classes each. By
  default (`dataset.classes: subset`, CoOp's protocol) they are classified among their own 200 classes, labelled
  0..199 in sorted wnid order with ImageNet's names for those wnids; `dataset.classes: imagenet` keeps ImageNet's
  1,000 classes and labels (the 200 wnids mapped onto ImageNet's label of each, the other 800 classes without
  images).

The four shifted sets are test-only (`test_only`): nothing trains on them; a run trained on ImageNet's clients tests
its server's model on each with `fedur-cross-dataset RUN --dataset ImageNetA --dataset.root ...`
(docs/protocols.md). None of the five can be downloaded through torchvision: a missing copy stops with one line
saying what to fetch and where from.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from fedur.data.datasets import Dataset
from fedur.data.images import (
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    check_every_class,
    image_files,
    numbered_lines,
    path_split,
    require_dir,
    require_file,
    subfolders,
)

CLASSNAMES = "classnames.txt"
CLASSNAMES_LINK = "https://drive.google.com/file/d/1-61f_ol79pViBFDG_IDlUQSwoLcn2XXF/view"
TEMPLATE = "a photo of a {}."  # CoOp's trainers/zsclip.py for ImageNet and the four


def read_imagenet_classnames(path: Path) -> dict[str, str]:
    """CoOp's classnames.txt ("<wnid> <class name>" per line): {wnid: name} in the file's (label) order."""
    names: dict[str, str] = {}
    for number, line in numbered_lines(path):
        wnid, _, name = line.partition(" ")
        if not name.strip() or wnid in names:
            raise DataUnavailableError(f"{path}:{number}: expected '<wnid> <class name>' with every wnid once, found {line!r}")
        names[wnid] = name.strip()
    return names


def _folder_split(folder: Path, folders: list[str], labels: list[int]) -> ImageSplit:
    """The images of each class folder (in `folders`' order) with its label."""
    paths, targets = [], []
    for name, label in zip(folders, labels):
        files = image_files(folder / name)
        paths += files
        targets += [label] * len(files)
    return path_split(paths, targets)


def _named(folders: list[str], names: dict[str, str], where: Path) -> list[str]:
    unknown = [f for f in folders if f not in names]
    if unknown:
        raise DataUnavailableError(f"{where}: class folder(s) {', '.join(unknown[:3])} are not wnids of "
                                   f"{CLASSNAMES}; copy ImageNet's classnames.txt (CoOp's) next to the images")
    return [names[f] for f in folders]


class _ImageNetFamily(Dataset):
    """ImageNet or one of its shifted test sets; the public subclasses document the layout."""

    images: ClassVar[str]
    """The folder of class folders under the root."""
    by_hand: ClassVar[str]
    """Where the images come from (none can be downloaded through torchvision)."""

    def __init__(self, root: str):
        self._set_root(root)

    def check(self) -> None:
        root = self._require_root()
        for path in (root / self.images, root / CLASSNAMES):
            if not path.exists():
                what = "the images" if path.name != CLASSNAMES else f"CoOp's {CLASSNAMES} ({CLASSNAMES_LINK})"
                raise DataUnavailableError(
                    f"{self.label} is not under dataset.root={root}: {path} is missing, and it cannot be downloaded "
                    f"through torchvision; fetch {what} into {root} (the images from {self.by_hand}; "
                    "docs/datasets.md shows the layout)"
                )
        require_dir(root / self.images, f"{self.label}'s class folders")
        require_file(root / CLASSNAMES, f"CoOp's {CLASSNAMES}")

    def _test_only(self, names: list[str], test: ImageSplit) -> ImageDataset:
        train = ImageSplit(np.zeros(0, dtype=np.int64), paths=[])  # a test-only set: nothing to train on
        return ImageDataset(self.key, names, TEMPLATE, train, test)


class ImageNet(_ImageNetFamily):
    """ImageNet-1k (ILSVRC 2012, 1,000 classes): train = images/train, test = images/val.

    root/images/train/<wnid>/, root/images/val/<wnid>/ and root/classnames.txt (CoOp's). Labels in sorted wnid
    order, names from classnames.txt.

    Args:
        root: Dataset directory holding images/train/, images/val/ and classnames.txt.
    """

    key = "imagenet"
    images = "images"
    by_hand = "https://image-net.org (ILSVRC2012 train and val, val sorted into one folder per wnid)"

    def load(self, seed: int) -> ImageDataset:
        self.check()
        root = self._require_root()
        names = read_imagenet_classnames(root / CLASSNAMES)
        folders = {}
        for split in ("train", "val"):
            where = require_dir(root / "images" / split, f"ImageNet's {split} class folders")
            folders[split] = [f.name for f in subfolders(where, "class folder")]
        if folders["train"] != folders["val"]:
            only = sorted(set(folders["train"]) ^ set(folders["val"]))
            raise DataUnavailableError(f"{root / 'images'}: train/ and val/ must hold the same class folders; "
                                       f"{len(only)} are in one only, e.g. {only[:3]}")
        classnames = _named(folders["train"], names, root / "images" / "train")
        labels = list(range(len(classnames)))
        train = _folder_split(root / "images" / "train", folders["train"], labels)
        test = _folder_split(root / "images" / "val", folders["val"], labels)
        for split, part in (("train", train), ("val", test)):
            check_every_class(part.labels, classnames, f"{root / 'images' / split}")
        return ImageDataset(self.key, classnames, TEMPLATE, train, test)


class ImageNetV2(_ImageNetFamily):
    """ImageNetV2 matched-frequency (10,000 images, ImageNet's 1,000 classes), test-only.

    root/imagenetv2-matched-frequency-format-val/<label>/ (label 0..999) and root/classnames.txt (ImageNet's).

    Args:
        root: Dataset directory holding imagenetv2-matched-frequency-format-val/ and classnames.txt.
    """

    key = "imagenetv2"
    test_only = True
    images = "imagenetv2-matched-frequency-format-val"
    by_hand = ("https://github.com/modestyachts/ImageNetV2 "
               "(https://s3-us-west-2.amazonaws.com/imagenetv2public/imagenetv2-matched-frequency.tar.gz)")

    def load(self, seed: int) -> ImageDataset:
        self.check()
        root = self._require_root()
        classnames = list(read_imagenet_classnames(root / CLASSNAMES).values())
        folders = [str(label) for label in range(len(classnames))]
        for folder in folders:
            require_dir(root / self.images / folder, f"ImageNetV2's folder of label {folder}")
        test = _folder_split(root / self.images, folders, list(range(len(classnames))))
        check_every_class(test.labels, classnames, str(root / self.images))
        return self._test_only(classnames, test)


class ImageNetSketch(_ImageNetFamily):
    """ImageNet-Sketch (50,889 sketches of ImageNet's 1,000 classes), test-only.

    root/images/<wnid>/ and root/classnames.txt (ImageNet's).

    Args:
        root: Dataset directory holding images/ and classnames.txt.
    """

    key = "imagenet_sketch"
    test_only = True
    images = "images"
    by_hand = "https://github.com/HaohanWang/ImageNet-Sketch"

    def load(self, seed: int) -> ImageDataset:
        self.check()
        root = self._require_root()
        folders = [f.name for f in subfolders(root / self.images, "class folder")]
        classnames = _named(folders, read_imagenet_classnames(root / CLASSNAMES), root / self.images)
        test = _folder_split(root / self.images, folders, list(range(len(folders))))
        check_every_class(test.labels, classnames, str(root / self.images))
        return self._test_only(classnames, test)


class _ImageNetSubset(_ImageNetFamily):
    """ImageNet-A or -R: 200 of ImageNet's classes, classified among those 200 (CoOp's) or all 1,000."""

    def __init__(self, root: str, classes: Literal["subset", "imagenet"] = "subset"):
        """
        Args:
            root: Dataset directory holding the class folders (imagenet-a/ or imagenet-r/) and classnames.txt.
            classes: subset: classify among the set's own 200 classes, labelled 0..199 in sorted wnid order (CoOp's
                protocol); imagenet: among ImageNet's 1,000, each image labelled with its class's ImageNet label.
        """
        super().__init__(root)
        self.classes = classes

    def load(self, seed: int) -> ImageDataset:
        self.check()
        root = self._require_root()
        names = read_imagenet_classnames(root / CLASSNAMES)
        folders = [f.name for f in subfolders(root / self.images, "class folder")]  # README.txt is a file: not listed
        subset_names = _named(folders, names, root / self.images)
        if self.classes == "subset":
            test = _folder_split(root / self.images, folders, list(range(len(folders))))
            check_every_class(test.labels, subset_names, str(root / self.images))
            return self._test_only(subset_names, test)
        index = {wnid: label for label, wnid in enumerate(names)}  # ImageNet's label of each wnid
        test = _folder_split(root / self.images, folders, [index[f] for f in folders])
        return self._test_only(list(names.values()), test)


class ImageNetA(_ImageNetSubset):
    """ImageNet-A (7,500 natural adversarial images of 200 ImageNet classes), test-only.

    root/imagenet-a/<wnid>/ (200 folders) and root/classnames.txt (ImageNet's)."""

    key = "imagenet_a"
    test_only = True
    images = "imagenet-a"
    by_hand = "https://github.com/hendrycks/natural-adv-examples (https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar)"


class ImageNetR(_ImageNetSubset):
    """ImageNet-R (30,000 renditions of 200 ImageNet classes), test-only.

    root/imagenet-r/<wnid>/ (200 folders) and root/classnames.txt (ImageNet's)."""

    key = "imagenet_r"
    test_only = True
    images = "imagenet-r"
    by_hand = "https://github.com/hendrycks/imagenet-r (https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar)"
