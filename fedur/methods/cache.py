"""pFedPrompt's personal attention over local visual features, reconstructed as a Tip-Adapter cache (spec sec. 10).

pFedPrompt (WWW 2023) has no public code; the cache follows Tip-Adapter (Zhang et al., ECCV 2022,
`gaopengcuhk/Tip-Adapter`, main.py: `cache_logits = ((-1) * (beta - beta * affinity)).exp() @ cache_values`,
`tip_logits = clip_logits + cache_logits * alpha`, defaults alpha = 1, beta = 5.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def build_cache(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(keys (n, d), values (n, C)): L2-normalised image features and one-hot float labels (n,) int64.

    n = 0 gives empty keys and values, whose cache logits are zero.
    """
    keys = F.normalize(features.float(), dim=-1)
    values = F.one_hot(labels.long(), num_classes).to(keys.dtype)
    return keys, values


def cache_logits(features: Tensor, keys: Tensor, values: Tensor, alpha: float = 1.0, beta: float = 5.5) -> Tensor:
    """(B, C) = alpha * exp(-beta * (1 - f K^T)) V for unit-norm features (B, d), keys (n, d), values (n, C).

    Each cached sample votes for its class with weight exp(-beta (1 - cos)): 1 for an identical feature,
    exp(-2 beta) for an opposite one. Added to the CLIP logits (100 cos(f, t_c)) by the caller.
    """
    affinity = features @ keys.T  # (B, n)
    return alpha * torch.exp(-beta * (1 - affinity)) @ values
