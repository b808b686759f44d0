"""pFedPrompt's personal attention over local visual features, reconstructed as a Tip-Adapter cache (FedUR implementation spec, sec. 10).

pFedPrompt (WWW 2023) has no public code; the cache follows Tip-Adapter (Zhang et al., ECCV 2022,
`gaopengcuhk/Tip-Adapter`, main.py: `cache_logits = ((-1) * (beta - beta * affinity)).exp() @ cache_values`,
`tip_logits = clip_logits + cache_logits * alpha`, against CLIP's logit scale 100), whose cache holds K shots
per class (16 at most): a bounded, class-balanced set of labelled features. fedur's defaults alpha = 1,
beta = 5.5 are the values the Tip-Adapter paper reports (its ablations, ImageNet); its released code (@d0e2d6f) does not
carry them: configs/*.yaml start from beta 1 and alpha 1.17-10 per dataset and then search both on the
validation set, which an unsupervised client cannot do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SELF_TOLERANCE = 1e-5  # an affinity within this of 1 is the sample's own key (no augmentation: its very feature)


def build_cache(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(keys (n, d), values (n, C)): L2-normalised image features and one-hot float labels (n,) int64.

    n = 0 gives empty keys and values, whose cache logits are zero.
    """
    keys = F.normalize(features.float(), dim=-1)
    values = F.one_hot(labels.long(), num_classes).to(keys.dtype)
    return keys, values


def shots_per_class(labels: Tensor, confidence: Tensor, shots: int) -> Tensor:
    """(m,) int64 ascending positions into `labels` (n,) of the `shots` most confident samples of each class
    (all of a class's if fewer; equal confidence: the lower position first): Tip-Adapter's K shots per class,
    from pseudo-labels ranked by their `confidence` (n,)."""
    keep = []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        order = torch.argsort(confidence[members], descending=True, stable=True)
        keep.append(members[order[:shots]])
    return torch.sort(torch.cat(keep)).values if keep else torch.zeros(0, dtype=torch.long, device="cpu")


def cache_logits(features: Tensor, keys: Tensor, values: Tensor, alpha: float = 1.0, beta: float = 5.5,
                 self_vote: bool = True, own: Tensor | None = None) -> Tensor:
    """(B, C) = alpha * exp(-beta * (1 - f K^T)) V for unit-norm features (B, d), keys (n, d), values (n, C).

    Each cached sample votes for its class with weight exp(-beta (1 - cos)): 1 for an identical feature,
    exp(-2 beta) for an opposite one. Added to the CLIP logits (scale x cos(f, t_c)) by the caller. Without
    `self_vote`, the query's own key casts no vote: where `own` (B, n) bool says so (the query is that key's
    sample: exact under any precision, the keys and queries then need not be the same bits); without `own`, a
    key whose affinity to the query is within SELF_TOLERANCE of 1 (its own feature in float32, or an exact
    duplicate; checkpoints from before the cache kept its samples' positions).
    """
    affinity = features @ keys.T  # (B, n)
    votes = torch.exp(-beta * (1 - affinity))  # (B, n)
    if not self_vote:
        votes = votes.masked_fill(affinity > 1 - SELF_TOLERANCE if own is None else own, 0.0)
    return alpha * votes @ values
