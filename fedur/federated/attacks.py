"""What a misbehaving client sends, as pure math: its honest update (the change of its shared pieces from what it
downloaded) replaced (model poisoning), or its pseudo-labels flipped before it trains (data poisoning).

The attacks are the robust-aggregation literature's usual ones (Fang et al. 2020, "Local model poisoning attacks to
Byzantine-robust federated learning"; Blanchard et al. 2017, Krum's Gaussian clients; Tolpegin et al. 2020, label
flipping): `scale` sets each one's size.
"""

from __future__ import annotations

import torch
from torch import Tensor

ATTACKS = ("none", "sign_flip", "scale", "gaussian", "constant", "label_flip")
DEFAULT_SCALE = {"sign_flip": 1.0, "scale": 10.0, "gaussian": 1.0, "constant": 1.0, "label_flip": 1.0}
MODEL_ATTACKS = ("sign_flip", "scale", "gaussian", "constant")  # what replaces an upload (label_flip: the data)


def poisoned_update(update: Tensor, attack: str, scale: float, generator: torch.Generator | None = None) -> Tensor:
    """The update an attacker sends in place of its honest `update` (any shape, float):
    sign_flip  -scale * update (the honest direction reversed);
    scale      scale * update (a boosted update);
    gaussian   N(0, scale^2) in every coordinate, from `generator` (garbage unrelated to the data);
    constant   scale in every coordinate."""
    if attack == "sign_flip":
        return -scale * update
    if attack == "scale":
        return scale * update
    if attack == "gaussian":
        noise = torch.randn(update.shape, generator=generator, dtype=torch.float64, device="cpu")
        return (scale * noise).to(update.dtype)
    if attack == "constant":
        return torch.full_like(update, scale)
    raise ValueError(f"no model attack {attack!r}; one of {MODEL_ATTACKS}")  # internal: settings allow only ATTACKS


def flipped_labels(labels: Tensor, mask: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Label flipping: each pseudo-label c becomes C - 1 - c, and the class mask's columns (negatives, candidates)
    are mirrored with it. labels: (n,) int64; mask: (n, C) bool."""
    return num_classes - 1 - labels, mask.flip(dims=(1,))
