"""The pseudo-label refresh: every client labels its data, the clients' histograms are combined, and each
client selects its share of a globally balanced training set (FedUR sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from lightning import Fabric
from torch import Tensor

from fedur.config import FedURConfig
from fedur.data.datasets import ImageSplit
from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.collectives import Collectives
from fedur.federated.selection import (
    allocate,
    class_weights,
    estimated_counts,
    filter_mask,
    negative_mask,
    select_top,
)
from fedur.model.classifier import PromptedCLIP
from fedur.train.client import ClientState, PseudoLabels
from fedur.train.evaluate import predict
from fedur.train.progress import QUIET, Progress


@dataclass
class Refresh:
    """What every rank knows after a refresh, for all clients (rows are client ids)."""

    estimated: Tensor  # (K, C) u_k: filtered argmax histograms, the clients' uploads
    quotas: Tensor  # (K, C) allocated u~_k (equal to `selected` without cooperative selection)
    selected: Tensor  # (K, C) realized selected counts
    label_hits: Tensor  # (K, 2) selected samples whose pseudo-label is right, and selected samples (monitoring)
    class_weights: Tensor | None  # (C,) global weights of L_pos


def refresh_pseudo_labels(
    fabric: Fabric,
    collectives: Collectives,
    model: PromptedCLIP,
    clients: list[ClientState],
    split: ImageSplit,
    transform: Callable,
    zero_shot_text: Tensor | None,
    refresh_idx: int,
    method: FedURConfig,
    *,
    num_clients: int,
    n_total: int,
    batch_size: int,
    num_workers: int,
    progress: Progress = QUIET,
) -> Refresh:
    """Label every local client's train set with the zero-shot classifier (refresh 0, `zero_shot_text`
    given) or with the client's current prompts (the global visual prompt and its own text prompt), then select.

    Sets `client.pseudo_labels` of the local clients. The true labels are read only to count
    `label_hits` for monitoring.
    """
    num_classes = model.text_prompt.prefix.shape[0]
    probs, truth, kept = {}, {}, {}
    for client in progress.iterate(clients, "pseudo-labelling clients"):
        model.load_prompts(client.visual, client.text_ctx)
        images = ClientImages(split, client.train_indices, transform, (torch.from_numpy(split.labels[client.train_indices]),))
        batches = progress.iterate(make_loader(images, batch_size, num_workers), f"client {client.client_id} batches")
        logits, truth[client.client_id] = predict(fabric, model, batches, zero_shot_text)
        p = probs[client.client_id] = logits.softmax(dim=-1)
        kept[client.client_id] = filter_mask(
            p, method.confidence_filter, method.entropy_filter, method.confidence_quantile, method.entropy_quantile
        )
    if method.cooperative_selection:
        estimated = {k: estimated_counts(probs[k], kept[k]) for k in probs}
        all_estimated = collectives.gather_clients(  # the clients' only upload: C integers each
            estimated, num_clients, like=torch.zeros(num_classes, dtype=torch.long), what="pseudo-label histograms"
        )
        quotas = allocate(all_estimated, n_total, refresh_idx)
    local = {}
    for client in clients:
        p = probs[client.client_id]
        if method.cooperative_selection:
            indices, labels = select_top(p, quotas[client.client_id])
        else:  # no allocation: every kept sample with its argmax label
            indices = torch.nonzero(kept[client.client_id]).flatten()
            labels = p[indices].argmax(dim=-1)
        negatives = negative_mask(p[indices], labels, method.negatives, method.tau_neg)
        if negatives is None:
            negatives = torch.zeros(len(indices), num_classes, dtype=torch.bool)
        client.pseudo_labels = PseudoLabels(indices, labels, negatives)
        hits = int((labels == truth[client.client_id][indices]).sum())
        local[client.client_id] = torch.cat(
            [torch.bincount(labels, minlength=num_classes), torch.tensor([hits, len(labels)])]
        )
    gathered = collectives.gather_clients(
        local, num_clients, like=torch.zeros(num_classes + 2, dtype=torch.long), what="selected counts"
    )
    selected, label_hits = gathered[:, :num_classes], gathered[:, num_classes:]
    if not method.cooperative_selection:
        all_estimated = quotas = selected
    source = quotas if method.weight_source == "requested" else selected
    return Refresh(all_estimated, quotas, selected, label_hits, class_weights(source.sum(dim=0), method.class_weights))
