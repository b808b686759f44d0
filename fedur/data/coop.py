"""CoOp's suite (Zhou et al., "Learning to Prompt for Vision-Language Models", IJCV 2022) in the layouts its
DATASETS.md has users download (https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md), with its fixed splits.

Each dataset is read as CoOp's `datasets/<name>.py` reads it: the `split_zhou_<Name>.json` file
({"train"|"val"|"test": [[image path, label, class name], ...]}, `OxfordPets.read_split`) names every image, its
label and its class, the paths relative to the dataset's image folder; FGVCAircraft has no such file and is read
from its own `variants.txt` and `images_variant_<split>.txt`. Class names are the split file's, '_' read as a space
(CoOp's PromptLearner: `name.replace("_", " ")`): the file already holds CoOp's cleaned names (Caltech101's
"airplane" for "airplanes", EuroSAT's "Annual Crop Land", SUN397's "outdoor apartment building"). The template is
CoOp's per dataset (`trainers/zsclip.py`, CUSTOM_TEMPLATES). Train is the file's "train" part (with its "val" part
too under `dataset.include_val`), test its "test" part. FLiP (0-ml/flip, `flcore/datasets/`) reads the same files.

Where torchvision has the dataset, a missing copy is downloaded through it (`dataset.download`, on by default) and
moved into CoOp's layout; the split files come from CoOp's Google Drive links (torchvision's Drive download, which
needs gdown). StanfordCars (its site is gone) and anything offline stop with one line naming what to fetch and
where from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fedur.data.datasets import Dataset
from fedur.data.downloads import DRIVE_HOST, TorchvisionSource, drive_link, fetch_split_file, fetch_torchvision, why_not_downloadable
from fedur.data.images import (
    DataUnavailableError,
    ImageDataset,
    ImageSplit,
    check_every_class,
    check_images_exist,
    found,
    numbered_lines,
    path_split,
    read_text,
)

COOP_DATASETS_MD = "https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md"


@dataclass(frozen=True)
class CoOpLayout:
    """Where a dataset of CoOp's suite lives under its root, and where its parts come from."""

    folders: tuple[str, ...]
    """The image folders under the root (the loader checks each listed image too)."""
    split_file: str | None
    """CoOp's split_zhou_<Name>.json under the root; None: the dataset's own split lists (FGVCAircraft)."""
    split_id: str | None
    """The split file's Google Drive id (CoOp's DATASETS.md)."""
    images: str
    """The folder the split file's paths start from, under the root ("": the root itself)."""
    template: str
    """CoOp's template (trainers/zsclip.py, CUSTOM_TEMPLATES)."""
    by_hand: str
    """Where the images come from, for a copy fetched by hand."""
    source: TorchvisionSource | None = None
    """torchvision's download of the images; None: by hand only."""


def read_coop_split(split_file: Path, images: Path, include_val: bool) -> tuple[list[str], dict[str, ImageSplit]]:
    """CoOp's split JSON: the class names in label order ('_' read as a space) and the train split ("train", and
    "val" when `include_val`) and test split ("test"), their paths under `images`. Every label must name one class,
    labels must be 0..C-1, every listed image must exist, every class must have images in both splits."""
    try:
        splits = json.loads(read_text(split_file))
        items = {s: [(str(p), int(label), str(name)) for p, label, name in splits[s]] for s in ("train", "val", "test")}
    except (ValueError, KeyError, TypeError) as err:
        raise DataUnavailableError(
            f"{split_file}: expected CoOp's split JSON {{'train'|'val'|'test': [[path, label, classname], ...]}}; {err}"
        ) from err
    by_label: dict[int, str] = {}
    for _path, label, name in (entry for split in items.values() for entry in split):
        if by_label.setdefault(label, name) != name:
            raise DataUnavailableError(f"{split_file}: label {label} is named both {by_label[label]!r} and {name!r}")
    if sorted(by_label) != list(range(len(by_label))):
        raise DataUnavailableError(f"{split_file}: labels must be 0..C-1; found {sorted(by_label)[:5]}...")
    names = [by_label[c].replace("_", " ") for c in range(len(by_label))]
    result = {}
    for split, parts in (("train", ["train", "val"] if include_val else ["train"]), ("test", ["test"])):
        entries = [entry for part in parts for entry in items[part]]
        paths, labels = [os.path.join(images, p) for p, _, _ in entries], [label for _, label, _ in entries]
        where = f"{split_file} ({' + '.join(parts)})"
        check_images_exist(paths, where)
        check_every_class(labels, names, where)
        result[split] = path_split(paths, labels)
    return names, result


def missing_parts(root: Path, layout: CoOpLayout, lists: tuple[str, ...] = ()) -> list[str]:
    """The parts of the layout not under `root`: image folders, the split file, the dataset's own `lists`."""
    missing = [f"{folder}/" for folder in layout.folders if not (root / folder).is_dir()]
    files = ((layout.split_file,) if layout.split_file else ()) + lists
    return missing + [name for name in files if not (root / name).is_file()]


def check_coop(title: str, root: Path, layout: CoOpLayout, download: bool, lists: tuple[str, ...] = ()) -> None:
    """Fail before any compute when the dataset is neither complete under `root` nor to be downloaded now."""
    missing = missing_parts(root, layout, lists)
    if not missing:
        return
    images_missing = any(m.endswith("/") for m in missing) or any(m in lists for m in missing)
    split_missing = layout.split_file in missing
    hosts = ([layout.source.host] if images_missing and layout.source else []) + ([DRIVE_HOST] if split_missing else [])
    reason = "its images cannot be downloaded (torchvision does not have them)" if images_missing and not layout.source \
        else why_not_downloadable(download, hosts)
    if reason is None:
        return
    fetch = [f"the images from {layout.by_hand}"] if images_missing else []
    fetch += [f"{layout.split_file} from {drive_link(layout.split_id)}"] if split_missing else []
    raise DataUnavailableError(
        f"{title} is not complete under dataset.root={root}: {', '.join(missing)} missing ({found(root / missing[0].rstrip('/'))}), "
        f"and {reason}. Fetch {' and '.join(fetch)} into {root} as CoOp's DATASETS.md lays them out ({COOP_DATASETS_MD}; "
        "docs/datasets.md)"
    )


def fetch_missing(root: Path, layout: CoOpLayout, download: bool, lists: tuple[str, ...] = ()) -> None:
    """Download what `check_coop` found missing and downloadable (called on rank 0 first, by `load`)."""
    missing = missing_parts(root, layout, lists)
    if not missing or not download:
        return
    if layout.source is not None and (any(m.endswith("/") for m in missing) or any(m in lists for m in missing)):
        fetch_torchvision(root, layout.source)
    if layout.split_file in missing:
        fetch_split_file(root, layout.split_file, layout.split_id)


class _CoOpSuite(Dataset):
    """A dataset of CoOp's suite by its `layout`; the public subclasses document the dataset."""

    layout: ClassVar[CoOpLayout]

    def __init__(self, root: str, include_val: bool = False, download: bool = True):
        """
        Args:
            root: Dataset directory in CoOp's layout (docs/datasets.md); a missing copy is downloaded there when
                torchvision has it and dataset.download is true.
            include_val: Add the split file's "val" images to the train split (CoOp trains on "train" and picks its
                model on "val").
            download: Download what is missing into root (torchvision's download; the split file from CoOp's Google
                Drive, which needs gdown).
        """
        self._set_root(root)
        self.include_val, self.download = include_val, download

    def check(self) -> None:
        check_coop(self.label, self._require_root(), self.layout, self.download)

    def load(self, seed: int) -> ImageDataset:
        root = self._require_root()
        self.check()
        fetch_missing(root, self.layout, self.download)
        names, splits = read_coop_split(root / self.layout.split_file, root / self.layout.images, self.include_val)
        return ImageDataset(self.key, names, self.layout.template, splits["train"], splits["test"])


ROBOTS = "www.robots.ox.ac.uk"


class Caltech101(_CoOpSuite):
    """Caltech101 (100 object classes: CoOp leaves out BACKGROUND_Google and Faces_easy), CoOp's split.

    root/101_ObjectCategories/ and root/split_zhou_Caltech101.json."""

    key = "caltech101"
    layout = CoOpLayout(
        ("101_ObjectCategories",), "split_zhou_Caltech101.json", "1hyarUivQE36mY6jSomru6Fjd-JzwcCzN", "101_ObjectCategories",
        "a photo of a {}.", "https://data.caltech.edu/records/mzrjq-6wc02 (101_ObjectCategories.tar.gz)",
        TorchvisionSource("Caltech101", "data.caltech.edu", (("caltech101/101_ObjectCategories", "101_ObjectCategories"),)),
    )


class OxfordPets(_CoOpSuite):
    """The Oxford-IIIT Pets (37 breeds), CoOp's split.

    root/images/ and root/split_zhou_OxfordPets.json (the annotations/ folder is not read)."""

    key = "oxford_pets"
    layout = CoOpLayout(
        ("images",), "split_zhou_OxfordPets.json", "1501r8Ber4nNKvmlFVQZ8SeUHTcdTTEqs", "images",
        "a photo of a {}, a type of pet.", "https://www.robots.ox.ac.uk/~vgg/data/pets/ (images.tar.gz)",
        TorchvisionSource("OxfordIIITPet", ROBOTS, (("oxford-iiit-pet/images", "images"), ("oxford-iiit-pet/annotations", "annotations"))),
    )


class StanfordCars(_CoOpSuite):
    """Stanford Cars (196 models), CoOp's split; fetched by hand (its site is gone, torchvision cannot download it).

    root/cars_train/, root/cars_test/ and root/split_zhou_StanfordCars.json, whose paths start at the root."""

    key = "stanford_cars"
    layout = CoOpLayout(
        ("cars_train", "cars_test"), "split_zhou_StanfordCars.json", "1ObCFbaAgVu0I-k_Au-gIUcefirdAuizT", "",
        "a photo of a {}.", f"a mirror of cars_train.tgz and cars_test.tgz ({COOP_DATASETS_MD}#stanfordcars; the "
        "Stanford site that hosted them is gone, e.g. https://www.kaggle.com/datasets/jessicali9530/stanford-cars-dataset)",
    )


class OxfordFlowers(_CoOpSuite):
    """Oxford Flowers 102 (102 species), CoOp's split.

    root/jpg/ and root/split_zhou_OxfordFlowers.json (imagelabels.mat and cat_to_name.json are not read: the split
    file names every image's class)."""

    key = "oxford_flowers"
    layout = CoOpLayout(
        ("jpg",), "split_zhou_OxfordFlowers.json", "1Pp0sRXzZFZq15zVOzKjKBu4A9i01nozT", "jpg",
        "a photo of a {}, a type of flower.", "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ (102flowers.tgz)",
        TorchvisionSource("Flowers102", ROBOTS, (("flowers-102/jpg", "jpg"), ("flowers-102/imagelabels.mat", "imagelabels.mat"))),
    )


class Food101(_CoOpSuite):
    """Food-101 (101 dishes), CoOp's split.

    root/images/ and root/split_zhou_Food101.json (the archive's food-101/ folder is the root)."""

    key = "food101"
    layout = CoOpLayout(
        ("images",), "split_zhou_Food101.json", "1QK0tGi096I0Ba6kggatX1ee6dJFIcEJl", "images",
        "a photo of {}, a type of food.", "https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/ (food-101.tar.gz)",
        TorchvisionSource("Food101", "data.vision.ee.ethz.ch", (("food-101/images", "images"), ("food-101/meta", "meta"))),
    )


class SUN397(_CoOpSuite):
    """SUN397 scenes (397 classes), CoOp's split.

    root/SUN397/ and root/split_zhou_SUN397.json."""

    key = "sun397"
    layout = CoOpLayout(
        ("SUN397",), "split_zhou_SUN397.json", "1y2RD81BYuiyvebdN-JymPfyWYcd8_MUq", "SUN397",
        "a photo of a {}.", "https://vision.princeton.edu/projects/2010/SUN/ (SUN397.tar.gz)",
        TorchvisionSource("SUN397", "vision.princeton.edu", (("SUN397", "SUN397"),)),
    )


class EuroSAT(_CoOpSuite):
    """EuroSAT RGB (10 land-cover classes), CoOp's split.

    root/2750/ and root/split_zhou_EuroSAT.json."""

    key = "eurosat"
    layout = CoOpLayout(
        ("2750",), "split_zhou_EuroSAT.json", "1Ip7yaCWFi0eaOFUGga0lUdVi_DDQth1o", "2750",
        "a centered satellite photo of {}.", "https://github.com/phelber/EuroSAT (EuroSAT.zip, the RGB images)",
        TorchvisionSource("EuroSAT", "huggingface.co", (("eurosat/2750", "2750"),)),
    )


# DTD in CoOp's layout: fedur.data.benchmarks.DTD reads it beside ELEVATER's (found by its split file).
DTD_COOP = CoOpLayout(
    ("images",), "split_zhou_DescribableTextures.json", "1u3_QfB467jqHgNXC00UIzbLZRQCg2S7x", "images",
    "{} texture.", "https://www.robots.ox.ac.uk/~vgg/data/dtd/ (dtd-r1.0.1.tar.gz)",
    TorchvisionSource("DTD", ROBOTS, (("dtd/dtd/images", "images"), ("dtd/dtd/labels", "labels"), ("dtd/dtd/imdb", "imdb"))),
)
UCF101_COOP = CoOpLayout(
    ("UCF-101-midframes",), "split_zhou_UCF101.json", "1I0S0q91hJfsV9Gf4xDIjgDq4AqBNJb1y", "UCF-101-midframes",
    "a photo of a person doing {}.", f"CoOp's UCF-101-midframes.zip ({drive_link('10Jqome3vtUA2keJkNanAiFpgbyC9Hc2O')})",
)

FGVC_LISTS = ("variants.txt", "images_variant_train.txt", "images_variant_val.txt", "images_variant_test.txt")


class FGVCAircraft(_CoOpSuite):
    """FGVC-Aircraft (100 variants), its own train / val / test lists as CoOp reads them.

    root is the archive's data/ folder: root/images/, root/variants.txt (line i: class i) and
    root/images_variant_{train,val,test}.txt ("<image id> <variant>"); class names are the variants as written."""

    key = "fgvc_aircraft"
    layout = CoOpLayout(
        ("images",), None, None, "images", "a photo of a {}, a type of aircraft.",
        "https://www.robots.ox.ac.uk/~vgg/data/fgvc-aircraft/ (fgvc-aircraft-2013b.tar.gz, its data/ folder)",
        TorchvisionSource("FGVCAircraft", ROBOTS, (("fgvc-aircraft-2013b/data/*", "."),)),
    )

    def check(self) -> None:
        check_coop(self.label, self._require_root(), self.layout, self.download, FGVC_LISTS)

    def load(self, seed: int) -> ImageDataset:
        root = self._require_root()
        self.check()
        fetch_missing(root, self.layout, self.download, FGVC_LISTS)
        names = [line for _, line in numbered_lines(root / "variants.txt")]
        index = {name: label for label, name in enumerate(names)}
        splits = {}
        for split, parts in (("train", ["train", "val"] if self.include_val else ["train"]), ("test", ["test"])):
            paths, labels = [], []
            for part in parts:
                listing = root / f"images_variant_{part}.txt"
                for number, line in numbered_lines(listing):
                    image, _, variant = line.partition(" ")  # CoOp: the id, then the variant (it may hold spaces)
                    if variant not in index:
                        raise DataUnavailableError(f"{listing}:{number}: variant {variant!r} is not in {root / 'variants.txt'}")
                    paths.append(os.path.join(root, "images", f"{image}.jpg"))
                    labels.append(index[variant])
            where = " + ".join(f"images_variant_{part}.txt" for part in parts)
            check_images_exist(paths, where)
            check_every_class(labels, names, where)
            splits[split] = path_split(paths, labels)
        return ImageDataset(self.key, names, self.layout.template, splits["train"], splits["test"])
