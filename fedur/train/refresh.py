"""The pseudo-label refresh: every client labels its data, the clients' histograms are combined, and each
client selects its share of a globally balanced training set (FedUR sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.config import FedURConfig
from fedur.federated.selection import (
    allocate,
    class_weights,
    estimated_counts,
    filter_mask,
    negative_mask,
    select_top,
)
from fedur.train.client import PseudoLabels

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class Refresh:
    """What every rank knows after a refresh, for all clients (rows are client ids)."""

    estimated: Tensor  # (K, C) u_k: filtered argmax histograms, the clients' uploads
    quotas: Tensor  # (K, C) allocated u~_k (equal to `selected` without cooperative selection)
    selected: Tensor  # (K, C) realized selected counts
    label_hits: Tensor  # (K, 2) selected samples whose pseudo-label is right, and selected samples (monitoring)
    class_weights: Tensor | None  # (C,) global weights of L_pos


def refresh_pseudo_labels(rank: "Rank", zero_shot: bool, refresh_idx: int, method: FedURConfig, n_total: int) -> Refresh:
    """Label every local client's train set with zero-shot CLIP (the first refresh) or with the client's
    current prompts (the global visual prompt and its own text prompt), then select. Every rank calls this.

    Sets `client.pseudo_labels` of the local clients. The true labels are read only to count
    `label_hits` for monitoring. `n_total`: the size of the whole train set (the allocation's fallback).
    """
    num_classes = rank.model.num_classes
    predictions = rank.predict("train", zero_shot, desc="pseudo-labelling clients")
    probs = {k: logits.softmax(dim=-1) for k, (logits, _) in predictions.items()}
    kept = {
        k: filter_mask(p, method.confidence_filter, method.entropy_filter, method.confidence_quantile, method.entropy_quantile)
        for k, p in probs.items()
    }
    if method.cooperative_selection:
        estimated = {k: estimated_counts(probs[k], kept[k]) for k in probs}
        like = torch.zeros(num_classes, dtype=torch.long)
        all_estimated = rank.gather(estimated, like, what="pseudo-label histograms")  # the clients' only upload
        quotas = allocate(all_estimated, n_total, refresh_idx)
    local = {}
    for client in rank.clients:
        p, truth = probs[client.client_id], predictions[client.client_id][1]
        if method.cooperative_selection:
            indices, labels = select_top(p, quotas[client.client_id])
        else:  # no allocation: every kept sample with its argmax label
            indices = torch.nonzero(kept[client.client_id]).flatten()
            labels = p[indices].argmax(dim=-1)
        negatives = negative_mask(p[indices], labels, method.negatives, method.tau_neg)
        if negatives is None:
            negatives = torch.zeros(len(indices), num_classes, dtype=torch.bool)
        client.pseudo_labels = PseudoLabels(indices, labels, negatives)
        hits = int((labels == truth[indices]).sum())
        local[client.client_id] = torch.cat([torch.bincount(labels, minlength=num_classes), torch.tensor([hits, len(labels)])])
    gathered = rank.gather(local, torch.zeros(num_classes + 2, dtype=torch.long), what="selected counts")
    selected, label_hits = gathered[:, :num_classes], gathered[:, num_classes:]
    if not method.cooperative_selection:
        all_estimated = quotas = selected
    source = quotas if method.weight_source == "requested" else selected
    return Refresh(all_estimated, quotas, selected, label_hits, class_weights(source.sum(dim=0), method.class_weights))
