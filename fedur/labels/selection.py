"""Cooperative pseudo-label selection (FedUR sec. 3.3-3.4, FedUR implementation spec, sec. 5.1-5.5) as pure functions.

A refresh goes: `filter_mask` -> `estimated_counts` (the only statistic a client uploads) ->
`allocate` (identical on every rank, from all clients' counts) -> `select_top` per client ->
`negative_mask` for the selected samples -> `class_weights` from the global selected distribution.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

NegativeRule = Literal["mass", "threshold", "ratio", "online", "none"]
WeightFn = Literal["inv", "inv_sqrt", "none"]


def entropy(probs: Tensor) -> Tensor:
    """Natural-log entropy of each row: (n, C) -> (n,)."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)


def filter_mask(
    probs: Tensor,
    confidence: bool = True,
    entropy_filter: bool = True,
    confidence_quantile: float = 0.5,
    entropy_quantile: float = 0.5,
) -> Tensor:
    """(n,) bool: top-1 probability above its client quantile AND entropy below its (1 - q) quantile.

    Thresholds are per client (FedCoPL `_create_training_dataset_pre`): with q = 0.5 they are the
    client's median confidence and median entropy. Both comparisons are strict.
    """
    keep = torch.ones(probs.shape[0], dtype=torch.bool, device="cpu")
    if probs.shape[0] == 0:
        return keep
    if confidence:
        top1 = probs.max(dim=-1).values
        keep &= top1 > torch.quantile(top1, confidence_quantile)
    if entropy_filter:
        ent = entropy(probs)
        keep &= ent < torch.quantile(ent, 1 - entropy_quantile)
    return keep


def estimated_counts(probs: Tensor, mask: Tensor) -> Tensor:
    """u_k: (C,) int64 number of kept samples whose argmax is each class."""
    return torch.bincount(probs[mask].argmax(dim=-1), minlength=probs.shape[1])


def budget(counts: Tensor) -> int:
    """M = ceil(sum_k sum_c u_kc / C): the global mean estimated count per class."""
    num_classes = counts.shape[-1]
    return -(-int(counts.sum()) // num_classes)


def allocate(counts: Tensor, n_total: int, refresh_idx: int, arithmetic: Literal["exact", "reference"] = "exact",
             totals: Tensor | None = None, num_clients: int | None = None) -> Tensor:
    """Per-client, per-class quotas u~ (K, C) int64 from all clients' estimated counts u (K, C).

    u~_kc = ceil(u_kc / sum_i u_ic * M). A class no client estimated gets the reference's fallback
    ceil(N_total / C / 4 * (t + 1) / K) for every client, t the refresh index.

    `totals`: (C,) int64 sum_i u_ic as released (privacy: the noised sums), in place of the rows' own sum; then the
    rows may be some clients' only (each client its own), and `num_clients` is K of the fallback. A released sum below
    a client's own count is raised to it for that client (the sum includes it: post-processing that costs no
    privacy), so that no quota exceeds M.

    `arithmetic`: 'exact' computes the quota in exact integer arithmetic (the formula's value); 'reference'
    as FedCoPL's code does (`methods/main_UL.py` lines 485-490, @ed7e0e0): counts, M and the quotient in
    float32, (u / sum) first, then x M, then ceil. Where u * M / sum is an integer, float32 may land just
    above it and the reference's ceil adds one (u = 5, sum = 39, M = 39: 6, not 5); its fallback is also
    taken in float32.
    """
    num_classes = counts.shape[1]
    num_clients = counts.shape[0] if num_clients is None else num_clients
    released = counts.sum(dim=0) if totals is None else totals  # (C,): what M is taken from
    totals = released if totals is None else torch.maximum(totals, counts)  # (C,), or (K, C): each client's own
    fallback = n_total / num_classes / 4 * (refresh_idx + 1) / num_clients
    if arithmetic == "reference":
        u = counts.to(torch.float32)
        total = totals.to(torch.float32)  # float32, as the reference's summed float32 histograms
        m = torch.ceil(released.to(torch.float32).sum() / num_classes)
        value = torch.where(total != 0, u / total * m, torch.full_like(u, fallback))  # 0 / 0 is masked out
        return torch.ceil(value).to(torch.int64)
    m = budget(released)
    quotas = -torch.div(-counts * m, totals.clamp_min(1), rounding_mode="floor")  # ceil for non-negative ints
    return torch.where(totals > 0, quotas, torch.full_like(quotas, math.ceil(fallback)))


def select_top(probs: Tensor, quotas: Tensor) -> tuple[Tensor, Tensor]:
    """For each class c, the quotas[c] samples predicted as c with the highest p_c (all, if fewer).

    Returns (indices, labels) sorted by index. Ties keep the lower index first.
    """
    preds = probs.argmax(dim=-1)
    chosen = []
    for c in range(probs.shape[1]):
        members = torch.nonzero(preds == c).flatten()
        if members.numel() == 0 or quotas[c] <= 0:
            continue
        order = torch.argsort(probs[members, c], descending=True, stable=True)
        chosen.append(members[order[: int(quotas[c])]])
    indices = torch.sort(torch.cat(chosen)).values if chosen else torch.zeros(0, dtype=torch.long, device="cpu")
    return indices, preds[indices]


def negative_mask(probs: Tensor, labels: Tensor, rule: NegativeRule, tau: float) -> Tensor | None:
    """(n, C) bool: the negative pseudo-labels Y_neg(x) of each selected sample; never its label.

    mass: the largest set of lowest classes whose probabilities sum to at most tau (default);
    threshold: classes with p_c < tau; ratio: the ceil(tau * C) lowest classes.
    'online' is the mass rule on the current model's detached p during training, and 'none' is off:
    both return None here.
    """
    if rule in ("online", "none"):
        return None
    n, num_classes = probs.shape
    if rule == "mass":
        mask = mass_negatives(probs, tau)
    elif rule == "threshold":
        mask = probs < tau
    elif rule == "ratio":
        lowest = torch.argsort(probs, dim=-1, stable=True)[:, : math.ceil(tau * num_classes)]
        mask = torch.zeros(n, num_classes, dtype=torch.bool, device="cpu").scatter_(1, lowest, True)
    else:
        raise ValueError(f"unknown negative rule {rule!r}")  # internal: a Literal setting checks it first
    mask[torch.arange(n, device="cpu"), labels] = False
    return mask


def mass_negatives(probs: Tensor, tau: float) -> Tensor:
    """(n, C) bool: per row, the largest set of lowest classes whose probabilities sum to <= tau."""
    ascending, order = torch.sort(probs.detach(), dim=-1, stable=True)
    within = ascending.cumsum(dim=-1) <= tau
    return torch.zeros_like(within).scatter_(-1, order, within)


def class_weights(counts: Tensor, fn: WeightFn) -> Tensor | None:
    """Global class weights w (C,) from the selected counts summed over clients (d_c = counts / total).

    inv: (1/d_c) normalised to mean 1 over the classes present; inv_sqrt: the same with 1/sqrt(d_c).
    A class without samples gets 1 (it has no positive term to weigh). 'none' returns None.
    """
    if fn == "none":
        return None
    counts = counts.double()
    present = counts > 0
    if not bool(present.any()):
        return torch.ones_like(counts, dtype=torch.float32)
    freq = counts / counts.sum()
    raw = torch.where(present, 1.0 / freq.clamp_min(1e-30), torch.zeros_like(freq))
    if fn == "inv_sqrt":
        raw = raw.sqrt()
    elif fn != "inv":
        raise ValueError(f"unknown class weight function {fn!r}")  # internal: a Literal setting checks it first
    weights = raw / raw[present].mean()
    return torch.where(present, weights, torch.ones_like(weights)).float()
