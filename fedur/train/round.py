"""One federated round, as every rank runs it: refresh the pseudo-labels (every `refresh_every` rounds), draw who
takes part and their weights, train them, exchange with the server, evaluate; what it did is a RoundOutcome."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedur.federated.clock import Arrivals
from fedur.federated.divergence import drift_diversity, mean_pairwise_cosine_distance
from fedur.methods.base import LocalRound
from fedur.train.evaluate import evaluate_round
from fedur.train.host import Host
from fedur.train.local import train_unit
from fedur.train.module import Optimization
from fedur.train.refresh import refresh_pseudo_labels
from fedur.train.round_metrics import RoundOutcome
from fedur.train.server import exchange, keep_global
from fedur.train.state import RunState
from fedur.train.uploads import UploadRules

INT64_BYTES = 8


@dataclass(frozen=True)
class RoundPlan:
    """What every round of a run is run by (plain values, fixed for the run)."""

    rounds: int  # the method's number of rounds (Method.rounds of federation.rounds)
    refresh_every: int  # federation.refresh_every
    join_rate: float  # federation.join_rate
    seed: int  # run.seed: who takes part, and every client's data order
    optim: Optimization  # the local optimisation (optim.*, federation.local_epochs)
    optimizer_state: str  # optim.optimizer_state: reset, client or shared
    global_model: bool  # evaluation.global_model
    train_sizes: Tensor  # (K,) every client's train images
    train_labels: np.ndarray | None  # every train row's true label, for the refresh's monitoring only (None: none)
    rules: UploadRules  # who answers, when, honestly, and how the server combines them (federation.drop_rate ...)


def run_round(host: Host, state: RunState, round_idx: int, plan: RoundPlan) -> RoundOutcome:
    """Round `round_idx` (from 0): `state` and the hosted clients change in place. Every rank calls this."""
    method, labeller, training = host.method, host.tuner.labeller, host.training
    clock = PhaseClock()
    refreshed = labeller is not None and round_idx % plan.refresh_every == 0
    rules = plan.rules
    if refreshed:
        state.refresh = refresh_pseudo_labels(host, round_idx == 0, round_idx // plan.refresh_every, labeller,
                                              len(host.dataset.train), plan.train_labels,
                                              rules.at_refresh(round_idx, host.num_clients), state.privacy)
    clock.lap("refresh")

    drawn = take_part(host, state, round_idx, plan)  # who is asked, their weights, who will arrive (and when)
    joined, weights, arrivals, piece_bytes = drawn.joined, drawn.weights, drawn.arrivals, drawn.piece_bytes
    private = state.privacy  # privacy.mode central | local (None: off)
    started = {c.client_id: c.pieces for c in host.clients}  # before local training, for the divergence
    trained = weights > 0  # lost and late uploads were trained all the same (a late one: as far as its budget)
    local_losses, local = train_clients(host, state, round_idx, weights, plan, drawn.budgets) if method.trains else ({}, {})
    clock.lap("train")

    # the clients' raw updates are no release of a private run: no divergence of them
    divergence = prompt_divergence(host, started, weights) if private is None else {}
    weights = (joined & arrivals.accepted).to(weights.dtype) if private is not None else weights * arrivals.accepted
    kept = int(arrivals.accepted.sum()) < rules.min_uploads  # too few uploads: the global state stays
    if kept:
        method_metrics = keep_global(host, state.server)
    else:
        method_metrics = exchange(host, state.server, weights, local, (round_idx + 1, plan.rounds), private,
                                  int(joined.sum()), rules)
    if private is not None:
        private.record(joined, refreshed)
    state.virtual_seconds += arrivals.round_seconds
    clock.lap("aggregate")

    evaluation = evaluate_round(host, state.server, with_confusion=round_idx == plan.rounds - 1,
                                global_model=plan.global_model)
    losses = host.gather(local_losses, like=torch.zeros(4, dtype=torch.float64, device="cpu"), what="local losses")
    clock.lap("evaluate")

    cooperative = labeller is not None and labeller.cooperative
    per_refresh = (2 if cooperative else 1) if private is None else private.releases.histograms_per_refresh
    histograms = per_refresh * host.model.num_classes * INT64_BYTES  # (privacy: float64, as many bytes)
    uploads = arrivals.answered * sum(piece_bytes.values()) + (histograms * training if refreshed else 0)  # (lost: sent)
    return RoundOutcome(
        round_idx=round_idx, rounds=plan.rounds, refreshed=refreshed, refresh=state.refresh, joined=joined,
        weights=weights, accuracy=evaluation.accuracy, confusion=evaluation.confusion, losses=losses, uploads=uploads,
        seconds=clock.total(), phase_seconds=clock.laps, trains=method.trains, piece_bytes=piece_bytes,
        method_metrics=method_metrics, divergence=divergence, training=training, global_counts=evaluation.global_counts,
        held_out_counts=evaluation.held_out, privacy=None if state.privacy is None else state.privacy.round_record(),
        arrivals=arrivals, trained=trained if method.trains else None, kept_global=kept,
        virtual_clock=state.virtual_seconds, poisoned=[k for k in rules.attackers if bool(arrivals.accepted[k])],
    )


@dataclass(frozen=True)
class Drawn:
    """Who takes part in a round, before anyone trains (rows are client ids)."""

    joined: Tensor  # (K,) bool: drawn (asked, with over-selection)
    weights: Tensor  # (K,) the aggregation weight of each one that trains (0: sits out, or has nothing to train on)
    arrivals: Arrivals  # who will be lost, late or taken, and when (fedur/federated/clock.py)
    budgets: Tensor | None  # (K,) int64 the steps each may take (-1: all; None: no deadline cuts any)
    piece_bytes: dict[str, int]  # {name: bytes} of one client's upload


def take_part(host: Host, state: RunState, round_idx: int, plan: RoundPlan) -> Drawn:
    """Draw the round's participants (Method.participants, or privacy's own draw; over-selection asks more), weigh
    them (Method.client_weights; 0 without a pseudo-label: nothing to train on, nothing to upload), and decide on the
    virtual clock who will be lost, late or cut short (fedur/train/uploads.py). Every rank calls this."""
    method, rules, private = host.method, plan.rules, state.privacy
    num_training = int(host.training.sum())  # the others: evaluation.new_clients
    joined = torch.zeros(host.num_clients, dtype=torch.bool, device="cpu")  # drawn among the training clients only
    rate = rules.join_rate(plan.join_rate, num_training)  # federation.over_select asks more than it takes
    joined[:num_training] = (method.participants(round_idx, num_training, rate, plan.seed) if private is None
                             else private.participants(round_idx, num_training))  # privacy: from its secret seed
    selected = None if state.refresh is None else state.refresh.selected.sum(dim=1)
    weights = method.client_weights(selected, plan.train_sizes) * joined  # 0 for the clients that sit out,
    if selected is not None:  # and for those without a pseudo-label
        weights = weights * (selected > 0)
    piece_bytes = state.server.upload_bytes()
    # privacy: every drawn client uploads (a zero update without pseudo-labels), with the same weight
    uploading = joined.clone() if private is not None else weights > 0
    wanted = math.ceil(plan.join_rate * num_training) if plan.join_rate < 1 else num_training
    arrivals = rules.arrivals(round_idx, uploading, selected if method.trains else None, sum(piece_bytes.values()), wanted)
    budgets = None
    if rules.late == "partial":  # a late client trains the steps it can finish in time (none: it does not train)
        budgets = torch.where(arrivals.late, arrivals.budget, -1)
        weights = weights * (budgets != 0)
    return Drawn(joined, weights, arrivals, budgets, piece_bytes)


def train_clients(host: Host, state: RunState, round_idx: int, weights: Tensor, plan: RoundPlan,
                  budgets: Tensor | None = None) -> tuple[dict[int, Tensor], dict[int, LocalRound]]:
    """Local training of this rank's clients that take part (weight > 0), unit by unit (fedur/train/local.py), each
    for at most its `budgets` entry of local steps ((K,) int64, -1: all; None: all its steps; federation.late partial).

    Returns each trained client's (mean loss, loss_pos, loss_neg, first learning rate) and its LocalRound (what
    the method's upload sees of its training). SGD momentum starts fresh (optim.optimizer_state reset), from the
    client's own (client), or from the one the previous client handed on (shared; `state.carried_optimizer`).
    """
    losses, local, mode = {}, {}, plan.optimizer_state
    joined = [c for c in host.clients if weights[c.client_id] > 0]
    for unit in host.progress.iterate(host.units(joined), f"round {round_idx + 1} clients"):
        starts = [{"reset": None, "client": c.optimizer_state, "shared": state.carried_optimizer}[mode] for c in unit]
        limits = None if budgets is None else [None if budgets[c.client_id] < 0 else int(budgets[c.client_id]) for c in unit]
        for client, result in zip(unit, train_unit(host, unit, round_idx, starts, plan.optim, state.class_weights, limits)):
            client.optimizer_state = result.optimizer_state if mode == "client" else None
            state.carried_optimizer = result.optimizer_state if mode == "shared" else None
            losses[client.client_id] = torch.tensor([result.loss, result.loss_pos, result.loss_neg, result.lr],
                                                    dtype=torch.float64, device="cpu")
            local[client.client_id] = result.local
    return losses, local


def prompt_divergence(host: Host, started: dict[int, dict[str, Tensor]], weights: Tensor) -> dict[str, dict]:
    """How far apart the clients' local updates of each piece are, before aggregation (the paper's Fig. 2):
    {piece: {"drift_diversity", "cosine_distance"}} over the clients that trained, for every piece local SGD trains
    (a piece it does not train, pFedMoAP's downloaded experts, has no local update). Every rank calls this."""
    out = {}
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
