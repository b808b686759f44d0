"""Batched inference: logits of a client's images under the zero-shot or the prompted classifier."""

from __future__ import annotations

import torch
from lightning import Fabric
from torch import Tensor
from torch.utils.data import DataLoader

from fedur.model.classifier import PromptedCLIP


@torch.no_grad()
def predict(
    fabric: Fabric, model: PromptedCLIP, loader: DataLoader, zero_shot_text: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(logits (n, C) float32 on CPU, labels (n,)) for a loader of (image, label) batches.

    With `zero_shot_text` (C, D) the plain CLIP image features are used (no prompts); otherwise the
    currently loaded prompts. Text features are computed once per call.
    """
    logits, labels = [], []
    with fabric.autocast():
        text = zero_shot_text.to(fabric.device) if zero_shot_text is not None else model.text_features()
        for images, batch_labels in loader:
            images = fabric.to_device(images)
            features = model.image_features(images, prompted=zero_shot_text is None)
            logits.append(model.logits(features, text).float().cpu())  # device-to-host copy per batch
            labels.append(batch_labels)
    if not logits:
        return torch.zeros(0, model.text_prompt.prefix.shape[0]), torch.zeros(0, dtype=torch.long)
    return torch.cat(logits), torch.cat(labels)


def correct_and_total(logits: Tensor, labels: Tensor) -> Tensor:
    """(2,) int64: number of correct top-1 predictions and number of samples."""
    return torch.tensor([int((logits.argmax(dim=-1) == labels).sum()), len(labels)], dtype=torch.long)


def confusion_matrix(logits: Tensor, labels: Tensor) -> Tensor:
    """(C, C) int64 counts, rows the true class, columns the predicted one."""
    num_classes = logits.shape[-1]
    pairs = labels * num_classes + logits.argmax(dim=-1)  # (n,) flat index of (true, predicted)
    return torch.bincount(pairs, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
