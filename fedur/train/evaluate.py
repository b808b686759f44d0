"""Batched inference, and what evaluation reports: every client's accuracy on its own test set (the personal
protocol), and the server's model on the training clients' test images together (the global protocol,
docs/protocols.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch
from lightning import Fabric
from torch import Tensor
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import multiclass_confusion_matrix

from fedur.data.loaders import in_batches
from fedur.federated.client import ClientState
from fedur.methods.base import GlobalModel, GlobalView

if TYPE_CHECKING:
    from fedur.methods.base import Method
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.rank import HeldOutSet, Rank


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


def evaluate_clients(rank: Rank, zero_shot: bool = False, with_confusion: bool = False,
                     clients: list[ClientState] | None = None) -> tuple[Tensor, Tensor | None]:
    """(K, 2) [correct, total] of every client on its own test set with its model (the method's logits with
    the client's prompts), or as zero-shot CLIP; and with `with_confusion` the clients' (K, C, C)
    confusion matrices from the same pass (else None). Without test labels every count is 0 (the accuracies
    are absent, None) and there is no confusion matrix. `clients`: only these of the rank's (the others' rows are
    zeros). Every rank calls this."""
    if not rank.dataset.test.labelled:
        return torch.zeros(rank.num_clients, 2, dtype=torch.long, device="cpu"), None  # the same on every rank: nothing to exchange
    confusions = {k: confusion_matrix(logits, labels) for k, (logits, labels) in rank.predict("test", zero_shot, clients=clients).items()}
    counts = {k: correct_and_total(matrix) for k, matrix in confusions.items()}
    accuracy = rank.gather(counts, like=torch.zeros(2, dtype=torch.long, device="cpu"), what="test accuracy counts")
    if not with_confusion:
        return accuracy, None
    num_classes = rank.model.num_classes
    like = torch.zeros(num_classes, num_classes, dtype=torch.long, device="cpu")
    return accuracy, rank.gather(confusions, like=like, what="confusion matrices")


def evaluate_global(rank: Rank, shared: dict[str, Tensor] | None, state: dict[str, Tensor],
                    held_out: HeldOutSet | None = None) -> Tensor | None:
    """(2,) int64 [correct, total] of the server's model (Method.global_model, from the global pieces `shared` and
    the method's server `state`) on the training clients' test images together (`rank.global_rows`), or on a
    held-out set with its own classes; None when the method has no global model. Without test labels: zeros.

    Every rank calls this. The batches are dealt to the ranks in turn (batch b to rank b mod world size) and
    the counts summed, so each rank does a share of the work and the counts do not depend on the placement.
    `shared` None: zero-shot CLIP instead of the server's model (the reference a held-out set's gain is read from)."""
    model = rank.model if held_out is None else held_out.model
    method, fabric = rank.method, rank.fabric
    server_model = None
    if shared is not None:
        view = GlobalView(dict(shared), dict(state), rank.start, lambda name: client_mean(rank, name),
                          other_classes=model is not rank.model)
        server_model = method.global_model(model, view)
        if server_model is None:
            return None
    if not rank.dataset.test.labelled:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    rows = rank.global_rows if held_out is None else held_out.rows
    labels = rank.dataset.test.labels[rows] if held_out is None else held_out.labels
    plan = in_batches(np.arange(len(rows)), rank.work.eval_batch_size)[fabric.global_rank::fabric.world_size]
    batches = zip(rank.images.batches("test", [rows[b] for b in plan]), (torch.from_numpy(labels[b]) for b in plan))
    counts = server_counts(fabric, method, model, server_model, batches)
    return rank.collectives.gather_ranks(counts, what="global accuracy counts").sum(dim=0)


@torch.no_grad()
def server_counts(fabric: Fabric, method: Method, model: PromptedCLIP, server_model: GlobalModel | None,
                  batches: Iterable[tuple[Tensor, Tensor]]) -> Tensor:
    """(2,) int64 [correct, total] of `server_model` (a client that holds no data, scored with the method's
    `logits`; None: zero-shot CLIP) over (images, labels) batches: what the global protocols and
    fedur-cross-dataset count."""
    held = server_model or GlobalModel({})
    empty = np.zeros(0, dtype=np.int64)
    server = ClientState(-1, empty, empty, dict(held.pieces), extra=dict(held.extra)).on(fabric.device)
    counts = torch.zeros(2, dtype=torch.long, device="cpu")
    with fabric.autocast():
        if server_model is not None:
            text = method.text_side(model, server.pieces) if server_model.text is None else server_model.text
        for images, truth in batches:
            images = fabric.to_device(images)
            if server_model is None:
                logits = model.logits(model.image_features(images, prompted=False), model.zero_shot_text)
            else:
                logits = method.logits(model, images, server.pieces, text, server, None)
            counts += torch.stack([(logits.float().argmax(dim=-1).cpu() == truth).sum(), torch.tensor(len(truth), device="cpu")])
    return counts


def client_mean(rank: Rank, name: str) -> Tensor:
    """The plain mean over the training clients of piece `name` (CPU), in client-id order. Every rank calls this."""
    like = rank.start[name]
    values = {c.client_id: c.pieces[name] for c in rank.clients}
    return rank.gather(values, like=like, what=f"{name} of every client")[rank.training].mean(dim=0)
