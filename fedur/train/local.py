"""Local training: the one path every client takes. A client alone is a group of one; with
run.clients_per_step = G, the clients of a group train in the same steps, each with its own data order,
loss, SGD momentum and schedule (fedur/train/module.py forms their logits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.data.loaders import epoch_order, in_batches
from fedur.federated.client import ClientState, to_cpu
from fedur.federated.streams import client_generator
from fedur.labels.base import PseudoLabels
from fedur.methods.base import LocalRound, LocalStep
from fedur.model.frozen import FrozenImages
from fedur.model.precision import ieee_float32_matmuls
from fedur.train import faults

if TYPE_CHECKING:
    from fedur.train.host import Host
    from fedur.train.module import Optimization


@dataclass
class LocalResult:
    loss: float  # means over the round's optimizer steps
    loss_pos: float
    loss_neg: float
    lr: float  # the learning rate of the round's first local epoch
    optimizer_state: dict  # the SGD state (momentum) after the round
    local: LocalRound  # what the method's upload sees of the round: the start, the steps, their learning rates


def epoch_plan(clients: list[ClientState], generators: list[torch.Generator], batch_size: int) -> list[list[tuple[int, Tensor]]]:
    """The steps of one local epoch of a unit: at each step, (k, positions) for every client k that still has a
    batch, its next batch of positions into its selected pseudo-labels, in the order its own stream drew."""
    batches = [in_batches(epoch_order(len(c.pseudo_labels.labels), g), batch_size) for c, g in zip(clients, generators)]
    steps = max((len(b) for b in batches), default=0)
    return [[(k, torch.from_numpy(b[s])) for k, b in enumerate(batches) if s < len(b)] for s in range(steps)]


def client_optimizer(host: Host, round_idx: int, optimizer_state: dict | None, params: list[Tensor], optim: Optimization,
                     lr_scales: list[float] | None = None):
    """SGD and its schedule for one client-round over `params` (`lr_scales`: each one's multiple of the learning rate),
    from `optimizer_state` (its momentum; None: fresh)."""
    optimization = host.tuner.configure_optimizers(params, round_idx, optim, lr_scales)
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    if optimizer_state is not None:  # the momentum only: the learning rate is the schedule's
        optimizer.load_state_dict({"state": optimizer_state, "param_groups": optimizer.state_dict()["param_groups"]})
    return optimizer, scheduler


def train_unit(host: Host, clients: list[ClientState], round_idx: int, optimizer_states: list[dict | None],
               optim: Optimization, class_weights: Tensor | None, limits: list[int | None] | None = None) -> list[LocalResult]:
    """Train the clients of one unit (a client alone, or a group of run.clients_per_step) for `optim`'s local
    epochs on their selected pseudo-labels, in place; `class_weights`: (C,) of the cross-entropy (None: unweighted).

    Each client starts from the pieces it holds (after aggregation: the global ones for what is shared)
    and from its `optimizer_states` entry (SGD momentum; None: fresh), and keeps what it learned; the round
    loop decides what is uploaded. At every step each client that still has a batch in the epoch contributes
    its next one (its own data order); the batches go through the method's grouped forward, and the step
    backpropagates the sum of the clients' own losses, so each client's pieces get their own gradient. Each
    client has its own SGD and schedule and steps only when it had a batch; the method's before_step and
    after_step see each step. `limits`: each client's most local steps (None: all; clock.late partial: a late
    client stops where the deadline cuts it, its data order and schedule as if it went on).
    """
    host.model.train()  # what the method's hooks see as a training step (`model.training`)
    try:
        return _train_unit(host, clients, round_idx, optimizer_states, optim, class_weights, limits or [None] * len(clients))
    finally:
        host.model.eval()


def _train_unit(host: Host, clients: list[ClientState], round_idx: int, optimizer_states: list[dict | None],
                optim: Optimization, class_weights: Tensor | None, limits: list[int | None]) -> list[LocalResult]:
    fabric, tuner, work, progress, method = host.fabric, host.tuner, host.work, host.progress, host.method
    device = fabric.device
    weights = None if class_weights is None else class_weights.to(device)
    starts = [c.pieces for c in clients]  # on the CPU: what the round began with (the method's upload sees it)
    names = tuple(tuner.trained_names(clients[0].pieces))  # the optimizer's order
    on_device = [c.on(device) for c in clients]  # the round's start, and the method's state, moved once
    pieces = [{n: t.detach().clone().requires_grad_(n in names) for n, t in c.pieces.items()} for c in on_device]
    declared = method.pieces()
    scales = [declared[n].lr_scale for n in names]
    optimizers = [client_optimizer(host, round_idx, state, [p[n] for n in names], optim, scales)
                  for p, state in zip(pieces, optimizer_states)]
    generators = [client_generator(work.seed, c.client_id, round_idx) for c in clients]  # each its own data order
    selected = [c.train_indices[c.pseudo_labels.indices.numpy()] for c in clients]  # rows of the train split
    lrs = [scheduler.get_last_lr()[0] for _, scheduler in optimizers]
    sums = torch.zeros(len(clients), 3, device=device)  # loss, loss_pos, loss_neg: summed on device, read once
    steps, lr_sums = [0] * len(clients), [0.0] * len(clients)
    who = f"client {clients[0].client_id}" if len(clients) == 1 else f"clients {', '.join(str(c.client_id) for c in clients)}"
    for epoch in progress.iterate(range(optim.local_epochs), f"{who} epochs"):
        plan = within_limits(epoch_plan(clients, generators, work.batch_size), steps, limits)
        images = iter(host.batches("train", [selected[k][b.numpy()] for step in plan for k, b in step]))  # or cached rows
        for step in plan:
            order = [k for k, _ in step]
            batches = [fabric.to_device(batch_of(clients[k].pseudo_labels, b, next(images))) for k, b in step]
            with fabric.autocast():
                outs = tuner.training_step(batches, [pieces[k] for k in order], [on_device[k] for k in order], weights)
            for k in order:
                optimizers[k][0].zero_grad(set_to_none=True)
            with ieee_float32_matmuls():  # the float32 sections' gradients in float32 too (bf16 ones stay bf16)
                fabric.backward(torch.stack([out["loss"] for out in outs]).sum())
            for k, out in zip(order, outs):
                optimizer = optimizers[k][0]
                lr = optimizer.param_groups[0]["lr"]  # a number: the schedule's, as SGD applies it
                step = LocalStep(on_device[k], pieces[k], names, steps[k], epoch, lr, optimizer, round_idx)
                method.before_step(step)
                optimizer.step()
                method.after_step(step)
                sums[k] += torch.stack([out["loss"].detach(), out["loss_pos"], out["loss_neg"]]).float()
                steps[k] += 1
                lr_sums[k] += lr
            if work.log_every_n_steps and max(steps) % work.log_every_n_steps == 0:
                loss = sum(o["loss"].item() for o in outs)  # device-to-host sync, only when asked for
                progress.write(f"  {who} step {max(steps)} loss {loss:.4f}")  # every rank
        for k, (_, scheduler) in enumerate(optimizers):
            if steps[k]:  # a client without selected samples takes no step
                scheduler.step()
    results = []
    for k, client in enumerate(clients):
        client.pieces = {n: t.detach().cpu().clone() for n, t in pieces[k].items()}  # as everything the server sees
        means = (sums[k] / max(steps[k], 1)).tolist()  # device-to-host sync, once per client-round
        state = to_cpu(optimizers[k][0].state_dict()["state"])  # momentum kept between rounds, on the CPU like the rest
        results.append(LocalResult(*means, lr=lrs[k], optimizer_state=state, local=LocalRound(starts[k], steps[k], lr_sums[k])))
    faults.point("train", round_idx, fabric.global_rank)  # a test's fault: after the rank's first unit of the round
    return results


def within_limits(plan: list[list[tuple[int, Tensor]]], taken: list[int], limits: list[int | None]) -> list[list[tuple[int, Tensor]]]:
    """An epoch's plan with each client's batches beyond its limit of steps left out (`taken`: the steps each took in
    the round's earlier epochs; a limit None: no limit); steps left with no client are dropped."""
    if all(limit is None for limit in limits):
        return plan
    count, out = list(taken), []
    for step in plan:
        kept = [(k, b) for k, b in step if limits[k] is None or count[k] < limits[k]]
        for k, _ in kept:
            count[k] += 1
        if kept:
            out.append(kept)
    return out


def batch_of(labels: PseudoLabels, positions: Tensor,
             images: Tensor | FrozenImages) -> tuple[Tensor | FrozenImages, Tensor, Tensor, Tensor]:
    """A training batch of a client: its images (or their rows of the frozen-feature cache), their pseudo-labels
    (B,), the labeller's class mask (B, C) and their rows (B,): positions in the client's train images."""
    return images, labels.labels[positions], labels.mask[positions], labels.indices[positions]
