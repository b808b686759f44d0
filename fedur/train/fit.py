"""The federated round loop of FedUR, with every client a piece of state on some Fabric rank."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from lightning import Fabric
from torch import Tensor

from fedur.config import Config, result_settings
from fedur.federated.aggregation import weighted_average
from fedur.federated.collectives import Collectives
from fedur.federated.divergence import drift_diversity, mean_pairwise_cosine_distance
from fedur.federated.placement import placement_table
from fedur.federated.streams import participants
from fedur.train import checkpoint
from fedur.train.client import ClientState, momentum_only, train_client, train_group
from fedur.train.evaluate import evaluate_clients
from fedur.train.faults import Fault, parse_fault
from fedur.train.module import PromptTuner
from fedur.train.preemption import StopRequest
from fedur.train.progress import Progress
from fedur.train.rank import Rank
from fedur.train.recorder import Recorder
from fedur.train.refresh import Refresh, refresh_pseudo_labels
from fedur.train.round_metrics import RoundOutcome, domain_summary, round_record
from fedur.train.run_dir import RunDir
from fedur.train.setup import describe, setup

INT64_BYTES, FLOAT32_BYTES = 8, 4

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # agreed as max over ranks: SIGUSR1 (requeue) wins


@dataclass
class FitResult:
    summary: dict | None  # None when the run stopped early on a signal (it resumes from its checkpoint)
    rank: Rank  # what this process held, with its clients' final prompts
    global_prompts: dict[str, Tensor]  # the last aggregate of each shared prompt ("visual", "text_ctx", ...)
    stopped_by: str | None = None  # the signal that stopped the run early

    @property
    def clients(self) -> list[ClientState]:
        return self.rank.clients

    @property
    def tuner(self) -> PromptTuner:
        return self.rank.tuner


def fit(
    fabric: Fabric,
    cfg: Config,
    run_dir: RunDir,
    config_yaml: str,
    resume: checkpoint.Committed | None = None,
    stop: StopRequest | None = None,
) -> FitResult:
    """Run (or continue, from `resume`) the federated rounds; `stop` ends the run after a round's commit."""
    fed = cfg.federation
    start_round = 0 if resume is None else resume.round_idx + 1
    collectives = Collectives(fabric, peer_timeout=cfg.run.peer_timeout)
    progress = Progress(enabled=cfg.run.progress and fabric.is_global_zero)  # rank 0's bars; the others stay quiet
    rank, partition_counts, skipped = setup(fabric, collectives, cfg, progress)
    # A resume checks its clients against the checkpoint before anything in the run directory changes.
    resumed = None if resume is None else checkpoint.restore(resume, rank.clients)
    if fabric.is_global_zero:  # only now: a run that fails while loading leaves no directory behind
        run_dir.root.mkdir(parents=True, exist_ok=True)
    collectives.barrier("run directory")
    history = run_dir.history(start_round, cut=fabric.is_global_zero)
    recorder = Recorder(run_dir, fabric.is_global_zero, history, start_round, progress)
    recorder.start(config_yaml, describe(rank, cfg))
    recorder.record_placement(gather_placement(rank))
    recorder.record_partition(*partition_counts, rank.dataset.classnames)

    method, labeller = rank.method, rank.tuner.labeller
    shared = rank.model.prompts(method.shared)  # the server's aggregate of each shared prompt
    upload_bytes = sum(t.numel() for t in shared.values()) * FLOAT32_BYTES
    histogram_bytes = (2 if labeller.cooperative else 1) * rank.model.num_classes * INT64_BYTES
    if resumed is None:
        recorder.record_zero_shot(evaluate_clients(rank, zero_shot=True)[0])
        refresh, carried = None, None  # carried: optim.optimizer_state=shared passes momentum client to client
    else:
        shared.update(resumed["shared"])
        refresh, carried = Refresh(**resumed["refresh"]), momentum_only(resumed["carried_optimizer"])
        rank.tuner.use_class_weights(refresh.class_weights)
        recorder.note(f"resumed from {resume.folder} (round {start_round + 1} of {fed.rounds} is next)")

    fault, confusion = parse_fault(cfg.run.fault), None
    start_time, wall_before = time.perf_counter(), 0.0 if resumed is None else resumed["wall_seconds"]
    rounds = range(start_round, fed.rounds) if method.trains else range(0)  # zero-shot CLIP: nothing to train
    for round_idx in progress.iterate(rounds, "rounds", total=fed.rounds, initial=start_round):
        clock = PhaseClock()
        refreshed = round_idx % fed.refresh_every == 0
        if refreshed:
            refresh = refresh_pseudo_labels(rank, round_idx == 0, round_idx // fed.refresh_every, labeller, len(rank.dataset.train))
            rank.tuner.use_class_weights(refresh.class_weights)
        clock.lap("refresh")

        joined = torch.from_numpy(participants(fed.num_clients, fed.join_rate, cfg.run.seed, round_idx))
        weights = refresh.selected.sum(dim=1) * joined  # |D~_k| of the clients that train; 0 otherwise
        started = {c.client_id: c.prompts for c in rank.clients}  # before local training, for the divergence
        local_losses, carried = train_clients(rank, round_idx, weights, carried, cfg.optim.optimizer_state, fault)
        clock.lap("train")
        divergence = prompt_divergence(rank, started, weights)
        shared.update(aggregate(rank, shared, weights))
        clock.lap("aggregate")
        accuracy, confusion = evaluate_clients(rank, with_confusion=round_idx == fed.rounds - 1)
        losses = rank.gather(local_losses, like=torch.zeros(4, dtype=torch.float64), what="local losses")
        clock.lap("evaluate")

        uploads = (weights > 0) * upload_bytes + (histogram_bytes if refreshed else 0)
        outcome = RoundOutcome(round_idx, refreshed, joined, weights, accuracy, losses, uploads, clock.total(), clock.laps)
        recorder.record_round(round_record(outcome, fed.rounds, refresh, divergence))
        global_state = {
            "shared": {name: t.cpu() for name, t in shared.items()}, "refresh": vars(refresh), "carried_optimizer": carried,
            "wall_seconds": wall_before + time.perf_counter() - start_time,  # over every session of the run
        }
        marker = {"num_clients": fed.num_clients, "world_size": fabric.world_size, "settings": result_settings(asdict(cfg))}
        checkpoint.save_round(rank, run_dir.root, round_idx, global_state, marker, cfg.run.keep_checkpoints, fault)
        signal_code = STOP_SIGNALS.index(stop.received) + 1 if stop is not None and stop.received else 0
        signal_code = collectives.max_over_ranks(signal_code, what="stop request")  # did any rank get a signal?
        if signal_code and round_idx + 1 < fed.rounds:
            collectives.close()
            return stop_early(rank, stop, shared, round_idx, fed.rounds, STOP_SIGNALS[signal_code - 1])

    if confusion is not None:  # None: a resumed run that had already finished its rounds
        recorder.record_confusion(confusion, rank.dataset.classnames)
    collectives.close()
    checkpoint.save_prompts(run_dir.path("prompts"), shared, rank.clients, write_shared=fabric.is_global_zero)
    wall_seconds = wall_before + time.perf_counter() - start_time
    domains = domain_summary(recorder.rounds, rank.dataset, fed.partition, fed.num_clients, fed.clients_per_domain)
    untrained = {} if method.trains else {  # zero-shot CLIP: its accuracy is the run's result
        "final_mean_accuracy": recorder.zero_shot.get("zero_shot_client_mean"),
        "final_client_accuracy": recorder.zero_shot.get("zero_shot_client_accuracy"),
    }
    summary = recorder.finish(
        asdict(cfg),
        {"num_clients": fed.num_clients, "world_size": fabric.world_size, "wall_seconds": wall_seconds,
         "method": method.name, "labeller": labeller.name if method.trains else None,
         "skipped_images": skipped, **domains, **untrained},
    )
    return FitResult(summary, rank, shared)


def gather_placement(rank: Rank) -> dict:
    """placement.json: which node and local rank every rank is, and the clients it hosts."""
    fabric = rank.fabric
    hosts = rank.collectives.gather_ranks(torch.tensor([fabric.node_rank, fabric.local_rank]), what="placement")
    environment = getattr(fabric.strategy, "cluster_environment", None)
    name = type(environment).__name__ if environment is not None else None
    return placement_table(rank.num_clients, [tuple(host) for host in hosts.tolist()], name, rank.work.clients_per_step)


def stop_early(rank: Rank, stop: StopRequest, shared: dict[str, Tensor], round_idx: int, rounds: int, received: str) -> FitResult:
    if rank.fabric.is_global_zero:
        print(f"stopped after round {round_idx + 1} of {rounds} on {received}; the checkpoint is committed")
        stop.received = stop.received or received  # a peer's signal counts as this rank's
        outcome = stop.requeue()
        if outcome:
            print(outcome)
    return FitResult(None, rank, shared, stopped_by=received)


def train_clients(
    rank: Rank, round_idx: int, weights: Tensor, carried: dict | None, mode: str, fault: Fault | None = None
) -> tuple[dict[int, Tensor], dict | None]:
    """Local training of this rank's clients that take part (weight > 0): one after the other, or with
    run.clients_per_step = G, the members of each group of G consecutive client ids together.

    Returns each trained client's (mean loss, loss_pos, loss_neg, first learning rate) and, for
    optim.optimizer_state=shared (`mode`), the momentum to hand to the next client.
    """
    losses = {}
    joined = [c for c in rank.clients if weights[c.client_id] > 0]
    group = rank.work.clients_per_step
    units = [[c for c in joined if c.client_id // group == g] for g in sorted({c.client_id // group for c in joined})]
    for unit in rank.progress.iterate(units, f"round {round_idx + 1} clients"):
        starts = [{"reset": None, "client": c.optimizer_state, "shared": carried}[mode] for c in unit]
        if len(unit) == 1:
            results = [train_client(rank, unit[0], round_idx, starts[0])]
        else:
            results = train_group(rank, unit, round_idx, starts)
        for client, result in zip(unit, results):
            client.optimizer_state = result.optimizer_state if mode == "client" else None
            carried = result.optimizer_state if mode == "shared" else None
            losses[client.client_id] = torch.tensor([result.loss, result.loss_pos, result.loss_neg, result.lr], dtype=torch.float64)
        if fault is not None and len(losses) == len(unit):
            fault.trigger("train", round_idx, rank.fabric.global_rank)
    return losses, carried


def aggregate(rank: Rank, shared: dict[str, Tensor], weights: Tensor) -> dict[str, Tensor]:
    """Average each shared prompt over the clients that trained (weights |D~_k|, in client-id order) and
    hand the average to every client, also those that sat the round out. Every rank calls this."""
    averaged = {}
    for name, current in shared.items():
        uploads = {c.client_id: c.prompts[name] for c in rank.clients if weights[c.client_id] > 0}
        stacked = rank.gather(uploads, like=current, what=f"{name} prompts")  # (K, *shape)
        average = weighted_average(stacked, weights)
        averaged[name] = current if average is None else average
        for client in rank.clients:
            client.prompts = {**client.prompts, name: averaged[name]}
    return averaged


def prompt_divergence(rank: Rank, started: dict[int, dict[str, Tensor]], weights: Tensor) -> dict[str, dict]:
    """How far apart the clients' local updates of each prompt are, before aggregation (the paper's Fig. 2):
    {prompt: {"drift_diversity", "cosine_distance"}} over the clients that trained. Every rank calls this."""
    out = {}
    for name in rank.method.prompts:
        like = next(iter(started.values()))[name] if started else rank.model.prompts((name,))[name]
        updates = {c.client_id: c.prompts[name] - started[c.client_id][name] for c in rank.clients if weights[c.client_id] > 0}
        stacked = rank.gather(updates, like=like, what=f"{name} prompt updates")[weights > 0]  # (K', *shape)
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
