"""Server-side aggregation of the shared visual prompts, as pure math."""

from __future__ import annotations

from torch import Tensor


def weighted_average(stacked: Tensor, weights: Tensor) -> Tensor | None:
    """sum_k (w_k / sum_i w_i) * stacked[k], accumulated in client-id order (k = 0, 1, ...).

    stacked: (K, *shape); weights: (K,) non-negative, e.g. the number of selected samples (0 for a
    client that sat the round out). Returns None when every weight is zero.
    """
    if stacked.shape[0] != weights.shape[0]:
        raise ValueError(f"{stacked.shape[0]} prompts but {weights.shape[0]} weights")  # internal: the server stacks one row per client
    if bool((weights < 0).any()):
        raise ValueError("aggregation weights must be non-negative")  # internal: weights are counts
    total = weights.double().sum()
    if total == 0:
        return None
    out = stacked.new_zeros(stacked.shape[1:])
    for k in range(stacked.shape[0]):
        if weights[k] > 0:
            out += (weights[k].double() / total).to(stacked.dtype) * stacked[k]
    return out
