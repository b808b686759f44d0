"""Test helper: the generated shapes written as files, as clients' own folders (dataset ClientFolders) or as
one labelled image folder, so that the tests run fedur on real files without downloading anything."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from fedur.data import synthetic
from fedur.data.datasets import ImageDataset, Synthetic

TestLayout = Literal["own", "unlabelled", "shared", "none"]


def write_images(folder: Path, images: np.ndarray, start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images, start=start):
        Image.fromarray(image).save(folder / f"img_{i:04d}.png")


def write_client_folders(
    root: Path, clients: int = 3, classes: int = 4, train_per_client: int = 40, test_per_client: int = 12,
    test: TestLayout = "own", seed: int = 0, image_size: int = 32,
) -> Path:
    """root/clients/site_<k>/train/*.png (unlabelled; client k mostly holds classes k and k+1), the test images
    per `test` (own: site_<k>/test/<class>/, unlabelled: site_<k>/test/*, shared: root/test/<class>/, none),
    and root/classnames.txt. Returns the class-names file."""
    names = synthetic.CLASSNAMES[:classes]
    per_class = 2 * (train_per_client + test_per_client) * clients // classes + 3
    images, labels = synthetic.generate(classes, per_class, image_size, seed=(seed, 0))
    rng = np.random.default_rng(seed)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in range(classes)}

    def draw(k: int, n: int) -> list[int]:  # a skewed client: 3 of 4 images from its two classes
        taken = []
        for i in range(n):
            choices = [k % classes, (k + 1) % classes] if i % 4 else list(range(classes))
            c = next((c for c in rng.permutation(choices) if pools[c]), None)
            c = next(c for c in range(classes) if pools[c]) if c is None else c
            taken.append(pools[c].pop())
        return taken

    for k in range(clients):
        client = root / "clients" / f"site_{k:02d}"
        write_images(client / "train", images[draw(k, train_per_client)])
        if test in ("own", "unlabelled"):
            chosen = draw(k, test_per_client)
            if test == "unlabelled":
                write_images(client / "test", images[chosen])
            for c in range(classes) if test == "own" else ():
                mine = [i for i in chosen if labels[i] == c]
                if mine:
                    write_images(client / "test" / names[c], images[mine], start=int(mine[0]))
    if test == "shared":
        for c in range(classes):
            write_images(root / "test" / names[c], images[[pools[c].pop() for _ in range(3)]])
    classnames = root / "classnames.txt"
    classnames.write_text("\n".join(names) + "\n")
    return classnames


class ScrambledSynthetic(Synthetic):
    """The generated shapes with the train labels scrambled: each train label value c becomes `permutation[c]`
    (a seeded permutation of the label values), and the labels are then shuffled across the images (so that
    images that shared a label no longer do: a leak that only groups by the true label shows too); the images
    and the test labels unchanged. A test-only
    variant of Synthetic (same key, same images, same cache): with the split fixed (federation.partition
    =file), a run on it must compute what a run on Synthetic does."""

    def __init__(
        self, classes: int = 10, train_per_class: int = 60, test_per_class: int = 20, image_size: int = 32,
        permutation_seed: int = 1,
    ):
        super().__init__(classes, train_per_class, test_per_class, image_size)
        self.permutation_seed = permutation_seed

    def permutation(self) -> np.ndarray:
        return np.random.RandomState(self.permutation_seed).permutation(self.classes)

    def load(self, seed: int) -> ImageDataset:
        dataset = super().load(seed)
        values = self.permutation()[dataset.train.labels]
        dataset.train.labels = np.random.RandomState(self.permutation_seed + 1).permutation(values)
        return dataset
