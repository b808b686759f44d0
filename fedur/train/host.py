"""What one process holds: the clients placed on it, and what it needs to run them.

A process (a Fabric rank) holds one frozen backbone (in the tuner), the data, and the state of each client it
hosts (none on a spare rank, when there are more ranks than clients): it is their `Host`. Clients are run in
units: one client, or a group of run.clients_per_step consecutive client ids, whose images go through the
method's grouped forward together (fedur/methods/forward.py), in training (fedur/train/local.py) as in
pseudo-labelling and evaluation (`predict`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from lightning import Fabric
from torch import Tensor

from fedur.data.images import ImageDataset
from fedur.data.loaders import ImageLoader, in_batches
from fedur.federated.client import ClientState
from fedur.federated.collectives import Collectives
from fedur.methods import forward
from fedur.methods.base import ClientData, Method
from fedur.model.classifier import PromptedCLIP
from fedur.train.memory import MemoryEstimate
from fedur.train.module import PromptTuner
from fedur.train.progress import QUIET, Progress

UNLABELLED = -1  # the label `predict` gives an image of a split without labels

# `predict`'s `also`: called with (the client, its (b, C) logits of a batch on the device, their image features (b, D)
# where the method's logits are the base's (else None), the images' positions among the client's own, their labels)
Also = Callable[[ClientState, Tensor, "Tensor | None", Tensor, Tensor], None]


@dataclass(frozen=True)
class LocalWork:
    """How the clients' local passes run (plain values from the config)."""

    batch_size: int  # local training
    eval_batch_size: int  # pseudo-labelling and evaluation
    seed: int  # run.seed: every client's data order derives from it
    log_every_n_steps: int = 0  # print the training loss every n optimizer steps (0: never)
    clients_per_step: int = 1  # clients of a group run in one batch (fixed groups of consecutive ids)


@dataclass(frozen=True)
class HeldOutSet:
    """Test images no client holds, that the server's model is tested on (fedur/data/held_out.py)."""

    name: str  # "novel", "domain:<name>"
    rows: np.ndarray  # rows of the test split
    labels: np.ndarray  # (n,) in the indexing of `model`'s classes
    model: PromptedCLIP  # the frozen model over the classes these images are classified among (PromptedCLIP.for_classes)


@dataclass
class Host:
    """One process of the job and the clients it hosts; every rank has one (a spare rank hosts no client)."""

    fabric: Fabric
    collectives: Collectives
    tuner: PromptTuner  # the frozen backbone, the method and the labeller, and the local optimisation
    clients: list[ClientState]  # the clients this rank hosts, in client-id order
    dataset: ImageDataset  # train / test splits (rows of the image cache)
    images: ImageLoader  # every pass over the rank's images, through one set of loader workers
    num_clients: int  # K, over all ranks
    work: LocalWork
    progress: Progress = QUIET  # rank 0's progress display; the others stay quiet
    start: dict[str, Tensor] = field(default_factory=dict)  # every declared piece's initial value (CPU): what clients begin with
    training: Tensor | None = None  # (K,) bool: the clients that take part in rounds (the others: evaluation.new_clients)
    test_owners: np.ndarray | None = None  # (n_test,) int64: the training client each test row is scored for in the
    # global protocol (the lowest id among the training clients holding it), -1 for a row none holds (setup.py)
    held_out: list[HeldOutSet] = field(default_factory=list)  # evaluation.base_to_novel's novel classes, a held-out domain
    secret_seed: int | None = None  # the run's secret seed, where it draws secret noise (fedur/train/fit.py)
    memory: MemoryEstimate | None = None  # rank 0's estimate of a unit's peak memory (run.memory_estimate), else None

    def __post_init__(self) -> None:
        if self.training is None:
            self.training = torch.ones(self.num_clients, dtype=torch.bool, device="cpu")

    @property
    def new_clients(self) -> list[int]:
        """The ids of the clients held out of every round (evaluation.new_clients), over all ranks."""
        return torch.nonzero(~self.training).flatten().tolist()

    @property
    def model(self) -> PromptedCLIP:
        return self.tuner.model

    @property
    def method(self) -> Method:
        return self.tuner.method

    @property
    def global_rows(self) -> np.ndarray:
        """The test rows the server's model is tested on: the training clients' test images together, sorted."""
        return np.flatnonzero(self.test_owners >= 0)

    @property
    def client_data(self) -> ClientData:
        """What the method's hooks may read of the clients beyond a batch (methods.base.ClientData)."""
        return ClientData(self.model, self.train_features, self.secret_seed)

    def units(self, clients: list[ClientState] | None = None) -> list[list[ClientState]]:
        """`clients` (default: every hosted one) in their units: groups of run.clients_per_step consecutive
        client ids (placed whole on one rank), each in client-id order."""
        clients = self.clients if clients is None else clients
        size = self.work.clients_per_step
        groups: dict[int, list[ClientState]] = {}
        for client in clients:
            groups.setdefault(client.client_id // size, []).append(client)
        return [groups[g] for g in sorted(groups)]

    def gather(self, values: dict[int, Tensor], like: Tensor, what: str) -> Tensor:
        """(K, *like.shape): row k is client k's value, from whichever rank hosts it. Every rank calls this."""
        return self.collectives.gather_clients(values, self.num_clients, like=like, what=what)

    @torch.no_grad()
    def predict(
        self, split: Literal["train", "test"], zero_shot: bool = False, desc: str | None = None,
        clients: list[ClientState] | None = None, also: Also | None = None,
    ) -> dict[int, tuple[Tensor, Tensor]]:
        """Each hosted client's (logits (n_k, C) float32 on CPU, true labels (n_k,), UNLABELLED (-1) where the split
        has none: the train split never has, fedur/train/setup.py) over its own images of
        `split`: with its model (the method's logits with the client's pieces), or as zero-shot CLIP. A unit
        of several clients goes through the loader and the grouped forward together. With `desc`, rank 0
        shows the progress over units and batches. `clients`: only these of the hosted ones (default: every one).
        `also`: called with every client's part of every batch (fedur/train/evaluate.py scores the server's model
        on the same image features)."""
        out = {}
        units = self.units(clients) if desc is None else self.progress.iterate(self.units(clients), desc)
        for unit in units:
            out.update(self._predict_unit(unit, split, zero_shot, desc is not None, also))
        return out

    def _predict_unit(self, unit: list[ClientState], split: str, zero_shot: bool, show: bool,
                      also: Also | None) -> dict[int, tuple[Tensor, Tensor]]:
        indices = [c.train_indices if split == "train" else c.test_indices for c in unit]
        sizes = torch.tensor([len(i) for i in indices], device="cpu")
        owners = torch.repeat_interleave(torch.arange(len(unit), device="cpu"), sizes)  # (n,) the unit's client of each image
        positions = torch.cat([torch.arange(len(i), device="cpu") for i in indices])  # (n,) its position among its client's
        rows = np.concatenate(indices)
        data = getattr(self.dataset, split)
        true = torch.from_numpy(data.labels[rows]) if data.labelled else torch.full((len(rows),), UNLABELLED, device="cpu")
        plan = in_batches(np.arange(len(rows)), self.work.eval_batch_size)  # positions in the unit's pass
        batches = zip(self.images.batches(split, [rows[b] for b in plan]), plan)
        if show:
            who = f"client {unit[0].client_id}" if len(unit) == 1 else f"clients {unit[0].client_id}-{unit[-1].client_id}"
            batches = self.progress.iterate(batches, f"{who} batches", total=len(plan))
        model, method, device = self.model, self.method, self.fabric.device
        on_device = [c.on(device) for c in unit]  # the clients' pieces and method state, moved once per pass
        features_first = also is not None and not zero_shot and forward.default_logits(method)
        logits: list[list[Tensor]] = [[] for _ in unit]
        labels: list[list[Tensor]] = [[] for _ in unit]
        with self.fabric.autocast():
            texts = [None] * len(unit) if zero_shot else forward.text_sides(method, model, [c.pieces for c in on_device])
            for images, batch in batches:
                images = self.fabric.to_device(images)
                present, counts = torch.unique_consecutive(owners[batch], return_counts=True)
                k, counts = present.tolist(), counts.tolist()
                features = None
                if zero_shot:  # the same frozen classifier for every client
                    parts = model.logits(model.image_features(images, prompted=False), model.zero_shot_text).split(counts)
                elif features_first:  # the base's logits: the features kept for `also`
                    features = forward.group_features(model, list(images.split(counts)), [on_device[i].pieces for i in k])
                    parts = forward.scores(model, features, [texts[i] for i in k], counts)
                    features = features.split(counts)
                else:
                    batch_rows = self.fabric.to_device(positions[batch]).split(counts) if split == "train" else [None] * len(k)
                    parts = forward.group_logits(method, model, list(images.split(counts)), [on_device[i].pieces for i in k],
                                                 [texts[i] for i in k], [on_device[i] for i in k], list(batch_rows))
                own = positions[batch].split(counts)  # each present client's images: their positions among its own
                for j, (i, part, part_labels) in enumerate(zip(k, parts, true[batch].split(counts))):
                    if also is not None:
                        also(unit[i], part, None if features is None else features[j], own[j], part_labels)
                    logits[i].append(part.float().cpu())  # device-to-host copy per batch
                    labels[i].append(part_labels)
        num_classes = model.num_classes
        return {
            c.client_id: (torch.cat(logits[i]) if logits[i] else torch.zeros(0, num_classes, device="cpu"),
                          torch.cat(labels[i]) if labels[i] else torch.zeros(0, dtype=torch.long, device="cpu"))
            for i, c in enumerate(unit)
        }

    @torch.no_grad()
    def train_features(self, client: ClientState, positions: np.ndarray | None = None) -> Tensor:
        """(n, D) frozen CLIP image features (no prompts) of the client's train images at `positions` (None:
        all), float32 on CPU (what `client_data` reads)."""
        indices = client.train_indices if positions is None else client.train_indices[positions]
        features = []
        with self.fabric.autocast():
            for images in self.images.batches("train", in_batches(indices, self.work.eval_batch_size)):
                features.append(self.model.image_features(self.fabric.to_device(images), prompted=False).float().cpu())
        return torch.cat(features) if features else torch.zeros(0, self.model.zero_shot_text.shape[-1], device="cpu")
