"""Local training: the one path every client takes. A client alone is a group of one; with
run.clients_per_step = G, the clients of a group train in the same steps, each with its own data order,
loss, SGD momentum and schedule (fedur/train/module.py forms their logits)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.client import ClientState
from fedur.federated.streams import client_generator

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class LocalResult:
    loss: float  # means over the round's optimizer steps
    loss_pos: float
    loss_neg: float
    lr: float  # the learning rate of the round's first local epoch
    optimizer_state: dict  # the SGD state (momentum) after the round


def client_loader(rank: Rank, client: ClientState, round_idx: int):
    """The client's selected pseudo-labelled images in this round's order (its own stream)."""
    work, labels = rank.work, client.pseudo_labels
    selected = client.train_indices[labels.indices.numpy()]
    data = ClientImages(rank.dataset.train, selected, rank.transform, (labels.labels, labels.mask))
    return make_loader(
        data, work.batch_size, work.num_workers, generator=client_generator(work.seed, client.client_id, round_idx),
        pin_memory=rank.fabric.device.type == "cuda",
    )


def client_optimizer(rank: Rank, round_idx: int, optimizer_state: dict | None, params: list[Tensor]):
    """SGD and its schedule for one client-round over `params`, from `optimizer_state` (its momentum; None: fresh)."""
    optimization = rank.tuner.configure_optimizers(round_idx, params)
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    if optimizer_state is not None:  # the momentum only: the learning rate is the schedule's
        optimizer.load_state_dict({"state": optimizer_state, "param_groups": optimizer.state_dict()["param_groups"]})
    return optimizer, scheduler


def train_unit(rank: Rank, clients: list[ClientState], round_idx: int, optimizer_states: list[dict | None]) -> list[LocalResult]:
    """Train the clients of one unit (a client alone, or a group of run.clients_per_step) for the tuner's local
    epochs on their selected pseudo-labels, in place.

    Each client starts from the prompts it holds (after aggregation: the global ones for what is shared)
    and from its `optimizer_states` entry (SGD momentum; None: fresh), and keeps what it learned; the round
    loop decides what is uploaded. At every step each client that still has a batch in the epoch contributes
    its next one (its own data order); the batches go through the method's grouped forward, and the step
    backpropagates the sum of the clients' own losses, so each client's prompts get their own gradient. Each
    client has its own SGD and schedule and steps only when it had a batch.
    """
    fabric, tuner, work, progress = rank.fabric, rank.tuner, rank.work, rank.progress
    names = tuner.trained_names()  # the optimizer's order
    device = fabric.device
    prompts = [{n: t.to(device) for n, t in c.prompts.items()} for c in clients]
    for p in prompts:  # the trained prompts become this round's own leaves
        p.update({n: p[n].detach().clone().requires_grad_(True) for n in names})
    optimizers = [client_optimizer(rank, round_idx, state, [p[n] for n in names]) for p, state in zip(prompts, optimizer_states)]
    loaders = [client_loader(rank, c, round_idx) for c in clients]
    lrs = [scheduler.get_last_lr()[0] for _, scheduler in optimizers]
    sums = torch.zeros(len(clients), 3, device=device)  # loss, loss_pos, loss_neg: summed on device, read once
    steps = [0] * len(clients)
    who = f"client {clients[0].client_id}" if len(clients) == 1 else f"clients {', '.join(str(c.client_id) for c in clients)}"
    for _ in progress.iterate(range(tuner.optim.local_epochs), f"{who} epochs"):
        iterators = {k: iter(loader) for k, loader in enumerate(loaders)}
        while True:
            batches = {k: b for k, b in ((k, next(it, None)) for k, it in iterators.items()) if b is not None}
            if not batches:
                break
            iterators = {k: iterators[k] for k in batches}
            order = sorted(batches)
            with fabric.autocast():
                outs = tuner.training_step([fabric.to_device(batches[k]) for k in order], [prompts[k] for k in order],
                                           [clients[k] for k in order])
            for k in order:
                optimizers[k][0].zero_grad(set_to_none=True)
            fabric.backward(torch.stack([out["loss"] for out in outs]).sum())
            for k, out in zip(order, outs):
                optimizers[k][0].step()
                sums[k] += torch.stack([out["loss"].detach(), out["loss_pos"], out["loss_neg"]]).float()
                steps[k] += 1
            if work.log_every_n_steps and max(steps) % work.log_every_n_steps == 0:
                loss = sum(o["loss"].item() for o in outs)  # device-to-host sync, only when asked for
                progress.write(f"  {who} step {max(steps)} loss {loss:.4f}")  # every rank
        for k, (_, scheduler) in enumerate(optimizers):
            if steps[k]:  # a client without selected samples takes no step
                scheduler.step()
    results = []
    for k, client in enumerate(clients):
        client.prompts = {n: t.detach().cpu().clone() for n, t in prompts[k].items()}  # as everything the server sees
        means = (sums[k] / max(steps[k], 1)).tolist()  # device-to-host sync, once per client-round
        state = copy.deepcopy(optimizers[k][0].state_dict()["state"])
        results.append(LocalResult(*means, lr=lrs[k], optimizer_state=state))
    return results
