"""How far apart the clients' prompt updates of one round are (the paper's Figure 2): drift diversity
(magnitude) and mean pairwise cosine distance (direction).

An update is Delta_k = (client k's prompt after local training) - (the prompt it started the round with);
`updates` stacks them as (K, *shape), one row per client, and both measures flatten each row. Apply them to
each prompt (visual, text) separately.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def drift_diversity(updates: Tensor, weights: Tensor | None = None, normalize_weights: bool = True) -> float:
    """sum_k lambda_k ||Delta_k||^2 / ||sum_k lambda_k Delta_k||^2 for updates (K, *shape), weights (K,).

    The gradient diversity of Yin et al. (AISTATS 2018) applied to local updates, as FedLAW (Li et al.,
    ICML 2023, "Revisiting Weighted Aggregation in Federated Learning with Neural Networks") studies client
    drift. With lambda normalised to sum to 1 (the default; uniform 1/K without weights) it is 1 when all
    updates are equal and K for K orthogonal updates of equal norm; larger means more cancelling updates.
    `normalize_weights=False` with no weights gives sum_k ||Delta_k||^2 / ||sum_k Delta_k||^2, the form
    written out by FedVLS (Guo et al., AAAI 2025, supplementary Eq. 7, "following Li et al. 2023"; from
    FedUR's first author): 1/K times the normalised uniform value.

    Returns nan for K < 2 or when every update is zero, inf when non-zero updates sum to zero.
    """
    num_clients = updates.shape[0]
    if num_clients < 2:
        return math.nan
    flat = updates.detach().reshape(num_clients, -1).double()
    lam = torch.ones(num_clients, dtype=torch.float64, device="cpu") if weights is None else weights.detach().double().flatten()
    if normalize_weights:
        lam = lam / lam.sum()
    spread = float((lam * (flat**2).sum(dim=1)).sum())
    mean_sq = float(((lam[:, None] * flat).sum(dim=0) ** 2).sum())
    if spread == 0:
        return math.nan
    return spread / mean_sq if mean_sq > 0 else math.inf


def mean_pairwise_cosine_distance(updates: Tensor) -> float:
    """Mean over client pairs k < j of 1 - cos(Delta_k, Delta_j), updates (K, *shape) flattened per client.

    In [0, 2]: 0 when all updates point the same way, 1 for orthogonal ones. Pairs involving a zero update
    (no direction) are left out; returns nan for K < 2 or when no pair is left.
    """
    num_clients = updates.shape[0]
    if num_clients < 2:
        return math.nan
    flat = updates.detach().reshape(num_clients, -1).double()
    norms = flat.norm(dim=1)
    moving = norms > 0
    unit = flat[moving] / norms[moving, None]
    k = unit.shape[0]
    if k < 2:
        return math.nan
    rows, cols = torch.triu_indices(k, k, offset=1)
    cosines = (unit @ unit.T)[rows, cols].clamp(-1.0, 1.0)
    return float((1 - cosines).mean())
