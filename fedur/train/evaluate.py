"""Batched inference, and what evaluation reports: every client's accuracy on its own test set."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from lightning import Fabric
from torch import Tensor
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import multiclass_confusion_matrix

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@torch.no_grad()
def predict(fabric: Fabric, classify: Callable[[Tensor], Tensor], loader: DataLoader, num_classes: int) -> tuple[Tensor, Tensor]:
    """(logits (n, C) float32 on CPU, labels (n,)) of `classify` (images -> logits, its text side already
    computed) over a loader of (image, label) batches."""
    logits, labels = [], []
    for images, batch_labels in loader:
        logits.append(classify(fabric.to_device(images)).float().cpu())  # device-to-host copy per batch
        labels.append(batch_labels)
    if not logits:
        return torch.zeros(0, num_classes, device="cpu"), torch.zeros(0, dtype=torch.long, device="cpu")
    return torch.cat(logits), torch.cat(labels)


def confusion_matrix(logits: Tensor, labels: Tensor) -> Tensor:
    """(C, C) int64 counts of the top-1 predictions, rows the true class, columns the predicted one."""
    num_classes = logits.shape[-1]
    if len(labels) == 0:
        return torch.zeros(num_classes, num_classes, dtype=torch.long, device="cpu")
    return multiclass_confusion_matrix(logits.argmax(dim=-1), labels, num_classes, validate_args=False).long()


def correct_and_total(confusion: Tensor) -> Tensor:
    """(2,) int64 [correct top-1 predictions, samples] from a (C, C) confusion matrix."""
    return torch.stack([confusion.trace(), confusion.sum()]).long()


def evaluate_clients(rank: Rank, zero_shot: bool = False, with_confusion: bool = False) -> tuple[Tensor, Tensor | None]:
    """(K, 2) [correct, total] of every client on its own test set with its model (the method's logits with
    the client's prompts), or as zero-shot CLIP; and with `with_confusion` the clients' (K, C, C)
    confusion matrices from the same pass (else None). Without test labels every count is 0 (the accuracies
    are absent, None) and there is no confusion matrix. Every rank calls this."""
    if not rank.dataset.test.labelled:
        return torch.zeros(rank.num_clients, 2, dtype=torch.long, device="cpu"), None  # the same on every rank: nothing to exchange
    confusions = {k: confusion_matrix(logits, labels) for k, (logits, labels) in rank.predict("test", zero_shot).items()}
    counts = {k: correct_and_total(matrix) for k, matrix in confusions.items()}
    accuracy = rank.gather(counts, like=torch.zeros(2, dtype=torch.long, device="cpu"), what="test accuracy counts")
    if not with_confusion:
        return accuracy, None
    num_classes = rank.model.num_classes
    like = torch.zeros(num_classes, num_classes, dtype=torch.long, device="cpu")
    return accuracy, rank.gather(confusions, like=like, what="confusion matrices")
