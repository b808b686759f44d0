"""The pseudo-label refresh: every client labels its data with its current model and the labeller selects
its training samples (for the cooperative labellers, from the combined histograms of all clients: FedUR
sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.federated.client import check_tensors
from fedur.labels.base import Labeller

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class Refresh:
    """What every rank knows after a refresh, for all clients (rows are client ids)."""

    estimated: Tensor  # (K, C) u_k: filtered argmax histograms, the clients' uploads (else `selected`)
    quotas: Tensor  # (K, C) allocated u~_k (equal to `selected` for labellers that do not cooperate)
    selected: Tensor  # (K, C) realized selected counts
    label_hits: Tensor  # (K, 2) selected samples whose pseudo-label is right, and selected samples (monitoring)
    class_weights: Tensor | None  # (C,) global weights of L_pos


def refresh_pseudo_labels(rank: Rank, zero_shot: bool, refresh_idx: int, labeller: Labeller, n_total: int) -> Refresh:
    """Label every local client's train set with zero-shot CLIP (the first refresh) or with the client's
    current model (the method's logits with its prompts), then let `labeller` select. Every rank calls this.

    Sets `client.pseudo_labels` of the local clients and lets the method build what it keeps per client.
    The true labels are read only to count `label_hits` for monitoring. `n_total`: the size of the whole
    train set (the cooperative allocation's fallback).
    """
    num_classes = rank.model.num_classes
    predictions = rank.predict("train", zero_shot, desc="pseudo-labelling clients")
    probs = {k: logits.softmax(dim=-1) for k, (logits, _) in predictions.items()}
    quotas = None
    if labeller.cooperative:
        estimated = {k: labeller.estimate(p) for k, p in probs.items()}
        like = torch.zeros(num_classes, dtype=torch.long)
        all_estimated = rank.gather(estimated, like, what="pseudo-label histograms")  # the clients' only upload
        quotas = labeller.allocate(all_estimated, n_total, refresh_idx)
    local = {}
    for client in rank.clients:
        p, truth = probs[client.client_id], predictions[client.client_id][1]
        client.pseudo_labels = chosen = labeller.select(
            p, None if quotas is None else quotas[client.client_id], refresh_idx, previous=client.pseudo_labels
        )
        rank.method.after_refresh(client, rank)
        check_tensors(client.extra, f"{type(rank.method).__name__}.after_refresh's client.extra")
        hits = int((chosen.labels == truth[chosen.indices]).sum())
        counts = torch.bincount(chosen.labels, minlength=num_classes)
        local[client.client_id] = torch.cat([counts, torch.tensor([hits, len(chosen.labels)])])
    gathered = rank.gather(local, torch.zeros(num_classes + 2, dtype=torch.long), what="selected counts")
    selected, label_hits = gathered[:, :num_classes], gathered[:, num_classes:]
    if quotas is None:
        all_estimated = quotas = selected
    return Refresh(all_estimated, quotas, selected, label_hits, labeller.class_weights(quotas, selected))
