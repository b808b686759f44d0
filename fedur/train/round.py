"""One federated round, as every rank runs it: refresh the pseudo-labels (every `refresh_every` rounds), draw who
takes part and their weights, train them, exchange with the server, evaluate; what it did is a RoundOutcome."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedur.channel import Channel, Drawn, wanted
from fedur.federated.divergence import drift_diversity, mean_pairwise_cosine_distance
from fedur.methods.base import LocalRound
from fedur.train.evaluate import evaluate_round
from fedur.train.host import Host
from fedur.train.local import train_unit
from fedur.train.module import Optimization
from fedur.train.refresh import Ask, refresh_pseudo_labels
from fedur.train.round_metrics import RoundOutcome
from fedur.train.server import exchange
from fedur.train.state import RunState

INT64_BYTES = 8


@dataclass(frozen=True)
class RoundPlan:
    """What every round of a run is run by (plain values, fixed for the run)."""

    rounds: int  # the method's number of rounds (Method.rounds of federation.rounds), or an asynchronous server's steps
    refresh_every: int  # federation.refresh_every
    join_rate: float  # federation.join_rate
    seed: int  # run.seed: who takes part, and every client's data order
    optim: Optimization  # the local optimisation (optim.*, federation.local_epochs)
    optimizer_state: str  # optim.optimizer_state: reset, client or shared
    global_model: bool  # evaluation.global_model
    train_sizes: Tensor  # (K,) every client's train images
    train_labels: np.ndarray | None  # every train row's true label, for the refresh's monitoring only (None: none)
    channel: Channel  # the one door for what clients send: draw, clock, adversary, noise, reducer (fedur/channel/)

    def refreshes(self, round_idx: int, labeller) -> bool:
        """Whether round `round_idx` (from 0) begins with a pseudo-label refresh."""
        return labeller is not None and round_idx % self.refresh_every == 0


def run_round(host: Host, state: RunState, round_idx: int, plan: RoundPlan) -> RoundOutcome:
    """Round `round_idx` (from 0): refresh -> draw -> train -> send -> aggregate -> evaluate. `state` and the hosted
    clients change in place. Every rank calls this."""
    method, labeller, channel = host.method, host.tuner.labeller, plan.channel
    clock = PhaseClock()
    refreshed = plan.refreshes(round_idx, labeller)
    if refreshed:
        ask = Ask(round_idx, round_idx // plan.refresh_every, zero_shot=round_idx == 0, n_total=len(host.dataset.train))
        state.refresh = refresh_pseudo_labels(host, labeller, channel, ask, plan.train_labels)
    clock.lap("refresh")

    drawn = take_part(host, state, round_idx, plan)  # who is asked, their weights, who will arrive (and when)
    started = {c.client_id: c.pieces for c in host.clients}  # before local training, for the divergence
    local_losses, local = train_clients(host, state, round_idx, drawn, plan) if method.trains else ({}, {})
    clock.lap("train")

    divergence = prompt_divergence(host, started, drawn.weights, channel)
    method_metrics = exchange(host, state.server, channel, drawn, local, (round_idx + 1, plan.rounds))
    channel.record(drawn.joined, refreshed)
    state.virtual_seconds += drawn.arrivals.round_seconds
    clock.lap("aggregate")

    evaluation = evaluate_round(host, state.server, with_confusion=round_idx == plan.rounds - 1,
                                global_model=plan.global_model, round_idx=round_idx)
    losses = host.gather(local_losses, like=torch.zeros(4, dtype=torch.float64, device="cpu"), what="local losses")
    clock.lap("evaluate")

    histograms = channel.histograms_per_refresh(labeller) * host.model.num_classes * INT64_BYTES  # (privacy: float64)
    uploads = drawn.arrivals.answered * sum(drawn.piece_bytes.values()) + (histograms * host.training if refreshed else 0)
    return RoundOutcome(
        round_idx=round_idx, rounds=plan.rounds, refreshed=refreshed, refresh=state.refresh, joined=drawn.joined,
        weights=channel.taken(drawn.weights, drawn.joined, drawn.arrivals), accuracy=evaluation.accuracy,
        confusion=evaluation.confusion, losses=losses, uploads=uploads, seconds=clock.total(), phase_seconds=clock.laps,
        trains=method.trains, piece_bytes=drawn.piece_bytes, method_metrics=method_metrics, divergence=divergence,
        training=host.training, global_counts=evaluation.global_counts, held_out_counts=evaluation.held_out,
        privacy=channel.round_record(), arrivals=drawn.arrivals,
        trained=drawn.weights > 0 if method.trains else None, kept_global=channel.kept_global(drawn.arrivals),
        virtual_clock=state.virtual_seconds, poisoned=channel.adversary.accepted(drawn.arrivals.accepted),
        label_free=evaluation.label_free,
    )


def take_part(host: Host, state: RunState, round_idx: int, plan: RoundPlan) -> Drawn:
    """Draw the round's participants (the channel's draw: Method.participants, or privacy's own), weigh them
    (Method.client_weights; 0 without a pseudo-label: nothing to train on, nothing to upload), and decide on the
    virtual clock who will be lost, late or cut short (fedur/channel/clock.py). Every rank calls this."""
    method, channel = host.method, plan.channel
    num_training = int(host.training.sum())  # the others: evaluation.new_clients
    joined = torch.zeros(host.num_clients, dtype=torch.bool, device="cpu")  # drawn among the training clients only
    joined[:num_training] = channel.participants(method, round_idx, num_training, plan.join_rate, plan.seed)
    selected = None if state.refresh is None else state.refresh.selected.sum(dim=1)
    weights = method.client_weights(selected, plan.train_sizes) * joined  # 0 for the clients that sit out,
    if selected is not None:  # and for those without a pseudo-label
        weights = weights * (selected > 0)
    return channel.draw(round_idx, joined, weights, selected if method.trains else None, state.server.upload_bytes(),
                        wanted(plan.join_rate, num_training))


def train_clients(host: Host, state: RunState, round_idx: int, drawn: Drawn,
                  plan: RoundPlan) -> tuple[dict[int, Tensor], dict[int, LocalRound]]:
    """Local training of this rank's clients that take part (weight > 0), unit by unit (fedur/train/local.py), each
    for at most the local steps the clock leaves it (`Drawn.limit`).

    Returns each trained client's (mean loss, loss_pos, loss_neg, first learning rate) and its LocalRound (what
    the method's upload sees of its training). SGD momentum starts fresh (optim.optimizer_state reset), from the
    client's own (client), or from the one the previous client handed on (shared; `state.carried_optimizer`).
    """
    losses, local, mode = {}, {}, plan.optimizer_state
    joined = [c for c in host.clients if drawn.weights[c.client_id] > 0]
    for unit in host.progress.iterate(host.units(joined), f"round {round_idx + 1} clients"):
        starts = [{"reset": None, "client": c.optimizer_state, "shared": state.carried_optimizer}[mode] for c in unit]
        limits = [drawn.limit(c.client_id) for c in unit]
        for client, result in zip(unit, train_unit(host, unit, round_idx, starts, plan.optim, state.class_weights, limits)):
            client.optimizer_state = result.optimizer_state if mode == "client" else None
            state.carried_optimizer = result.optimizer_state if mode == "shared" else None
            losses[client.client_id] = torch.tensor([result.loss, result.loss_pos, result.loss_neg, result.lr],
                                                    dtype=torch.float64, device="cpu")
            local[client.client_id] = result.local
    return losses, local


def prompt_divergence(host: Host, started: dict[int, dict[str, Tensor]], weights: Tensor, channel: Channel) -> dict[str, dict]:
    """How far apart the clients' local updates of each piece are, before aggregation (the paper's Fig. 2):
    {piece: {"drift_diversity", "cosine_distance"}} over the clients that trained, for every piece local SGD trains
    (a piece it does not train, pFedMoAP's downloaded experts, has no local update); none where the channel releases
    nothing of the raw updates (privacy). Every rank calls this."""
    out = {}
    if not channel.reports_updates:
        return out
    declared = host.method.pieces()
    for name in host.start:  # every declared piece
        if not declared[name].trains or host.start[name].numel() == 0:
            continue
        like = host.start[name]
        updates = {c.client_id: c.pieces[name] - started[c.client_id][name] for c in host.clients if weights[c.client_id] > 0}
        stacked = host.gather(updates, like=like, what=f"{name} prompt updates")[weights > 0]  # (K', *shape)
        out[name] = {  # drift diversity in FedVLS's form (the authors' own), sum_k |d_k|^2 / |sum_k d_k|^2
            "drift_diversity": drift_diversity(stacked, normalize_weights=False),
            "cosine_distance": mean_pairwise_cosine_distance(stacked),
        }
    return out


class PhaseClock:
    """Seconds per phase of a round: refresh, train, aggregate, evaluate (the checkpoint's save comes after
    the round's metrics are written, so that a resume never lacks a committed round's line)."""

    def __init__(self) -> None:
        self.begin = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, phase: str) -> float:
        now = time.perf_counter()
        self.laps[phase], self.last = now - self.last, now
        return self.laps[phase]

    def total(self) -> float:
        return time.perf_counter() - self.begin
