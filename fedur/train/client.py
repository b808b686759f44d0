"""A client's own state and its local training round."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.streams import client_generator
from fedur.labels.base import PseudoLabels
from fedur.train.checkpoint import CheckpointError

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class ClientState:
    """Everything that belongs to one client. After aggregation a shared prompt is the same tensor for
    every client; nothing is ever modified in place, so clients cannot affect each other."""

    client_id: int
    train_indices: np.ndarray  # into the dataset's train split
    test_indices: np.ndarray  # into the dataset's test split
    prompts: dict[str, Tensor]  # the method's prompts it uses, by name ("visual", "text_ctx", ...): the global
    # aggregate for the shared ones, its own for the others
    optimizer_state: dict | None = None  # SGD momentum, kept across rounds only with optim.optimizer_state=client
    pseudo_labels: PseudoLabels | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # the method's per-client state (pFedPrompt's cache)

    # A client's random streams are a pure function of (run.seed, client_id, round) (federated/streams.py):
    # the round counter in the checkpoint is all they need.
    def state_dict(self) -> dict:
        labels = self.pseudo_labels
        return {
            "client_id": self.client_id,
            "train_indices": torch.from_numpy(self.train_indices),
            "test_indices": torch.from_numpy(self.test_indices),
            "prompts": {name: t.cpu() for name, t in self.prompts.items()},
            "optimizer_state": self.optimizer_state,
            "pseudo_labels": None if labels is None else vars(labels),
            "extra": {name: t.cpu() for name, t in self.extra.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint; the data split must be the one the checkpoint was made with."""
        for name in ("train_indices", "test_indices"):
            if not np.array_equal(state[name].numpy(), getattr(self, name)):
                raise CheckpointError(
                    f"client {self.client_id}: its {name} differ from the checkpoint's; the dataset or its "
                    "split changed since the run started (data.root contents, fractions, partition)"
                )
        if set(state["prompts"]) != set(self.prompts):
            raise CheckpointError(
                f"client {self.client_id}: the checkpoint holds prompts {sorted(state['prompts'])}, this method "
                f"{sorted(self.prompts)}; method.name or method.share changed since the run started"
            )
        self.prompts = {name: t.to(self.prompts[name].device) for name, t in state["prompts"].items()}
        self.optimizer_state = momentum_only(state["optimizer_state"])
        labels = state["pseudo_labels"]
        self.pseudo_labels = None if labels is None else PseudoLabels(**labels)
        self.extra = dict(state["extra"])


def momentum_only(optimizer_state: dict | None) -> dict | None:
    """The per-parameter SGD state of a saved optimizer state (checkpoints before fedur 0.2 hold the whole
    `optimizer.state_dict()`; its param_groups are the schedule's, not the client's)."""
    if optimizer_state is not None and "param_groups" in optimizer_state:
        return optimizer_state["state"]
    return optimizer_state


@dataclass
class LocalResult:
    loss: float  # means over the round's optimizer steps
    loss_pos: float
    loss_neg: float
    lr: float  # the learning rate of the round's first local epoch
    optimizer_state: dict  # the SGD state (momentum) after the round


def client_loader(rank: "Rank", client: ClientState, round_idx: int):
    """The client's selected pseudo-labelled images in this round's order (its own stream)."""
    work, labels = rank.work, client.pseudo_labels
    selected = client.train_indices[labels.indices.numpy()]
    data = ClientImages(rank.dataset.train, selected, rank.transform, (labels.labels, labels.mask))
    return make_loader(
        data, work.batch_size, work.num_workers, generator=client_generator(work.seed, client.client_id, round_idx),
        pin_memory=rank.fabric.device.type == "cuda",
    )


def client_optimizer(rank: "Rank", round_idx: int, optimizer_state: dict | None, params: list[Tensor] | None = None):
    """SGD and its schedule for one client-round, from `optimizer_state` (its momentum; None: fresh)."""
    optimization = rank.tuner.configure_optimizers(round_idx, params)
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    if optimizer_state is not None:  # the momentum only: the learning rate is the schedule's
        optimizer.load_state_dict({"state": optimizer_state, "param_groups": optimizer.state_dict()["param_groups"]})
    return optimizer, scheduler


def train_client(rank: "Rank", client: ClientState, round_idx: int, optimizer_state: dict | None) -> LocalResult:
    """Train the client's prompts for the tuner's local epochs on its selected pseudo-labels, in place.

    The client starts from the prompts it holds (after aggregation: the global ones for what is
    shared) and from `optimizer_state` (SGD momentum; None: fresh), and keeps what it learned; the round
    loop decides what is uploaded.
    """
    fabric, tuner, work, progress = rank.fabric, rank.tuner, rank.work, rank.progress
    tuner.begin(client)
    optimizer, scheduler = client_optimizer(rank, round_idx, optimizer_state)
    loader = client_loader(rank, client, round_idx)
    lr = scheduler.get_last_lr()[0]
    sums = torch.zeros(3, device=fabric.device)  # loss, loss_pos, loss_neg: summed on device, read once
    steps = 0
    for _ in progress.iterate(range(tuner.local_epochs), f"client {client.client_id} epochs"):
        for batch in loader:
            batch = fabric.to_device(batch)
            with fabric.autocast():
                out = tuner.training_step(batch, steps)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(out["loss"])
            optimizer.step()
            sums += torch.stack([out["loss"].detach(), out["loss_pos"], out["loss_neg"]]).float()
            steps += 1
            if work.log_every_n_steps and steps % work.log_every_n_steps == 0:
                progress.write(f"  client {client.client_id} step {steps} loss {out['loss'].item():.4f}")  # every rank
        if steps:  # a client without selected samples takes no step
            scheduler.step()
    client.prompts = tuner.prompts()
    means = (sums / max(steps, 1)).tolist()  # device-to-host sync, once per client-round
    return LocalResult(*means, lr=lr, optimizer_state=copy.deepcopy(optimizer.state_dict()["state"]))


def train_group(rank: "Rank", clients: list[ClientState], round_idx: int, optimizer_states: list[dict | None]) -> list[LocalResult]:
    """Train several clients together (run.clients_per_step), as `train_client` trains each, in place.

    At every step each client that still has a batch in the epoch contributes its next one (its own data
    order); the batches go through one forward, each image with its client's prompts, and the step
    backpropagates the sum of the clients' own losses, so each client's prompts get their own gradient.
    Each client has its own SGD (momentum) and schedule and steps only when it had a batch. The same as
    training them one after the other, up to float rounding.
    """
    fabric, tuner, work, progress = rank.fabric, rank.tuner, rank.work, rank.progress
    names = list(tuner.model.trainable_slots())  # the optimizer's order, as for one client
    device = fabric.device
    prompts = [{n: t.to(device) for n, t in c.prompts.items()} for c in clients]
    for p in prompts:  # the trained prompts become this step's own leaves, in the optimizer's order
        p.update({n: p[n].detach().clone().requires_grad_(True) for n in names})
    optimizers = [client_optimizer(rank, round_idx, state, [p[n] for n in names]) for p, state in zip(prompts, optimizer_states)]
    loaders = [client_loader(rank, c, round_idx) for c in clients]
    lrs = [scheduler.get_last_lr()[0] for _, scheduler in optimizers]
    sums = torch.zeros(len(clients), 3, device=device)
    steps = [0] * len(clients)
    ids = ", ".join(str(c.client_id) for c in clients)
    for _ in progress.iterate(range(tuner.local_epochs), f"clients {ids} epochs"):
        iterators = {k: iter(loader) for k, loader in enumerate(loaders)}
        while True:
            batches = {k: b for k, b in ((k, next(it, None)) for k, it in iterators.items()) if b is not None}
            if not batches:
                break
            iterators = {k: iterators[k] for k in batches}
            order = sorted(batches)
            with fabric.autocast():
                outs = tuner.group_step([fabric.to_device(batches[k]) for k in order], [prompts[k] for k in order],
                                        [clients[k].prompts for k in order])
            for k in order:
                optimizers[k][0].zero_grad(set_to_none=True)
            fabric.backward(torch.stack([out["loss"] for out in outs]).sum())
            for k, out in zip(order, outs):
                optimizers[k][0].step()
                sums[k] += torch.stack([out["loss"].detach(), out["loss_pos"], out["loss_neg"]]).float()
                steps[k] += 1
            if work.log_every_n_steps and max(steps) % work.log_every_n_steps == 0:
                progress.write(f"  clients {ids} step {max(steps)} loss {sum(o['loss'].item() for o in outs):.4f}")
        for k, (_, scheduler) in enumerate(optimizers):
            if steps[k]:
                scheduler.step()
    results = []
    for k, client in enumerate(clients):
        client.prompts = {n: t.detach().clone() for n, t in prompts[k].items()}
        means = (sums[k] / max(steps[k], 1)).tolist()
        state = copy.deepcopy(optimizers[k][0].state_dict()["state"])
        results.append(LocalResult(*means, lr=lrs[k], optimizer_state=state))
    return results
