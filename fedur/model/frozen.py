"""Images as the frozen image tower sees them: a batch of rows of the frozen-feature cache (fedur/data/features.py)
that stands in for the pixels wherever the tower runs without a prompt.

`PromptedCLIP.image_features` and `image_tokens` take a `FrozenImages` where they take images, and return its rows:
what the tower gives those images without a prompt. Asked for a prompted pass, it refuses: a method whose tower
carries a prompt reads images (`fedur.methods.forward.frozen_reads` decides which from the method and its pieces, with
`TowerProbe`, which records what a method's logits ask of the tower). `tower_digest` names a tower's architecture
and weights, the model's part of the cache's key.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from fedur.errors import FedurError

Reads = Literal["features", "tokens"]  # image_features without a prompt, (B, D); image_tokens without one, (B, 1 + P, D)


class FrozenTowerError(FedurError, RuntimeError):
    """A method asked a batch read from the frozen-feature cache for what only the tower can compute (a prompted
    pass, or what the cache does not hold); the message says how to run it on images."""


@dataclass
class FrozenImages:
    """A batch of B images as rows of the frozen-feature cache: their unit-norm features (B, D) and, where the method
    reads them, their unit-norm projected output tokens (B, 1 + P, D), class token first (`PromptedCLIP.image_tokens`).
    Moved, split and joined like an image tensor (`to`, `split`, `cat`, `len`, `device`)."""

    features: Tensor | None
    tokens: Tensor | None = None

    def __len__(self) -> int:
        return len(self._any)

    @property
    def _any(self) -> Tensor:
        return self.features if self.features is not None else self.tokens

    @property
    def device(self) -> torch.device:
        return self._any.device

    def to(self, device: torch.device | str, **kwargs) -> FrozenImages:
        """On `device` (what `fabric.to_device` calls)."""
        return FrozenImages(*(None if t is None else t.to(device, **kwargs) for t in (self.features, self.tokens)))

    def split(self, sizes: list[int]) -> list[FrozenImages]:
        """Consecutive parts of `sizes` rows (as `Tensor.split` with a list)."""
        parts = [None if t is None else t.split(sizes) for t in (self.features, self.tokens)]
        return [FrozenImages(*(None if p is None else p[i] for p in parts)) for i in range(len(sizes))]

    @staticmethod
    def cat(batches: list[FrozenImages]) -> FrozenImages:
        """The batches one after another (as `torch.cat`)."""
        return FrozenImages(*(None if getattr(batches[0], name) is None else torch.cat([getattr(b, name) for b in batches])
                              for name in ("features", "tokens")))

    def read(self, what: Reads, prompt: Tensor | None) -> Tensor:
        """The rows the tower would give for `what` without a prompt; a FrozenTowerError for a prompted pass (`prompt`
        with elements) or for what this batch does not hold."""
        if prompt is not None and prompt.numel():
            raise FrozenTowerError(
                "the method's logits asked for a prompted pass of the image tower on a batch read from the frozen-feature "
                "cache (at the start its tower carried no prompt); set data.feature_cache=false to run the tower on images")
        value = self.features if what == "features" else self.tokens
        if value is None:
            raise FrozenTowerError(
                f"the method's logits asked the image tower for {what} the frozen-feature cache was not built with (at the "
                "start they asked for others); set data.feature_cache=false to run the tower on images")
        return value


def cat_images(batches: list[Tensor] | list[FrozenImages]) -> Tensor | FrozenImages:
    """Image batches one after another: `torch.cat` of tensors, `FrozenImages.cat` of cached rows."""
    return FrozenImages.cat(batches) if isinstance(batches[0], FrozenImages) else torch.cat(batches)


@dataclass
class TowerProbe(FrozenImages):
    """A batch of one image that records what is asked of the tower (`asked`: (what, prompted) in order) and answers
    with zeros of the right shape, so that a method's logits go on to their next call."""

    asked: list[tuple[Reads, bool]] = field(default_factory=list)

    def read(self, what: Reads, prompt: Tensor | None) -> Tensor:
        self.asked.append((what, prompt is not None and bool(prompt.numel())))
        return self.features if what == "features" else self.tokens


def probe(feature_dim: int, device: torch.device) -> TowerProbe:
    """A TowerProbe of features (1, D) and tokens (1, 2, D): a class token and one patch."""
    return TowerProbe(torch.zeros(1, feature_dim, device=device), torch.zeros(1, 2, feature_dim, device=device))


def tower_digest(module: nn.Module, skip: str | None = None) -> str:
    """Hex SHA-256 of a tower's architecture (its modules as printed: layers, widths, activations) and of every tensor
    of its state (name, dtype, shape and a CRC-32 of its bytes: a changed weight changes it, at 3 GB/s, a few tenths of
    a second for ViT-L/14), those whose names start with `skip` left out (a CLIP without its image tower: the text
    tower): another model, weights file or random init gives another."""
    kept = [child for name, child in module.named_children() if skip is None or not f"{name}.".startswith(skip)]
    digest = hashlib.sha256("".join(map(repr, kept)).encode())
    for name, tensor in module.state_dict().items():
        if skip is not None and name.startswith(skip):
            continue
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        digest.update(f"\n{name} {tensor.dtype} {tuple(tensor.shape)} {zlib.crc32(data)}".encode())
    return digest.hexdigest()
