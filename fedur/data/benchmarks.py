"""The paper's single-domain benchmarks in the on-disk layouts its reference code reads.

FedCoPL (`krumpguo/FedCoPL`, `utils/prepare_data.py`, `data/dataset.py`) reads DTD and RESISC45 in the
ELEVATER layouts of the Kaggle `konszer/cpl-datasets` copy, CUB as the official CUB_200_2011 archive
and UCF101 as mid-frame images with "path label" lists. Each loader reproduces the files and the
label order the reference reads; `check_*` looks only for the files, so a wrong root fails at once.
The template is FedCoPL's (`data/dataset_prompts.py`): 'a photo of a {}', without a period.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from fedur.data.coop import DTD_COOP, check_coop, fetch_missing, read_coop_split
from fedur.data.datasets import Dataset
from fedur.data.images import (
    DataUnavailableError,
    ImageDataset,
    check_every_class,
    check_images_exist,
    numbered_lines,
    path_split,
    read_class_names,
    read_path_label_lines,
    read_text,
    require_dir,
    require_file,
)

BENCHMARK_TEMPLATE = "a photo of a {}"
UCF101_COOP_SPLIT = "split_zhou_UCF101.json"
UCF101_COOP_IMAGES = "UCF-101-midframes"


def _names(lines: list[str]) -> list[str]:
    return [line.replace("_", " ") for line in lines]


def _listed_split(
    root: Path, lists: list[str], names: list[str], names_file: Path, image_path: Callable[[str, str], str]
) -> tuple[list[str], list[int]]:
    """Images and labels of the "<path> <label>" files `lists` (e.g. train.txt + val.txt), concatenated;
    `image_path(list_stem, listed_path)` says where the reference finds each image."""
    paths, labels = [], []
    for listing in lists:
        listfile = require_file(root / listing, f"the split file {listing}")
        pairs = read_path_label_lines(listfile, len(names), names_file)
        stem = Path(listing).stem
        listed_paths = [os.path.join(root, image_path(stem, listed)) for listed, _ in pairs]  # not pathlib: 10x faster
        check_images_exist(listed_paths, str(listfile))
        paths += listed_paths
        labels += [label for _, label in pairs]
    check_every_class(labels, names, " + ".join(lists))
    return paths, labels


def check_dtd(root: Path, download: bool = False) -> None:
    if (root / DTD_COOP.split_file).is_file() or (download and not (root / "class_names.txt").exists()):
        check_coop("DTD", root, DTD_COOP, download)  # CoOp's layout: there, or to be downloaded into root
        return
    for name in ("class_names.txt", "train.txt", "val.txt", "test.txt"):
        require_file(root / name, f"DTD's {name} (ELEVATER layout; or CoOp's {DTD_COOP.split_file} + images/)")


def load_dtd(root: Path, include_val: bool = False, download: bool = False) -> ImageDataset:
    """In one of two layouts, found by their files:
    - ELEVATER's: root/class_names.txt: 47 names, line i = label i.
      root/{train,val,test}.txt: "<path> <label>" lines; a zip prefix "<x>.zip@" in <path> is dropped.
      root/{train,val,test}/<path>: the images. Train = train.txt + val.txt, test = test.txt.
    - CoOp's: root/split_zhou_DescribableTextures.json and root/images/ (fedur.data.coop); train = its "train" part
      (+ "val" with `include_val`), test = "test". Downloaded into root (torchvision) with `download`.
    The template is FedCoPL's in both (CoOp's is '{} texture.': data.template)."""
    check_dtd(root, download)
    if (root / DTD_COOP.split_file).is_file() or download and not (root / "class_names.txt").exists():
        fetch_missing(root, DTD_COOP, download)
        names, splits = read_coop_split(root / DTD_COOP.split_file, root / DTD_COOP.images, include_val)
        return ImageDataset("dtd", names, BENCHMARK_TEMPLATE, splits["train"], splits["test"])
    names_file = root / "class_names.txt"
    names = _names(read_class_names(names_file))

    def image_path(stem: str, listed: str) -> str:
        return f"{stem}/{listed.split('@')[-1]}"

    train = _listed_split(root, ["train.txt", "val.txt"], names, names_file, image_path)
    test = _listed_split(root, ["test.txt"], names, names_file, image_path)
    return ImageDataset("dtd", names, BENCHMARK_TEMPLATE, path_split(*train), path_split(*test))


class DTD(Dataset):
    """The Describable Textures Dataset (47 classes), in ELEVATER's layout or CoOp's.

    ELEVATER's: root/class_names.txt, root/{train,val,test}.txt and the images under root/{train,val,test}/;
    train = train + val, test = test. CoOp's (used when its split file is there): root/split_zhou_DescribableTextures.json
    and root/images/; train = its "train" part, test = its "test" part.

    Args:
        root: Dataset directory holding one of the two layouts.
        include_val: DTD in CoOp's layout: add its split file's "val" images to the train split.
        download: No copy in root: download DTD there in CoOp's layout (torchvision; the split file from CoOp's
            Google Drive, which needs gdown).
    """

    key = "dtd"
    added_settings = {"include_val": False}  # runs before CoOp's layout read ELEVATER's, where it changes nothing

    def __init__(self, root: str, include_val: bool = False, download: bool = False):
        self._set_root(root)
        self.include_val, self.download = include_val, download

    def check(self) -> None:
        check_dtd(self._require_root(), self.download)

    def load(self, seed: int) -> ImageDataset:
        return load_dtd(self._require_root(), self.include_val, self.download)


def check_resisc45(root: Path) -> None:
    for name in ("train.json", "val.json", "test.json"):
        require_file(root / name, f"RESISC45's {name} (ELEVATER resisc45_clip layout)")


def _read_coco(path: Path) -> dict:
    try:
        data = json.loads(read_text(path))
        if not isinstance(data.get("images"), list):
            raise TypeError("no 'images' list")  # internal: caught just below, as a DataUnavailableError
        return data
    except (ValueError, TypeError, AttributeError) as err:
        raise DataUnavailableError(
            f"{path}: expected ELEVATER's COCO-style JSON with 'images' ({{'file_name': ...}}) and 'categories' "
            f"({{'name': ...}}); {err}"
        ) from err


def load_resisc45(root: Path) -> ImageDataset:
    """root/{train,val,test}.json: COCO-style; `categories` (in train.json) give the classes in label
    order, each image's `file_name` is "[<x>.zip@]<class_folder>/<image>" and its class is the folder.
    root/<class_folder>/<image>: the images. Class name = folder with '_' read as a space.
    Train = train.json + val.json, test = test.json."""
    check_resisc45(root)
    meta = _read_coco(root / "train.json")
    names = [str(c.get("name", "")).replace("_", " ") for c in meta.get("categories", [])]
    if not names or not all(names):
        raise DataUnavailableError(f"{root / 'train.json'}: expected a 'categories' list of {{'name': ...}} entries")
    index = {name: i for i, name in enumerate(names)}

    def split(files: list[str]) -> tuple[list[str], list[int]]:
        paths, labels = [], []
        for listing in files:
            start = len(paths)
            for image in _read_coco(root / listing)["images"]:
                relative = str(image.get("file_name", "")).split("@")[-1]
                folder = relative.split("/")[0]
                name = folder.replace("_", " ")
                if "/" not in relative or name not in index:
                    raise DataUnavailableError(
                        f"{root / listing}: image {image.get('file_name')!r} is not '<class_folder>/<image>' with a "
                        f"class folder named in train.json's categories ({', '.join(names[:5])}, ...)"
                    )
                paths.append(os.path.join(root, folder, relative.split("/")[-1]))
                labels.append(index[name])
            check_images_exist(paths[start:], str(root / listing))
        check_every_class(labels, names, " + ".join(files))
        return paths, labels

    train, test = split(["train.json", "val.json"]), split(["test.json"])
    return ImageDataset("resisc45", names, BENCHMARK_TEMPLATE, path_split(*train), path_split(*test))


class RESISC45(Dataset):
    """NWPU-RESISC45 remote-sensing scenes (45 classes), in ELEVATER's resisc45_clip layout.

    root/{train,val,test}.json (COCO-style) and the images under root/<class_folder>/. Train = train + val,
    test = test.

    Args:
        root: Dataset directory holding train.json, val.json, test.json and one folder of images per class.
    """

    key = "resisc45"

    def __init__(self, root: str):
        self._set_root(root)

    def check(self) -> None:
        check_resisc45(self._require_root())

    def load(self, seed: int) -> ImageDataset:
        return load_resisc45(self._require_root())


CUB_FILES = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt")


def check_cub(root: Path) -> None:
    for name in CUB_FILES:
        require_file(root / "CUB_200_2011" / name, f"CUB's {name} (dataset.root holds CUB_200_2011/)")


def _id_table(path: Path, columns: int = 2) -> dict[str, str]:
    """'<id> <value>' lines as {id: value}."""
    table = {}
    for number, line in numbered_lines(path):
        fields = line.split(maxsplit=columns - 1)
        if len(fields) != columns:
            raise DataUnavailableError(f"{path}:{number}: expected '<id> <value>', found {line!r}")
        table[fields[0]] = fields[1]
    return table


def load_cub(root: Path) -> ImageDataset:
    """The official CUB_200_2011 archive under root: images.txt ("<id> <path>"), image_class_labels.txt
    ("<id> <class id, 1-based>"), train_test_split.txt ("<id> <1 = train>"), classes.txt ("<class id>
    <nnn.Name>"), images under CUB_200_2011/images/<path>. Class name = classes.txt entry without its
    "nnn." prefix, '_' read as a space, lower-cased (FedCoPL's rule): 'black footed albatross'."""
    check_cub(root)
    base = root / "CUB_200_2011"
    classes = _id_table(base / "classes.txt")
    if sorted(classes) != sorted(str(i) for i in range(1, len(classes) + 1)):
        raise DataUnavailableError(f"{base / 'classes.txt'}: expected class ids 1..C, found {sorted(classes)[:5]}...")
    names = [classes[str(i)].split(".", 1)[-1].replace("_", " ").lower() for i in range(1, len(classes) + 1)]
    images, labels, is_train = (_id_table(base / f) for f in CUB_FILES[:3])
    paths = {"train": [], "test": []}
    targets = {"train": [], "test": []}
    for image_id, relative in images.items():
        if image_id not in labels or image_id not in is_train:
            raise DataUnavailableError(
                f"{base / 'images.txt'}: image id {image_id} has no entry in image_class_labels.txt or "
                "train_test_split.txt; the CUB files come from different copies"
            )
        label = int(labels[image_id]) - 1
        if not 0 <= label < len(names):
            raise DataUnavailableError(
                f"{base / 'image_class_labels.txt'}: image {image_id} has class {label + 1} but classes.txt "
                f"has {len(names)} classes"
            )
        split = "train" if is_train[image_id].strip() == "1" else "test"
        paths[split].append(os.path.join(base, "images", relative))
        targets[split].append(label)
    for split in ("train", "test"):
        check_images_exist(paths[split], f"{base / 'images.txt'} ({split})")
        check_every_class(targets[split], names, f"the {split} split of train_test_split.txt")
    return ImageDataset(
        "cub", names, BENCHMARK_TEMPLATE, path_split(paths["train"], targets["train"]),
        path_split(paths["test"], targets["test"]),
    )


class CUB(Dataset):
    """Caltech-UCSD Birds-200-2011 (200 classes), from the official archive with its train/test split.

    Args:
        root: Dataset directory holding CUB_200_2011/ (images.txt, classes.txt, ..., images/).
    """

    key = "cub"

    def __init__(self, root: str):
        self._set_root(root)

    def check(self) -> None:
        check_cub(self._require_root())

    def load(self, seed: int) -> ImageDataset:
        return load_cub(self._require_root())


def check_ucf101(root: Path) -> None:
    if (root / UCF101_COOP_SPLIT).is_file():
        require_dir(root / UCF101_COOP_IMAGES, "CoOp's UCF101 mid-frame images")
        return
    for name in ("class_names.txt", "train.txt", "test.txt"):
        require_file(
            root / name, f"UCF101's {name} (FedCoPL layout; or CoOp's {UCF101_COOP_SPLIT} + {UCF101_COOP_IMAGES}/)"
        )


def load_ucf101(root: Path, include_val: bool = False) -> ImageDataset:
    """Mid-frame images in one of two layouts, found by their files:
    - FedCoPL's: root/class_names.txt (line i = label i), root/{train,test}.txt with "<path> <label>"
      lines; the image is root/{train,test}/<last two components of path> (<class folder>/<file>).
    - CoOp's: root/split_zhou_UCF101.json ({"train"|"val"|"test": [[path, label, class name], ...]})
      with the images under root/UCF-101-midframes/<path>; class names from the JSON.
    Train is CoOp's "train" only unless `include_val` (the paper does not say; FedCoPL's train.txt has no
    val part to add)."""
    check_ucf101(root)
    if not (root / UCF101_COOP_SPLIT).is_file():
        names_file = root / "class_names.txt"
        names = _names(read_class_names(names_file))

        def image_path(stem: str, listed: str) -> str:
            return f"{stem}/{'/'.join(listed.rsplit('/', 2)[-2:])}"

        train = _listed_split(root, ["train.txt"], names, names_file, image_path)
        test = _listed_split(root, ["test.txt"], names, names_file, image_path)
        return ImageDataset("ucf101", names, BENCHMARK_TEMPLATE, path_split(*train), path_split(*test))
    return _load_ucf101_coop(root, include_val)


class UCF101(Dataset):
    """UCF101 actions (101 classes) as mid-frame images, in FedCoPL's or CoOp's layout.

    FedCoPL's: class_names.txt, train.txt, test.txt and the train/ and test/ image folders. CoOp's:
    split_zhou_UCF101.json and UCF-101-midframes/.

    Args:
        root: Dataset directory holding one of the two layouts.
        include_val: UCF101 from CoOp's split_zhou_UCF101.json: add its "val" images to the train split
            (unknown in the paper).
    """

    key = "ucf101"

    def __init__(self, root: str, include_val: bool = False):
        self._set_root(root)
        self.include_val = include_val

    def check(self) -> None:
        check_ucf101(self._require_root())

    def load(self, seed: int) -> ImageDataset:
        return load_ucf101(self._require_root(), self.include_val)


def _load_ucf101_coop(root: Path, include_val: bool) -> ImageDataset:
    names, splits = read_coop_split(root / UCF101_COOP_SPLIT, root / UCF101_COOP_IMAGES, include_val)
    return ImageDataset("ucf101", names, BENCHMARK_TEMPLATE, splits["train"], splits["test"])
