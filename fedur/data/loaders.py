"""Per-client DataLoaders over a client's own indices; shuffling comes from the client's own generator."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from fedur.data.datasets import ImageSplit


class ClientImages(Dataset):
    """Images `split[indices[i]]` through `transform`, each returned with the i-th row of every extra tensor."""

    def __init__(self, split: ImageSplit, indices: np.ndarray, transform: Callable, extras: tuple[Tensor, ...] = ()):
        for extra in extras:
            if len(extra) != len(indices):
                raise ValueError(f"extra tensor has {len(extra)} rows for {len(indices)} images")
        self.split, self.indices, self.transform, self.extras = split, indices, transform, extras

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        image = self.transform(self.split.load(int(self.indices[i])))
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
        persistent_workers=False,
    )
