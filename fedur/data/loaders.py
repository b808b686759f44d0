"""Per-client DataLoaders over a client's own indices; shuffling comes from the client's own generator.

Also the reading side of the decode-once cache (fedur/data/cache.py): its rows mapped lazily in each
worker (`MappedImages`), passed on as uint8 (`Pixels`) and normalised per batch on the device
(`BatchNormalize`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from fedur.data.datasets import ImageSplit


class MappedImages:
    """(N, H, W, 3) uint8 rows of a cache file, opened lazily in each process.

    Pickling (a DataLoader worker under spawn) carries the path, not the pixels; under fork the
    worker inherits the open map. `rows` maps row i of this view to a row of the file (kept images).
    An integer index gives a read-only (H, W, 3) view; an index array an in-memory copy.
    """

    def __init__(self, path: str, rows: np.ndarray | None = None):
        self.path, self.rows = path, rows
        self._map = np.load(path, mmap_mode="r")  # reopened lazily after unpickling
        file_rows, *pixel_shape = self._map.shape
        self.shape = (file_rows if rows is None else len(rows), *pixel_shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: int | np.ndarray) -> np.ndarray:
        if self._map is None:
            self._map = np.load(self.path, mmap_mode="r")
        return self._map[index if self.rows is None else self.rows[index]]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}


class Pixels:
    """Decoded (H, W, 3) uint8 pixels (a cache row, or a PIL image) as a (3, H, W) uint8 tensor.

    The per-sample transform of the decode-once cache: no float conversion here, so workers and
    pinned copies move a quarter of the bytes; `BatchNormalize` finishes the preprocess on the batch,
    on the device. `ClientImages` hands it the rows of an array split without a round trip through PIL.
    """

    def __call__(self, image: np.ndarray | Image.Image) -> Tensor:
        if isinstance(image, Image.Image):
            image = image.convert("RGB")
        return torch.from_numpy(np.ascontiguousarray(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return "Pixels()"


class BatchNormalize:
    """(..., 3, H, W) uint8 -> float32 (x / 255 - mean) / std, on whatever device the images are.

    The same float32 operations in the same order as torchvision's ToTensor + Normalize, so
    `BatchNormalize(mean, std)(Pixels()(image))` equals `Compose([ToTensor(), Normalize(mean, std)])(image)`
    bit for bit.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, images: Tensor) -> Tensor:
        if images.dtype != torch.uint8:
            raise TypeError(f"BatchNormalize takes uint8 images (from the image cache), got {images.dtype}")
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return images.float().div_(255).sub_(mean).div_(std)

    def __repr__(self) -> str:
        return f"BatchNormalize(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


def unchanged(images: Tensor) -> Tensor:
    """The batch step when the per-sample transform already normalised (no cache)."""
    return images


class ClientImages(Dataset):
    """Images `split[indices[i]]` through `transform`, each returned with the i-th row of every extra tensor."""

    def __init__(self, split: ImageSplit, indices: np.ndarray, transform: Callable, extras: tuple[Tensor, ...] = ()):
        for extra in extras:
            if len(extra) != len(indices):
                raise ValueError(f"extra tensor has {len(extra)} rows for {len(indices)} images")
        self.split, self.indices, self.transform, self.extras = split, indices, transform, extras
        # decoded rows go straight to Pixels; everything else goes through a PIL image
        self.raw_rows = isinstance(transform, Pixels) and split.arrays is not None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        index = int(self.indices[i])
        image = self.transform(self.split.arrays[index] if self.raw_rows else self.split.load(index))
        return (image, *(extra[i] for extra in self.extras))


def make_loader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    generator: torch.Generator | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Shuffled with `generator` when one is given (training), in order otherwise (prediction)."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=generator is not None,
        generator=generator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=False,
        persistent_workers=generator is not None and num_workers > 0,  # training: one set of workers for all epochs
    )
