"""The arithmetic of client-level differential privacy, as pure functions of tensors (fedur/privacy/releases.py
applies them to a round's uploads and a refresh's histograms).

- An update is one vector per client: the change of each shared piece from what the client downloaded, and each
  message, flattened in the upload's order and clipped together to an L2 norm C (`flatten`, `clip`).
- The Gaussian mechanism adds N(0, (z C)^2) to each coordinate (`gaussian`): to the sum over the clients that took
  part (central, DP-FedAvg: McMahan et al. 2018, "Learning differentially private recurrent language models",
  Algorithm 1 with a fixed denominator) or to each client's own clipped update (local).
- Adaptive clipping (Andrew et al. 2021, "Differentially private learning with adaptive clipping", Algorithm 1):
  C <- C exp(-eta (b - q)), b the noised fraction of updates within C; the noise budget is split between the
  update and that count so that the round is one Gaussian mechanism of multiplier z (`update_noise`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedur.errors import ConfigError


def flatten(parts: dict[str, Tensor]) -> Tensor:
    """(D,) float64: the tensors of `parts` flattened and concatenated in their order."""
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device="cpu")
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in parts.values()])


def unflatten(vector: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """`flatten`'s inverse: {name: tensor of like[name]'s shape and dtype} from consecutive slices of `vector`."""
    out, start = {}, 0
    for name, t in like.items():
        out[name] = vector[start:start + t.numel()].reshape(t.shape).to(t.dtype)
        start += t.numel()
    if start != vector.numel():
        raise ValueError(f"a vector of {vector.numel()} values does not fill {start}")  # internal: shapes fedur made
    return out


def clip(vector: Tensor, bound: float) -> tuple[Tensor, float]:
    """(vector scaled to L2 norm at most `bound`, its norm before): v min(1, C / |v|)."""
    norm = float(torch.linalg.vector_norm(vector))
    return (vector * (bound / norm) if norm > bound else vector), norm


def gaussian(shape: tuple[int, ...] | torch.Size, std: float, generator: torch.Generator) -> Tensor:
    """float64 N(0, std^2) noise of `shape` from `generator` (zeros for std 0, drawing nothing)."""
    if std == 0:
        return torch.zeros(shape, dtype=torch.float64, device="cpu")
    return torch.randn(shape, generator=generator, dtype=torch.float64, device="cpu") * std


def update_noise(noise_multiplier: float, count_std: float) -> float:
    """Adaptive clipping's multiplier z_D of the update's noise, so that the update (z_D) and the count of updates
    within C (std `count_std`, sensitivity 1/2 once centred) together cost one Gaussian mechanism of multiplier z:
    z_D = (z^-2 - (2 count_std)^-2)^(-1/2) (Andrew et al. 2021, Theorem 1). Raises a ConfigError when the count's
    noise alone already costs more than z."""
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier ** -2 - (2 * count_std) ** -2
    if rest <= 0:
        raise ConfigError(f"privacy.clipped_count_stddev={count_std:g} is too small for noise_multiplier {noise_multiplier:g}: "
                         f"it must exceed {1 / (2 * noise_multiplier):g} (1 / (2 z))")
    return rest ** -0.5


def next_clip(clip_norm: float, within: float, target_quantile: float, lr: float) -> float:
    """Andrew et al.'s geometric update of C from the noised fraction `within` of updates whose norm was <= C."""
    return clip_norm * math.exp(-lr * (within - target_quantile))


def noised_counts(counts: Tensor, bound: float, std: float, generator: torch.Generator) -> Tensor:
    """(C,) float64: a histogram clipped to L2 norm `bound`, plus N(0, std^2) per class."""
    clipped, _ = clip(counts.to(torch.float64), bound)
    return clipped + gaussian(clipped.shape, std, generator)


def released_counts(noised: Tensor) -> Tensor:
    """(..., C) int64: noised counts as counts (rounded, at least 0): post-processing, free of privacy cost."""
    return noised.round().clamp_min(0).to(torch.int64)
