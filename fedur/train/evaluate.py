"""Batched inference, and what evaluation reports: every client's accuracy on its own test set (the personal
protocol), and the server's model on the training clients' test images together (the global protocol,
docs/protocols.md) and on held-out sets, at one image-tower pass per test image wherever the models' image
features are the same (`evaluate_round`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning import Fabric
from torch import Tensor
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import multiclass_confusion_matrix

from fedur.data.loaders import in_batches
from fedur.evaluation.calibration import calibration_bins
from fedur.federated.client import ClientState
from fedur.methods import forward
from fedur.methods.base import GlobalModel, GlobalView
from fedur.train.label_free import LabelFree, Seen, round_label_free

if TYPE_CHECKING:
    from fedur.methods.base import Method
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.host import HeldOutSet, Host
    from fedur.train.server import ServerState


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


@dataclass
class Evaluation:
    """What a round's evaluation knows, the same on every rank."""

    accuracy: Tensor  # (K, 2) [correct, total] of every client on its own test set with its own model
    confusion: Tensor | None  # (K, C, C) the clients' confusion matrices (asked for: the last round), else None
    global_counts: Tensor | None  # (2,) the server's model on the training clients' test images together (None: none)
    held_out: dict[str, Tensor | None]  # {held-out set: (2,) the server's model on it (None: no server model)}
    label_free: LabelFree | None = None  # the estimates without labels and the calibration (fedur/train/label_free.py)


def evaluate_round(host: Host, server: ServerState, with_confusion: bool = False, global_model: bool = True,
                   round_idx: int = 0) -> Evaluation:
    """Every client on its own test set (the personal protocol; new clients as they arrive too), the server's model
    (Method.global_model) on the training clients' test images together (`global_model`: the global protocol), and
    on each held-out set. Every rank calls this.

    One image-tower pass per test image: where the server's model scores the same image features as every training
    client's model (the base's logits with an equal visual prompt, so that only the text sides differ; or the
    client's very model), its counts come from the personal pass, each test image scored once, for the lowest-id
    training client that holds it (`Host.test_owners`). Otherwise, and on the held-out sets (images no client holds),
    the server's model has a pass of its own (`evaluate_global`).

    Beside them, the label-free estimates of round `round_idx` (fedur/train/label_free.py) from the logits these
    passes computed, or from a pass over the validation images where the clients have a validation split."""
    server_model = ready(host, global_model_of(host, server, host.model), host.model) if global_model else None
    shares = server_model is not None and shares_pass(host, server_model)
    seen = Seen(server={} if shares else None)
    accuracy, confusion, counts = evaluate_clients(host, with_confusion=with_confusion,
                                                   server_model=server_model if shares else None, seen=seen)
    if server_model is not None and not shares:
        counts = evaluate_global(host, server_model, bins=seen.server_bins)
    held = {}
    for h in host.held_out:
        model = ready(host, global_model_of(host, server, h.model), h.model)
        held[h.name] = None if model is None else evaluate_global(host, model, h)
    as_model = None if server_model is None else (server_model.client, server_model.text)
    labelled = host.dataset.test.labelled
    label_free = round_label_free(host, seen, as_model, None if server_model is None else server_model.held, round_idx,
                                  host.label_free, labelled)
    if server_model is not None and labelled:
        label_free.server_bins = seen.server_bins if not shares else \
            host.collectives.gather_ranks(seen.server_bins, what="the server's calibration").sum(dim=0)
    return Evaluation(accuracy, confusion, None if server_model is None else counts, held, label_free)


def evaluate_zero_shot(host: Host, seen: Seen | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """(K, 2) every client's counts with zero-shot CLIP on its own test set (their pool is the zero-shot global
    figure: the model is one), and zero-shot CLIP on each held-out set; `seen`: where the test logits are kept for the
    label-free estimates. Every rank calls this."""
    return evaluate_clients(host, zero_shot=True, seen=seen)[0], {h.name: evaluate_global(host, None, h) for h in host.held_out}


def evaluate_clients(host: Host, zero_shot: bool = False, with_confusion: bool = False,
                     clients: list[ClientState] | None = None, server_model: ServerModel | None = None,
                     seen: Seen | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(K, 2) [correct, total] of every client on its own test set with its model (the method's logits with
    the client's prompts), or as zero-shot CLIP; with `with_confusion` the clients' (K, C, C) confusion matrices
    from the same pass (else None); with `server_model` (one that shares the pass, `shares_pass`) its (2,) counts on
    the training clients' test images together, from the same pass (else None). Without test labels every count is
    0 (the accuracies are absent, None) and there is no confusion matrix. `clients`: only these of the rank's (the
    others' rows are zeros). `seen`: where each client's logits are kept (and the server's, where it shares the pass)
    for the label-free estimates and the calibration. Every rank calls this."""
    if not host.dataset.test.labelled:  # the same on every rank: nothing to exchange
        none = None if server_model is None else torch.zeros(2, dtype=torch.long, device="cpu")
        return torch.zeros(host.num_clients, 2, dtype=torch.long, device="cpu"), None, none
    scored = torch.zeros(2, dtype=torch.long, device="cpu")

    def score_server(client: ClientState, logits: Tensor, features: Tensor | None, positions: Tensor, truth: Tensor) -> None:
        """The server's model on the client's images of a batch that it owns: from the batch's image features
        with the server's text side, or (the client's very model) the client's logits."""
        owned = torch.from_numpy(host.test_owners[client.test_indices[positions.numpy()]] == client.client_id)
        if not bool(owned.any()) and seen is None:
            return
        if features is not None:
            logits = server_model.model.logits(features, server_model.text)
        logits = logits.float().cpu()
        if seen is not None:  # every image of the client: the server's estimates and accuracy per client
            seen.add_server(client.client_id, logits, truth)
            seen.server_bins += calibration_bins(logits[owned], truth[owned])
        predicted = logits.argmax(dim=-1)[owned]
        scored.add_(torch.stack([(predicted == truth[owned]).sum(), torch.tensor(len(predicted), device="cpu")]))

    predictions = host.predict("test", zero_shot, clients=clients, also=None if server_model is None else score_server)
    if seen is not None:
        seen.personal = predictions
    confusions = {k: confusion_matrix(logits, labels) for k, (logits, labels) in predictions.items()}
    counts = {k: correct_and_total(matrix) for k, matrix in confusions.items()}
    accuracy = host.gather(counts, like=torch.zeros(2, dtype=torch.long, device="cpu"), what="test accuracy counts")
    pooled = None if server_model is None else host.collectives.gather_ranks(scored, what="global accuracy counts").sum(dim=0)
    if not with_confusion:
        return accuracy, None, pooled
    num_classes = host.model.num_classes
    like = torch.zeros(num_classes, num_classes, dtype=torch.long, device="cpu")
    return accuracy, host.gather(confusions, like=like, what="confusion matrices"), pooled


@dataclass
class ServerModel:
    """The server's model ready to score on a device: `held` as the method gave it (on the CPU), `client` the same as
    a client that holds no data (on the device), its text side, and the frozen model over its classes."""

    model: PromptedCLIP
    held: GlobalModel
    client: ClientState
    text: Any


def global_model_of(host: Host, server: ServerState, model: PromptedCLIP) -> GlobalModel | None:
    """The method's server model (Method.global_model, from the global pieces and its server state) over `model`'s
    classes; None where the method has none. Every rank calls this (the view's client means are collectives)."""
    view = GlobalView(dict(server.shared), dict(server.method), host.start, lambda name: client_mean(host, name),
                      other_classes=model is not host.model)
    return host.method.global_model(model, view)


def ready(host: Host, held: GlobalModel | None, model: PromptedCLIP) -> ServerModel | None:
    return None if held is None else prepared(host.fabric, host.method, model, held)


@torch.no_grad()
def prepared(fabric: Fabric, method: Method, model: PromptedCLIP, held: GlobalModel) -> ServerModel:
    """`held` on the device with its text side computed (the method's `text_side` of its pieces unless it gives one)."""
    empty = np.zeros(0, dtype=np.int64)
    client = ClientState(-1, empty, empty, dict(held.pieces), extra=dict(held.extra)).on(fabric.device)
    with fabric.autocast():
        text = method.text_side(model, client.pieces) if held.text is None else held.text
    return ServerModel(model, held, client, text)


def shares_pass(host: Host, server: ServerModel) -> bool:
    """Whether the server's model scores the same image features as every training client's model (the base's
    logits with an equal visual prompt: only the text side differs), or is the client's very model (equal pieces
    and method state, its text side from its pieces): then its counts come from the personal pass. Every rank
    agrees (one collective)."""
    method, held = host.method, server.held
    mine = forward.image_side(method, held.pieces)
    different = 0
    for client in host.clients:
        if not host.training[client.client_id]:
            continue
        theirs = forward.image_side(method, client.pieces)
        same_features = mine is not None and theirs is not None and equal(mine, theirs)
        same_model = held.text is None and equal_dicts(held.pieces, client.pieces) and equal_dicts(held.extra, client.extra)
        different |= not (same_features or same_model)
    return not host.collectives.max_over_ranks(int(different), what="the server's model shares the clients' pass")


def equal(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def equal_dicts(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(equal(a[name], b[name].to(a[name].device)) for name in a)


def evaluate_global(host: Host, server_model: ServerModel | None, held_out: HeldOutSet | None = None,
                    bins: Tensor | None = None) -> Tensor:
    """(2,) int64 [correct, total] of the server's model (`ready`) in a pass of its own, on the training clients'
    test images together (`host.global_rows`) or on a held-out set with its own classes; `server_model` None:
    zero-shot CLIP (the reference a held-out set's gain is read from). Without test labels: zeros.

    Every rank calls this. The batches are dealt to the ranks in turn (batch b to rank b mod world size) and
    the counts summed, so each rank does a share of the work and the counts do not depend on the placement. `bins`:
    (BINS, 3) calibration bins the pass adds to (summed over the ranks: integers, in any order the same)."""
    model = host.model if held_out is None else held_out.model
    fabric = host.fabric
    if not host.dataset.test.labelled:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    rows = host.global_rows if held_out is None else held_out.rows
    labels = host.dataset.test.labels[rows] if held_out is None else held_out.labels
    plan = in_batches(np.arange(len(rows)), host.work.eval_batch_size)[fabric.global_rank::fabric.world_size]
    batches = zip(host.batches("test", [rows[b] for b in plan], zero_shot=server_model is None),
                  (torch.from_numpy(labels[b]) for b in plan))
    mine = None if bins is None else torch.zeros_like(bins)
    counts = scored_counts(fabric, host.method, model, server_model, batches, mine)
    if bins is not None:
        bins += host.collectives.gather_ranks(mine, what="the server's calibration").sum(dim=0)
    return host.collectives.gather_ranks(counts, what="global accuracy counts").sum(dim=0)


@torch.no_grad()
def scored_counts(fabric: Fabric, method: Method, model: PromptedCLIP, server: ServerModel | None,
                  batches: Iterable[tuple[Tensor, Tensor]], bins: Tensor | None = None) -> Tensor:
    """(2,) int64 [correct, total] of the server's model `server` (a client that holds no data, scored with the
    method's `logits`; None: zero-shot CLIP) over (images, labels) batches: what the global protocols and
    fedur-cross-dataset count; `bins`: (BINS, 3) calibration bins added to in place."""
    counts = torch.zeros(2, dtype=torch.long, device="cpu")
    with fabric.autocast():
        for images, truth in batches:
            images = fabric.to_device(images)
            if server is None:
                logits = model.logits(model.image_features(images, prompted=False), model.zero_shot_text)
            else:
                logits = method.logits(model, images, server.client.pieces, server.text, server.client, None)
            counts += torch.stack([(logits.float().argmax(dim=-1).cpu() == truth).sum(), torch.tensor(len(truth), device="cpu")])
            if bins is not None:
                bins += calibration_bins(logits.float().cpu(), truth)
    return counts


def client_mean(host: Host, name: str) -> Tensor:
    """The plain mean over the training clients of piece `name` (CPU), in client-id order. Every rank calls this."""
    like = host.start[name]
    values = {c.client_id: c.pieces[name] for c in host.clients}
    return host.gather(values, like=like, what=f"{name} of every client")[host.training].mean(dim=0)
