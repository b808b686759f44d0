"""Every pass over a rank's images through one loader (`ImageLoader`), in batches its caller plans; a client's
local epoch is shuffled from the client's own stream (`epoch_order`).

Also the reading side of the decode-once cache (fedur/data/cache.py): its rows mapped lazily in each
worker (`MappedImages`), passed on as uint8 (`Pixels`) and normalised per batch on the device
(`BatchNormalize`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

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
    on the device. `SplitImages` hands it the rows of an array split without a round trip through PIL.
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
        self._on: dict[torch.device, tuple[Tensor, Tensor]] = {}  # copies per device: one host-to-device copy each

    def __call__(self, images: Tensor) -> Tensor:
        if images.dtype != torch.uint8:
            # internal: only the cache's uint8 batches come here
            raise TypeError(f"BatchNormalize takes uint8 images (from the image cache), got {images.dtype}")
        if images.device not in self._on:
            self._on[images.device] = self.mean.to(images.device), self.std.to(images.device)
        mean, std = self._on[images.device]
        return images.float().div_(255).sub_(mean).div_(std)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_on": {}}

    def __repr__(self) -> str:
        return f"BatchNormalize(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


def unchanged(images: Tensor) -> Tensor:
    """The batch step when the per-sample transform already normalised (no cache)."""
    return images


class SplitImages(Dataset):
    """Item (split, row): image `row` of the dataset's `split` ("train" or "test") through `transform`. What the
    worker processes of an `ImageLoader` hold: every image of the rank, addressed by the main process."""

    def __init__(self, splits: dict[str, ImageSplit], transform: Callable):
        self.splits, self.transform = splits, transform
        # decoded rows go straight to Pixels; everything else goes through a PIL image
        self.raw_rows = {name: isinstance(transform, Pixels) and split.arrays is not None for name, split in splits.items()}

    def __len__(self) -> int:
        return sum(len(split) for split in self.splits.values())

    def __getitem__(self, key: tuple[str, int]) -> Tensor:
        name, row = key
        split = self.splits[name]
        return self.transform(split.arrays[row] if self.raw_rows[name] else split.load(row))


class _Plan:
    """The batch sampler of an `ImageLoader`'s DataLoader: the (split, row) keys of the batches of the pass
    under way, set by the main process before each pass (the workers receive keys, not the plan)."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class ImageLoader:
    """Every pass over a rank's images (a client's local epoch, a unit's pseudo-labelling, evaluation) in
    batches the caller plans: `batches(split, plan)` yields the (B, 3, H, W) images of each planned batch of
    rows, in order.

    With `num_workers` > 0 the images are read by one set of worker processes, started at the first pass and
    kept for the run (not one set per client and pass: each start costs time, and in containers the shared
    memory of many short-lived workers runs out). What is read never depends on the number of workers: the
    order is the caller's, and nothing random happens in a worker. With 0, images are read in this process.
    """

    def __init__(self, splits: dict[str, ImageSplit], transform: Callable, num_workers: int = 0, pin_memory: bool = False):
        self.images = SplitImages(splits, transform)
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self._plan = _Plan()
        self._loader: DataLoader | None = None
        self._iterator = None

    def batches(self, split: str, plan: Sequence[np.ndarray]) -> Iterator[Tensor]:
        """The images of `split` at each array of rows in `plan`, one (len(rows), 3, H, W) tensor per array.
        Consume it to the end before starting another pass."""
        keys = [[(split, int(row)) for row in rows] for rows in plan]
        if self.num_workers == 0:
            for batch in keys:
                images = torch.stack([self.images[key] for key in batch])  # what the DataLoader's collate does
                yield images.pin_memory() if self.pin_memory else images
            return
        if not keys:
            return
        if self._loader is None:
            self._loader = DataLoader(
                self.images, batch_sampler=self._plan, num_workers=self.num_workers, pin_memory=self.pin_memory,
                persistent_workers=True, generator=torch.Generator().manual_seed(0),  # the workers' seeds only
            )
        self._plan.batches = keys
        self._iterator = iter(self._loader)  # the same workers, a new pass
        yield from self._iterator

    def close(self) -> None:
        """Stop the worker processes (a later pass starts new ones)."""
        if self._iterator is not None and hasattr(self._iterator, "_shutdown_workers"):
            self._iterator._shutdown_workers()
        self._loader = self._iterator = None


def in_batches(positions: np.ndarray | Tensor, batch_size: int) -> list[np.ndarray]:
    """`positions` cut into consecutive batches of `batch_size` (the last one shorter)."""
    positions = np.asarray(positions)
    return [positions[i : i + batch_size] for i in range(0, len(positions), batch_size)]


def epoch_order(n: int, generator: torch.Generator) -> Tensor:
    """(n,) int64: a local epoch's order of a client's n samples, drawn from its round's `generator`.

    The draws are those of the DataLoader fedur had (one epoch per iteration of a DataLoader shuffled by
    `generator` in the main process): the seed it drew for its workers, the permutation, and the empty tail's
    permutation at the end of the epoch. So runs give the bits they gave before, now whatever data.num_workers
    is (a DataLoader with persistent workers skips the first draw from its second epoch on, which made the
    order depend on the number of workers).
    """
    torch.empty((), dtype=torch.int64).random_(generator=generator)  # the DataLoader's base seed
    order = torch.randperm(n, generator=generator)
    torch.randperm(n, generator=generator)  # RandomSampler's tail (its num_samples % n first, none)
    return order
