"""One step of an asynchronous server (server.mode fedbuff | fedasync; docs/asynchronous.md), as every rank runs it:
the step's arrivals train, are sent and applied to the current version, the idle clients download the new version,
as many clients as the concurrency has room for start from it (each refreshing its pseudo-labels every
refresh_every of its own jobs), and the run evaluates when it is due; what it did is a RoundOutcome with the step's
record. Who arrives when is fedur/federated/asynchronous.py's pure math, how an arrival is weighed the channel's
server stage (fedur/channel/server.py); the exchange is the one every round takes (fedur/train/server.py).

A job is computed when it arrives, from what its client held when it started (the version it downloaded, its personal
pieces, pseudo-labels and momentum, which nothing changes in flight: a client in flight downloads and refreshes
nothing) and the class weights of its start (Flights): the update is the one training at the start would have held
until then, while the clients' models between steps are their finished work only. A checkpoint therefore holds every
update in flight as what makes it: its client's file and its record in global.pt.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fedur.channel import Drawn
from fedur.federated import asynchronous, streams
from fedur.federated.asynchronous import Job
from fedur.federated.clock import Arrivals, client_seconds, planned_steps
from fedur.methods.base import LocalRound
from fedur.train.evaluate import evaluate_round
from fedur.train.host import Host
from fedur.train.local import train_unit
from fedur.train.refresh import Ask, refresh_pseudo_labels
from fedur.train.round import INT64_BYTES, PhaseClock, RoundPlan, prompt_divergence
from fedur.train.round_metrics import RoundOutcome
from fedur.train.server import exchange
from fedur.train.state import Flights, RunState


def run_step(host: Host, state: RunState, step_idx: int, plan: RoundPlan) -> RoundOutcome:
    """Server step `step_idx` (from 0): arrive -> train -> send -> apply -> start -> evaluate. `state` and the hosted
    clients change in place. Every rank calls this."""
    method, channel, server = host.method, plan.channel, plan.channel.server
    clock = PhaseClock()
    refreshing = opening(host, state, plan) if state.flights is None else torch.zeros_like(host.training)  # time 0
    clock.lap("refresh")

    arrivals, events = asynchronous.take(state.flights.events, server.buffer)  # the step's arrivals, the next version
    drawn = arrived(host, state, arrivals, events, plan)
    record = step_record(arrivals, events, state, plan)  # (the arrivals' steps: of their selection at their start)
    started = {c.client_id: c.pieces for c in host.clients}  # before local training, for the divergence
    local_losses, local = train_jobs(host, state, arrivals, drawn.weights, plan)
    clock.lap("train")

    divergence = prompt_divergence(host, started, drawn.weights, channel)
    method_metrics = exchange(host, state.server, channel, drawn, local, (step_idx + 1, plan.rounds))
    state.flights = state.flights.landed(events, {job.client for job in arrivals})
    state.virtual_seconds = events.now
    clock.lap("aggregate")

    starting, refreshed = start_clients(host, state, step_idx, plan)  # from the new version
    refreshing |= refreshed
    clock.lap("start")

    evaluation = None
    if asynchronous.due(step_idx, plan.rounds, server.evaluate_every, server.evaluate_unit, events.now,
                        events.evaluated):
        evaluation = evaluate_round(host, state.server, with_confusion=step_idx == plan.rounds - 1,
                                    global_model=plan.global_model, round_idx=step_idx)  # the label-free choice's step
        state.flights = replace(state.flights, events=replace(state.flights.events, evaluated=events.now))
    losses = host.gather(local_losses, like=torch.zeros(4, dtype=torch.float64, device="cpu"), what="local losses")
    clock.lap("evaluate")

    histograms = channel.histograms_per_refresh(host.tuner.labeller) * host.model.num_classes * INT64_BYTES
    uploads = (drawn.weights > 0) * sum(drawn.piece_bytes.values()) + histograms * refreshing
    return RoundOutcome(
        round_idx=step_idx, rounds=plan.rounds, refreshed=bool(refreshing.any()), refresh=state.refresh,
        joined=drawn.joined, weights=channel.taken(drawn.weights, drawn.joined, drawn.arrivals),
        accuracy=None if evaluation is None else evaluation.accuracy,
        confusion=None if evaluation is None else evaluation.confusion, losses=losses, uploads=uploads,
        seconds=clock.total(), phase_seconds=clock.laps, trains=method.trains, piece_bytes=drawn.piece_bytes,
        method_metrics=method_metrics, divergence=divergence, training=host.training,
        global_counts=None if evaluation is None else evaluation.global_counts,
        held_out_counts=None if evaluation is None else evaluation.held_out, trained=drawn.weights > 0,
        label_free=None if evaluation is None else evaluation.label_free,  # the estimates of a step that evaluated
        virtual_clock=events.now, poisoned=channel.adversary.accepted(drawn.joined),
        server={**record, "started": starting, "in_flight": sorted(job.client for job in state.flights.events.flying)},
    )


def opening(host: Host, state: RunState, plan: RoundPlan) -> Tensor:
    """Virtual time 0: every training client's first pseudo-labels (zero-shot CLIP, cooperating as a synchronous
    run's first refresh), and the first clients start from version 0 (server.concurrency of them, drawn). Returns
    (K,) bool: who refreshed. Every rank calls this."""
    labeller = host.tuner.labeller
    ask = Ask(0, 0, zero_shot=True, n_total=len(host.dataset.train))
    state.refresh = refresh_pseudo_labels(host, labeller, plan.channel, ask, plan.train_labels)
    state.flights = Flights(asynchronous.begin(int(host.training.sum())))
    clients = streams.starters(state.flights.events.idle(), plan.channel.server.concurrency, plan.seed, -1)
    state.flights = departing(host, state, clients, plan)
    return host.training.clone()


def start_clients(host: Host, state: RunState, step_idx: int, plan: RoundPlan) -> tuple[list[int], Tensor]:
    """After step `step_idx`: as many idle clients as the concurrency has room for (drawn uniformly) start from the new
    version, which they downloaded with the step (every client not in flight does); those whose job is due a refresh
    (each refresh_every of its own jobs) pseudo-label with the model they now hold, cooperating with the others' last
    histograms (refresh.py, Ask.others). Returns (who started, (K,) bool who refreshed). Every rank calls this."""
    events, server = state.flights.events, plan.channel.server
    clients = streams.starters(events.idle(), server.concurrency - len(events.flying), plan.seed, step_idx)
    due = {k: events.jobs[k] // plan.refresh_every for k in clients  # (job 0: the opening's pseudo-labels)
           if events.jobs[k] > 0 and events.jobs[k] % plan.refresh_every == 0}
    refreshed = torch.zeros_like(host.training)
    for refresh_idx in sorted(set(due.values())):  # (the clients of one refresh index together)
        members = torch.zeros_like(host.training)
        members[[k for k, r in due.items() if r == refresh_idx]] = True
        ask = Ask(step_idx + 1, refresh_idx, zero_shot=False, n_total=len(host.dataset.train), members=members,
                  others=state.refresh)
        state.refresh = refresh_pseudo_labels(host, host.tuner.labeller, plan.channel, ask, plan.train_labels)
        refreshed |= members
    state.flights = departing(host, state, clients, plan)
    return clients, refreshed


def departing(host: Host, state: RunState, clients: list[int], plan: RoundPlan) -> Flights:
    """The events with `clients` started now, each arriving after its local steps (its epochs over its selected
    pseudo-labels) at its speed and its upload at its bandwidth (the clock's), and the class weights it trains with."""
    clock = plan.channel.clock
    selected = state.refresh.selected.sum(dim=1)  # (K,)
    steps = planned_steps(selected, clock.batch_size, clock.local_epochs)
    speeds = torch.ones(len(steps), dtype=torch.float64, device="cpu") if clock.speeds is None else clock.speeds
    bandwidths = clock.bandwidths
    seconds = client_seconds(steps[:len(speeds)], speeds, sum(state.server.upload_bytes().values()), bandwidths)
    events = asynchronous.start(state.flights.events, clients, [float(seconds[k]) for k in clients])
    weights = {**state.flights.class_weights, **{k: state.class_weights for k in clients}}
    return Flights(events, weights)


def arrived(host: Host, state: RunState, arrivals: tuple[Job, ...], events: asynchronous.Events, plan: RoundPlan) -> Drawn:
    """The step's arrivals as the exchange takes them (every rank the same; rows are client ids): each arrival taken,
    weighed as the method weighs its clients (Method.client_weights; 0 without a pseudo-label: it trained nothing),
    with its staleness against the version the step applies them to; the clients still in flight download nothing."""
    num_clients = host.num_clients
    ids = [job.client for job in arrivals]
    joined = torch.zeros(num_clients, dtype=torch.bool, device="cpu")
    joined[ids] = True
    selected = state.refresh.selected.sum(dim=1)
    weights = host.method.client_weights(selected, plan.train_sizes) * joined * (selected > 0)
    staleness = torch.zeros(num_clients, dtype=torch.long, device="cpu")
    staleness[ids] = torch.tensor(asynchronous.staleness(arrivals, events.version - 1), dtype=torch.long, device="cpu")
    holding = torch.zeros(num_clients, dtype=torch.bool, device="cpu")
    holding[[job.client for job in events.flying]] = True
    at = torch.zeros(num_clients, dtype=torch.float64, device="cpu")
    at[ids] = torch.tensor([job.arrival for job in arrivals], dtype=torch.float64, device="cpu")
    none = torch.zeros_like(joined)
    taken = Arrivals(asked=joined, lost=none, late=none, surplus=none, accepted=joined, seconds=at, arrival=at,
                     budget=torch.zeros(num_clients, dtype=torch.long, device="cpu"),
                     round_seconds=events.now - state.flights.events.now, deadline_seconds=None)
    return Drawn(joined, weights, taken, None, state.server.upload_bytes(), staleness=staleness, holding=holding)


def train_jobs(host: Host, state: RunState, arrivals: tuple[Job, ...], weights: Tensor,
               plan: RoundPlan) -> tuple[dict[int, Tensor], dict[int, LocalRound]]:
    """Local training of this rank's arrivals with something to train on (weight > 0), one client at a time in arrival
    order, each as its job: its own round (the job's number: its data order and schedule), from the pieces it holds
    (the version it started from), with the class weights of its start. Returns what round.py's train_clients does."""
    losses, local, mode = {}, {}, plan.optimizer_state
    hosted = {c.client_id: c for c in host.clients}
    jobs = [job for job in arrivals if job.client in hosted and weights[job.client] > 0]
    for job in host.progress.iterate(jobs, "arrivals"):
        client = hosted[job.client]
        start = {"reset": None, "client": client.optimizer_state, "shared": state.carried_optimizer}[mode]
        result, = train_unit(host, [client], job.number, [start], plan.optim, state.flights.class_weights.get(job.client))
        client.optimizer_state = result.optimizer_state if mode == "client" else None
        state.carried_optimizer = result.optimizer_state if mode == "shared" else None
        losses[job.client] = torch.tensor([result.loss, result.loss_pos, result.loss_neg, result.lr], dtype=torch.float64,
                                          device="cpu")
        local[job.client] = result.local
    return losses, local


def step_record(arrivals: tuple[Job, ...], events: asynchronous.Events, state: RunState, plan: RoundPlan) -> dict:
    """metrics.jsonl's fields of an asynchronous step's arrivals (fedur/train/round_fields.py; who starts after it:
    `run_step`)."""
    clock, server = plan.channel.clock, plan.channel.server
    staleness = asynchronous.staleness(arrivals, events.version - 1)
    steps = planned_steps(state.refresh.selected.sum(dim=1), clock.batch_size, clock.local_epochs)
    return {
        "version": events.version,
        "arrived": [job.client for job in arrivals],
        "staleness": staleness,
        "step_sizes": [server.factor(tau) for tau in staleness],
        "arrival_seconds": [job.arrival for job in arrivals],
        "arrival_steps": [int(steps[job.client]) for job in arrivals],
        "virtual_clock": events.now,
    }
