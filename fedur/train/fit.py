"""The federated round loop, with every client a piece of state on some Fabric rank and the method asked
a few named questions (fedur/methods/base.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from lightning import Fabric
from torch import Tensor

from fedur.config import Config, result_settings
from fedur.federated.client import ClientState
from fedur.federated.collectives import Collectives
from fedur.federated.divergence import drift_diversity, mean_pairwise_cosine_distance
from fedur.federated.placement import placement_table
from fedur.launch_env import software_environment
from fedur.methods.base import LocalRound, shared_names
from fedur.train import checkpoint, faults
from fedur.train.evaluate import evaluate_clients, evaluate_global
from fedur.train.local import train_unit
from fedur.train.module import PromptTuner
from fedur.train.new_clients import adapt_new_clients
from fedur.train.predictions import write_predictions
from fedur.train.preemption import StopRequest
from fedur.train.progress import Progress
from fedur.train.rank import Rank
from fedur.train.recorder import Recorder
from fedur.train.refresh import refresh_pseudo_labels
from fedur.train.round_metrics import RoundOutcome, domain_summary, round_record
from fedur.train.run_dir import RunDir
from fedur.train.server import ServerState, exchange
from fedur.train.setup import describe, setup

INT64_BYTES = 8

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # agreed as max over ranks: SIGUSR1 (requeue) wins


@dataclass
class FitResult:
    summary: dict | None  # None when the run stopped early on a signal (it resumes from its checkpoint)
    rank: Rank  # what this process held, with its clients' final prompts
    global_pieces: dict[str, Tensor]  # the last aggregate of each shared piece ("visual", "text_ctx", ...)
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
    settings: dict | None = None,
) -> FitResult:
    """Run (or continue, from `resume`) the federated rounds; `stop` ends the run after a round's commit.
    `settings`: the result-affecting settings every commit records (default: config.result_settings, read now)."""
    fed = cfg.federation
    settings = result_settings(cfg.settings) if settings is None else settings
    start_round = 0 if resume is None else resume.round_idx + 1
    collectives = Collectives(fabric, peer_timeout=cfg.run.peer_timeout)
    progress = Progress(enabled=cfg.run.progress and fabric.is_global_zero)  # rank 0's bars; the others stay quiet
    rank, truth, skipped = setup(fabric, collectives, cfg, progress)
    # A resume checks its clients against the checkpoint before anything in the run directory changes.
    resumed = None if resume is None else checkpoint.restore(resume, rank.clients)
    if fabric.is_global_zero:  # only now: a run that fails while loading leaves no directory behind
        run_dir.root.mkdir(parents=True, exist_ok=True)
    collectives.barrier("run directory")
    checkpoint_format = checkpoint.FORMAT if resume is None else resume.marker.format  # a run keeps its numbering
    history = run_dir.history(start_round, fabric.is_global_zero, checkpoint.first_round(checkpoint_format))
    recorder = Recorder(run_dir, fabric.is_global_zero, history, start_round, progress)
    recorder.start(config_yaml, describe(rank, cfg))
    recorder.record_placement(gather_placement(rank))
    recorder.record_partition(truth.partition)
    if skipped:  # said once, on the console too (data.corrupt_images skip)
        recorder.note(f"{len(skipped)} unreadable image(s) left out (data.corrupt_images skip), e.g. {skipped[0]}; every one "
                      f"of them: skipped_ids in {run_dir.path('partition.json')} (and skipped_images in summary.json)")
    recorder.note_unlabelled(truth.train_labels is not None, rank.dataset.test.labelled and len(rank.dataset.test) > 0)

    method, labeller = rank.method, rank.tuner.labeller
    shared = {name: rank.start[name] for name in shared_names(method)}  # the declared initial values, on the CPU
    server = ServerState(shared, {name: t.cpu() for name, t in method.messages(rank.model, rank.start).items()})  # uploads gather on CPU
    histogram_bytes = (2 if labeller is not None and labeller.cooperative else 1) * rank.model.num_classes * INT64_BYTES
    train_sizes = rank.gather({c.client_id: torch.tensor(len(c.train_indices), device="cpu") for c in rank.clients},
                              like=torch.tensor(0, device="cpu"), what="train sizes")
    training, num_training = rank.training, int(rank.training.sum())  # the others: evaluation.new_clients
    if resumed is None:
        recorder.record_zero_shot(evaluate_clients(rank, zero_shot=True)[0], training,
                                  {held.name: evaluate_global(rank, None, {}, held) for held in rank.held_out})
    else:
        server.load_state_dict(resumed)
        rank.tuner.use_class_weights(None if server.refresh is None else server.refresh.class_weights)
        recorder.note(f"resumed from {resume.folder} (round {start_round + 1} of {fed.rounds} is next)")

    confusion, start_time, wall_before = None, time.perf_counter(), server.wall_seconds
    rounds = method.rounds(fed.rounds)
    for round_idx in progress.iterate(range(start_round, rounds), "rounds", total=rounds, initial=start_round):
        clock = PhaseClock()
        refreshed = labeller is not None and round_idx % fed.refresh_every == 0
        if refreshed:
            server.refresh = refresh_pseudo_labels(rank, round_idx == 0, round_idx // fed.refresh_every, labeller,
                                                   len(rank.dataset.train), truth.train_labels)
            rank.tuner.use_class_weights(server.refresh.class_weights)
        clock.lap("refresh")

        joined = torch.zeros(fed.num_clients, dtype=torch.bool, device="cpu")  # drawn among the training clients only
        joined[:num_training] = method.participants(round_idx, num_training, fed.join_rate, cfg.run.seed)
        selected = None if server.refresh is None else server.refresh.selected.sum(dim=1)
        weights = method.client_weights(selected, train_sizes) * joined  # 0 for the clients that sit out,
        if selected is not None:  # and for those without a pseudo-label: nothing to train on, nothing to upload
            weights = weights * (selected > 0)
        started = {c.client_id: c.pieces for c in rank.clients}  # before local training, for the divergence
        local_losses, local = train_clients(rank, round_idx, weights, server, cfg.optim.optimizer_state) if method.trains \
            else ({}, {})
        clock.lap("train")
        divergence = prompt_divergence(rank, started, weights)
        method_metrics = exchange(rank, server, weights, local, round_idx + 1, rounds)
        clock.lap("aggregate")
        accuracy, confusion = evaluate_clients(rank, with_confusion=round_idx == rounds - 1)
        global_counts = evaluate_global(rank, server.shared, server.method) if cfg.evaluation.global_model else None
        held_counts = {held.name: evaluate_global(rank, server.shared, server.method, held) for held in rank.held_out}
        losses = rank.gather(local_losses, like=torch.zeros(4, dtype=torch.float64, device="cpu"), what="local losses")
        clock.lap("evaluate")

        piece_bytes = server.upload_bytes()  # {name: bytes} of one client's upload
        uploads = (weights > 0) * sum(piece_bytes.values()) + (histogram_bytes * training if refreshed else 0)
        outcome = RoundOutcome(round_idx, refreshed, joined, weights, accuracy, losses, uploads, clock.total(), clock.laps,
                               method.trains, piece_bytes, method_metrics, training, global_counts, held_counts)
        recorder.record_round(round_record(outcome, rounds, server.refresh, divergence, history.first_round))
        server.wall_seconds = wall_before + time.perf_counter() - start_time
        marker = checkpoint.Marker(round_idx, fed.num_clients, fabric.world_size, settings,
                                   format=checkpoint_format)
        checkpoint.save_round(rank, run_dir.root, server, marker, cfg.run.keep_checkpoints)
        signal_code = STOP_SIGNALS.index(stop.received) + 1 if stop is not None and stop.received else 0
        signal_code = collectives.max_over_ranks(signal_code, what="stop request")  # did any rank get a signal?
        if signal_code and round_idx + 1 < rounds:
            collectives.close()
            rank.images.close()
            return stop_early(rank, stop, server.shared, round_idx, rounds, STOP_SIGNALS[signal_code - 1])

    if confusion is not None:  # None: a resumed run that had already finished its rounds
        recorder.record_confusion(confusion, rank.dataset.classnames)
    if rank.new_clients and method.trains:  # after the last commit: a resume adapts them again, the same way
        epochs = cfg.evaluation.new_client_epochs or fed.local_epochs
        recorder.record_adapted(adapt_new_clients(rank, labeller, epochs, cfg.evaluation.new_client_labels == "zero_shot",
                                                  train_sizes, rounds, truth.train_labels), training)
    collectives.close()
    checkpoint.save_prompts(run_dir.path("prompts"), server.shared, rank.clients, write_shared=fabric.is_global_zero)
    if truth.train_labels is None or not recorder.test_labels:  # data without labels: what the model says per image
        write_predictions(rank, run_dir.path("predictions"), cfg.dataset.root)
    wall_seconds = wall_before + time.perf_counter() - start_time
    final = recorder.rounds[-1]["client_accuracy"] if recorder.rounds else recorder.zero_shot.get("zero_shot_client_accuracy")
    domains = domain_summary(final, rank.dataset, fed.partition, fed.num_clients, fed.clients_per_domain)
    rank.images.close()
    summary = recorder.finish(
        cfg.settings,
        {"num_clients": fed.num_clients, "world_size": fabric.world_size, "wall_seconds": wall_seconds,
         "dataset": rank.dataset.name, "method": method.key, "labeller": None if labeller is None else labeller.key,
         "skipped_images": skipped, "train_labels": truth.train_labels is not None, "test_labels": recorder.test_labels,
         **domains, "environment": software_environment(fabric.device)},
    )
    return FitResult(summary, rank, server.shared)


def gather_placement(rank: Rank) -> dict:
    """placement.json: which node and local rank every rank is, and the clients it hosts."""
    fabric = rank.fabric
    hosts = rank.collectives.gather_ranks(torch.tensor([fabric.node_rank, fabric.local_rank], device="cpu"), what="placement")
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


def train_clients(rank: Rank, round_idx: int, weights: Tensor, server: ServerState,
                  mode: str) -> tuple[dict[int, Tensor], dict[int, LocalRound]]:
    """Local training of this rank's clients that take part (weight > 0), unit by unit (fedur/train/local.py).

    Returns each trained client's (mean loss, loss_pos, loss_neg, first learning rate) and its LocalRound (what
    the method's upload sees of its training). SGD momentum starts
    fresh (optim.optimizer_state `mode` reset), from the client's own, or from the one the previous client
    handed on (shared; kept in `server.carried_optimizer`).
    """
    losses, local = {}, {}
    joined = [c for c in rank.clients if weights[c.client_id] > 0]
    for unit in rank.progress.iterate(rank.units(joined), f"round {round_idx + 1} clients"):
        starts = [{"reset": None, "client": c.optimizer_state, "shared": server.carried_optimizer}[mode] for c in unit]
        for client, result in zip(unit, train_unit(rank, unit, round_idx, starts)):
            client.optimizer_state = result.optimizer_state if mode == "client" else None
            server.carried_optimizer = result.optimizer_state if mode == "shared" else None
            losses[client.client_id] = torch.tensor([result.loss, result.loss_pos, result.loss_neg, result.lr],
                                                    dtype=torch.float64, device="cpu")
            local[client.client_id] = result.local
        if len(losses) == len(unit):  # after the rank's first unit
            faults.point("train", round_idx, rank.fabric.global_rank)
    return losses, local


def prompt_divergence(rank: Rank, started: dict[int, dict[str, Tensor]], weights: Tensor) -> dict[str, dict]:
    """How far apart the clients' local updates of each piece are, before aggregation (the paper's Fig. 2):
    {piece: {"drift_diversity", "cosine_distance"}} over the clients that trained. Every rank calls this."""
    out = {}
    for name in rank.start:  # every declared piece
        like = rank.start[name]
        updates = {c.client_id: c.pieces[name] - started[c.client_id][name] for c in rank.clients if weights[c.client_id] > 0}
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
