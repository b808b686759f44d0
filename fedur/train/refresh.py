"""The pseudo-label refresh: every client labels its data with its current model and the labeller selects
its training samples (for the cooperative labellers, from the combined histograms of all clients: FedUR
sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from fedur.federated.client import check_tensors
from fedur.labels.base import Labeller, PseudoLabels

if TYPE_CHECKING:
    from fedur.train.host import Host


@dataclass
class Refresh:
    """What every rank knows after a refresh, for all clients (rows are client ids)."""

    estimated: Tensor  # (K, C) u_k: filtered argmax histograms, the clients' uploads (else `selected`)
    quotas: Tensor  # (K, C) allocated u~_k (equal to `selected` for labellers that do not cooperate)
    selected: Tensor  # (K, C) realized selected counts
    label_hits: Tensor | None  # (K, 2) selected samples whose pseudo-label is right, and selected samples
    # (monitoring; None when the train images have no labels)
    class_weights: Tensor | None  # (C,) global weights of L_pos
    agreement: Tensor | None = None  # (K, 2) images selected at this refresh and the previous one with the same
    # pseudo-label both times, and images selected both times (label-free monitoring; None at the first refresh)


def refresh_pseudo_labels(
    host: Host, zero_shot: bool, refresh_idx: int, labeller: Labeller, n_total: int, train_labels: np.ndarray | None,
    members: Tensor | None = None,
) -> Refresh:
    """Label every local client's train set with zero-shot CLIP (the first refresh) or with the client's
    current model (the method's logits with its prompts), then let `labeller` select. Every rank calls this.

    Sets `client.pseudo_labels` of the local clients and lets the method build what it keeps per client.
    The rank's train split has no labels: `train_labels` (the true label of every train row, None when the
    data has none) is read only here, and only to count `label_hits` for monitoring. `n_total`: the size of
    the whole train set (the cooperative allocation's fallback). `members`: (K,) bool, the clients that label
    and cooperate (default: `host.training`); the others keep their pseudo-labels and have zero rows.
    """
    num_classes = host.model.num_classes
    members = host.training if members is None else members
    hosted = [c for c in host.clients if members[c.client_id]]
    predictions = host.predict("train", zero_shot, desc="pseudo-labelling clients", clients=hosted)
    probs = {k: logits.softmax(dim=-1) for k, (logits, _) in predictions.items()}
    quotas = None
    if labeller.cooperative:
        estimated = {k: labeller.estimate(p) for k, p in probs.items()}
        like = torch.zeros(num_classes, dtype=torch.long, device="cpu")
        all_estimated = host.gather(estimated, like, what="pseudo-label histograms")  # the clients' only upload
        quotas = torch.zeros_like(all_estimated)  # the members' allocation among themselves; zeros for the others
        quotas[members] = labeller.allocate(all_estimated[members], n_total, refresh_idx)
    local = {}
    for client in hosted:
        previous = client.pseudo_labels
        client.pseudo_labels = chosen = labeller.select(
            probs[client.client_id], None if quotas is None else quotas[client.client_id], refresh_idx, previous=previous
        )
        host.method.after_refresh(client, host.client_data)
        check_tensors(client.extra, f"{type(host.method).__name__}.after_refresh's client.extra")
        counts = torch.bincount(chosen.labels, minlength=num_classes)
        local[client.client_id] = torch.cat([counts, label_hits(chosen, client.train_indices, train_labels),
                                             agreement(previous, chosen)])
    gathered = host.gather(local, torch.zeros(num_classes + 4, dtype=torch.long, device="cpu"), what="selected counts")
    selected, hits, agreed = gathered[:, :num_classes], gathered[:, num_classes:num_classes + 2], gathered[:, num_classes + 2:]
    if quotas is None:
        all_estimated = quotas = selected
    return Refresh(all_estimated, quotas, selected, None if train_labels is None else hits,
                   labeller.class_weights(quotas, selected), None if zero_shot else agreed)


def label_hits(chosen: PseudoLabels, train_indices: np.ndarray, train_labels: np.ndarray | None) -> Tensor:
    """(2,) [selected samples whose pseudo-label is the true label, selected samples]; zeros without labels."""
    if train_labels is None:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    truth = torch.from_numpy(train_labels[train_indices[chosen.indices.numpy()]])
    return torch.tensor([int((chosen.labels == truth).sum()), len(chosen.labels)], device="cpu")


def agreement(previous: PseudoLabels | None, chosen: PseudoLabels) -> Tensor:
    """(2,) [samples selected at both refreshes with the same pseudo-label, samples selected at both]."""
    if previous is None:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    before = dict(zip(previous.indices.tolist(), previous.labels.tolist()))
    both = [(before[i], label) for i, label in zip(chosen.indices.tolist(), chosen.labels.tolist()) if i in before]
    return torch.tensor([sum(a == b for a, b in both), len(both)], device="cpu")
