"""Tiny copies of CoOp's dataset layouts (DATASETS.md), split files included: a few 8x8 images per class and part, in
the folders, file names and split-file formats of the real downloads."""

import io
import json

import numpy as np
from PIL import Image

from fedur.data.coop import DTD_COOP, FGVC_LISTS

_buffer = io.BytesIO()
Image.fromarray(np.full((8, 8, 3), 120, dtype=np.uint8)).save(_buffer, format="JPEG")
JPEG = _buffer.getvalue()
PARTS = {"train": 3, "val": 1, "test": 2}  # images per class in each part of a split file

# (class folder on disk, class name in the split file: CoOp's cleaned name) for each dataset, as the real files have them
CLASSES = {
    "caltech101": [("airplanes", "airplane"), ("Faces", "face"), ("accordion", "accordion")],
    "oxford_pets": [("Abyssinian", "abyssinian"), ("american_bulldog", "american_bulldog")],
    "stanford_cars": [("cars", "2000 AM General Hummer SUV"), ("cars", "2012 Acura RL Sedan")],
    "oxford_flowers": [("jpg", "pink primrose"), ("jpg", "hard-leaved pocket orchid")],
    "food101": [("apple_pie", "apple_pie"), ("baby_back_ribs", "baby_back_ribs")],
    "sun397": [("a/abbey", "abbey"), ("a/apartment_building/outdoor", "outdoor apartment_building")],
    "eurosat": [("AnnualCrop", "Annual Crop Land"), ("SeaLake", "Sea or Lake")],
    "dtd": [("banded", "banded"), ("zigzagged", "zigzagged")],
}


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(JPEG)


def write_split_dataset(root, cls, parts=PARTS):
    """root in `cls.layout` (a dataset of fedur.data.coop, or DTD_COOP for "dtd"): its image folder and its split
    file, whose paths start at the layout's image folder."""
    layout = DTD_COOP if cls == "dtd" else cls.layout
    key = "dtd" if cls == "dtd" else cls.key
    images = root / layout.images if layout.images else root
    split = {part: [] for part in parts}
    for part, n in parts.items():
        for label, (folder, name) in enumerate(CLASSES[key]):
            for i in range(n):
                relative = f"{folder}/{label}_{part}{i}.jpg"
                if key == "stanford_cars":  # the paths start at the root: cars_train/... and cars_test/...
                    relative = f"cars_{'test' if part == 'test' else 'train'}/{label:03d}{part}{i}.jpg"
                touch(images / relative)
                split[part].append([relative, label, name])
    for folder in layout.folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / layout.split_file).write_text(json.dumps(split))
    return root


def write_fgvc(root, variants=("707-320", "A300B4", "Cessna 172")):
    """The archive's data/ folder: variants.txt, images_variant_{train,val,test}.txt ("<id> <variant>"), images/."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / FGVC_LISTS[0]).write_text("".join(f"{v}\n" for v in variants))
    for part, n in PARTS.items():
        rows = []
        for label, variant in enumerate(variants):
            for i in range(n):
                image = f"{label}{i}{part[:2]}"
                touch(root / "images" / f"{image}.jpg")
                rows.append(f"{image} {variant}")
        (root / f"images_variant_{part}.txt").write_text("".join(f"{r}\n" for r in rows))
    return root


IMAGENET = [("n01440764", "tench"), ("n01443537", "goldfish"), ("n01484850", "great white shark"),
            ("n01491361", "tiger shark")]


def write_classnames(root):
    root.mkdir(parents=True, exist_ok=True)
    (root / "classnames.txt").write_text("".join(f"{wnid} {name}\n" for wnid, name in IMAGENET))


def write_imagenet(root, per_class=(3, 2)):
    write_classnames(root)
    for split, n in zip(("train", "val"), per_class):
        for wnid, _ in IMAGENET:
            for i in range(n):
                touch(root / "images" / split / wnid / f"{wnid}_{split}{i}.JPEG")
    return root


def write_shifted(root, name):
    """ImageNetV2 (folders 0..C-1), ImageNet-Sketch (every wnid), ImageNet-A and -R (a subset of the wnids, and the
    README.txt their archives hold), each with ImageNet's classnames.txt."""
    write_classnames(root)
    if name == "imagenetv2":
        folders = [str(i) for i in range(len(IMAGENET))]
        base = root / "imagenetv2-matched-frequency-format-val"
    else:
        folders = [wnid for wnid, _ in IMAGENET] if name == "imagenet_sketch" else [IMAGENET[3][0], IMAGENET[1][0]]
        base = root / {"imagenet_sketch": "images", "imagenet_a": "imagenet-a", "imagenet_r": "imagenet-r"}[name]
    for folder in folders:
        for i in range(2):
            touch(base / folder / f"{i}.jpg")
    if name in ("imagenet_a", "imagenet_r"):
        (base / "README.txt").write_text("the archive's own file\n")
    return root
