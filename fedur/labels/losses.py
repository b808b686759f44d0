"""FedUR's local objective L = L_pos + lambda * L_neg (FedUR implementation spec, sec. 5.5-5.6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def positive_loss(logits: Tensor, labels: Tensor, weights: Tensor | None = None) -> Tensor:
    """Class-weighted cross-entropy with PyTorch's weighted mean: sum_i w_{y_i} l_i / sum_i w_{y_i}."""
    return F.cross_entropy(logits.float(), labels, weight=weights)


def negative_loss(logits: Tensor, negatives: Tensor) -> Tensor:
    """mean over the batch of -(1/|N(x)|) sum_{c in N(x)} log(1 - p_c(x) + 1e-7); N(x) empty adds 0.

    negatives: (B, C) bool, the negative pseudo-labels of each sample.
    """
    probs = logits.float().softmax(dim=-1)
    terms = -torch.log1p(-probs + 1e-7) * negatives  # (B, C), zero outside N(x)
    sizes = negatives.sum(dim=-1)
    per_sample = terms.sum(dim=-1) / sizes.clamp_min(1)
    return per_sample.mean()
