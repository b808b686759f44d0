"""The federated round loop of FedUR, with every client a piece of state on some Fabric rank."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from lightning import Fabric
from torch import Tensor

from fedur.config import Config, result_settings
from fedur.data.datasets import ImageSplit
from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.aggregation import weighted_average
from fedur.federated.collectives import Collectives
from fedur.federated.streams import participants
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import zero_shot_weights
from fedur.train import checkpoint
from fedur.train.client import ClientState, train_client
from fedur.train.evaluate import confusion_matrix, correct_and_total, predict
from fedur.train.faults import Fault, parse_fault
from fedur.train.module import PromptTuner
from fedur.train.preemption import StopRequest
from fedur.train.progress import QUIET, Progress
from fedur.train.recorder import Recorder, client_histograms
from fedur.train.round_metrics import domain_summary, round_record
from fedur.train.refresh import Refresh, refresh_pseudo_labels
from fedur.train.setup import describe, setup

INT64_BYTES, FLOAT32_BYTES = 8, 4

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # agreed as max over ranks: SIGUSR1 (requeue) wins

SHARED = {"visual": ("visual",), "text": ("text_ctx",), "both": ("visual", "text_ctx"), "none": ()}


@dataclass
class FitResult:
    summary: dict | None  # None when the run stopped early on a signal (it resumes from its checkpoint)
    tuner: PromptTuner  # the rank's module: frozen backbone + prompt slots
    clients: list[ClientState]  # this rank's clients, with their final prompts
    global_prompts: dict[str, Tensor]  # the last aggregate of each shared prompt ("visual", "text_ctx")
    stopped_by: str | None = None  # the signal that stopped the run early


def fit(
    fabric: Fabric,
    cfg: Config,
    run_dir: Path,
    config_yaml: str,
    resume: checkpoint.Committed | None = None,
    stop: StopRequest | None = None,
) -> FitResult:
    """Run (or continue, from `resume`) the federated rounds; `stop` ends the run after a round's commit."""
    fed, method, optim = cfg.federation, cfg.fedur, cfg.optim
    num_clients = fed.num_clients
    start_round = 0 if resume is None else resume.round_idx + 1
    collectives = Collectives(fabric, peer_timeout=cfg.run.peer_timeout)
    dataset, clip, tuner, clients, loading = setup(fabric, cfg)
    # A resume checks its clients against the checkpoint before anything in the run directory changes.
    resumed = None if resume is None else checkpoint.restore(resume, clients)
    if fabric.is_global_zero:  # only now: a run that fails while loading leaves no directory behind
        run_dir.mkdir(parents=True, exist_ok=True)
    collectives.barrier("run directory")
    recorder = Recorder(fabric, run_dir, start_round=start_round, progress=cfg.run.progress)
    progress = recorder.progress
    model, transform = tuner.model, loading.transform
    shared = {name: getattr(clients[0], name) for name in SHARED[method.share]}
    upload_bytes = sum(t.numel() for t in shared.values()) * FLOAT32_BYTES
    recorder.start(config_yaml, describe(fabric, cfg, dataset, clients))
    recorder.record_placement(collectives, clients, num_clients)
    recorder.record_partition(*client_histograms(collectives, clients, dataset.train.labels, dataset.test.labels,
                                                 dataset.num_classes, num_clients), dataset.classnames)

    zero_shot_text = zero_shot_weights(clip, dataset.classnames, dataset.template, fabric.device)
    if resumed is None:
        zero_shot, _ = evaluate_clients(fabric, collectives, model, clients, dataset.test, transform, cfg, zero_shot_text)
        recorder.record_zero_shot(zero_shot)
        refresh, carried_optimizer = None, None  # carried: optim.optimizer_state=shared passes momentum client to client
    else:
        shared.update(resumed["shared"])  # the recorder reloads zero-shot results and metrics from the run directory
        refresh, carried_optimizer = Refresh(**resumed["refresh"]), resumed["carried_optimizer"]
        tuner.class_weights = refresh.class_weights
        if fabric.is_global_zero:
            progress.write(f"resumed from {resume.folder} (round {start_round + 1} of {fed.rounds} is next)")

    fault, confusion = parse_fault(cfg.run.fault), None
    start_time, wall_before = time.perf_counter(), 0.0 if resumed is None else resumed["wall_seconds"]
    for round_idx in progress.iterate(range(start_round, fed.rounds), "rounds", total=fed.rounds, initial=start_round):
        round_start = time.perf_counter()
        refreshed = round_idx % fed.refresh_every == 0
        if refreshed:
            refresh = refresh_pseudo_labels(
                fabric, collectives, model, clients, dataset.train, transform,
                zero_shot_text if round_idx == 0 else None, round_idx // fed.refresh_every, method,
                num_clients=num_clients, n_total=len(dataset.train), batch_size=optim.eval_batch_size,
                num_workers=cfg.data.num_workers, progress=progress,
            )
            tuner.class_weights = refresh.class_weights

        joined = torch.from_numpy(participants(num_clients, fed.join_rate, cfg.run.seed, round_idx))
        weights = refresh.selected.sum(dim=1) * joined  # |D~_k| of the clients that train; 0 otherwise
        local_losses, carried_optimizer = train_clients(
            fabric, tuner, clients, dataset.train, transform, round_idx, weights, carried_optimizer, cfg, fault, progress
        )
        shared.update(aggregate(collectives, clients, shared, weights, num_clients))
        accuracy, confusion = evaluate_clients(
            fabric, collectives, model, clients, dataset.test, transform, cfg, with_confusion=round_idx == fed.rounds - 1
        )
        losses = collectives.gather_clients(local_losses, num_clients, like=torch.zeros(3), what="local losses")

        uploads = (weights > 0) * upload_bytes + (2 * dataset.num_classes * INT64_BYTES if refreshed else 0)
        recorder.record_round(round_record(
            round_idx, fed.rounds, refresh, refreshed, joined, weights, accuracy, losses, uploads,
            lr=tuner.learning_rate((round_idx % fed.refresh_every) * fed.local_epochs),
            seconds=time.perf_counter() - round_start,
        ))
        global_state = {
            "shared": {name: t.cpu() for name, t in shared.items()}, "refresh": vars(refresh),
            "carried_optimizer": carried_optimizer,
            "wall_seconds": wall_before + time.perf_counter() - start_time,  # over every session of the run
        }
        checkpoint.save_round(
            fabric, collectives, run_dir, round_idx, clients, global_state, cfg.run.keep_checkpoints, fault,
            marker={"num_clients": num_clients, "world_size": fabric.world_size, "settings": result_settings(asdict(cfg))},
        )
        signal_code = STOP_SIGNALS.index(stop.received) + 1 if stop is not None and stop.received else 0
        signal_code = collectives.max_over_ranks(signal_code, what="stop request")  # did any rank get a signal?
        if signal_code and round_idx + 1 < fed.rounds:
            collectives.close()
            return stop_early(fabric, cfg, stop, tuner, clients, shared, round_idx, STOP_SIGNALS[signal_code - 1])

    if confusion is not None:  # None: a resumed run that had already finished its rounds
        recorder.record_confusion(confusion, dataset.classnames)
    collectives.close()
    recorder.save_prompts(shared, clients)
    summary = recorder.finish(
        asdict(cfg),
        {
            "num_clients": num_clients, "world_size": fabric.world_size,
            "wall_seconds": wall_before + time.perf_counter() - start_time,
            "skipped_images": loading.skipped,
            **domain_summary(recorder.rounds, dataset, cfg),
        },
    )
    return FitResult(summary, tuner, clients, shared)


def stop_early(
    fabric: Fabric, cfg: Config, stop: StopRequest, tuner: PromptTuner, clients: list[ClientState],
    shared: dict[str, Tensor], round_idx: int, received: str,
) -> FitResult:
    if fabric.is_global_zero:
        print(f"stopped after round {round_idx + 1} of {cfg.federation.rounds} on {received}; the checkpoint is committed")
        stop.received = stop.received or received  # a peer's signal counts as this rank's
        outcome = stop.requeue()
        if outcome:
            print(outcome)
    return FitResult(None, tuner, clients, shared, stopped_by=received)


def train_clients(
    fabric: Fabric,
    tuner: PromptTuner,
    clients: list[ClientState],
    split: ImageSplit,
    transform,
    round_idx: int,
    weights: Tensor,
    carried_optimizer: dict | None,
    cfg: Config,
    fault: Fault | None = None,
    progress: Progress = QUIET,
) -> tuple[dict[int, Tensor], dict | None]:
    """Local training of this rank's clients that take part (weight > 0), one after the other.

    Returns each trained client's mean (loss, loss_pos, loss_neg) and, for optim.optimizer_state=shared,
    the momentum to hand to the next client.
    """
    mode, losses = cfg.optim.optimizer_state, {}
    for client in progress.iterate(clients, f"round {round_idx + 1} clients"):
        if weights[client.client_id] == 0:
            continue
        result = train_client(
            fabric, tuner, client, split, transform, round_idx,
            local_epochs=cfg.federation.local_epochs, refresh_every=cfg.federation.refresh_every,
            batch_size=cfg.optim.batch_size, num_workers=cfg.data.num_workers, seed=cfg.run.seed,
            optimizer_state={"reset": None, "client": client.optimizer_state, "shared": carried_optimizer}[mode],
            log_every_n_steps=cfg.run.log_every_n_steps, progress=progress,
        )
        client.optimizer_state = result.optimizer_state if mode == "client" else None
        carried_optimizer = result.optimizer_state if mode == "shared" else None
        losses[client.client_id] = torch.tensor([result.loss, result.loss_pos, result.loss_neg])
        if fault is not None and len(losses) == 1:
            fault.trigger("train", round_idx, fabric.global_rank)
    return losses, carried_optimizer


def aggregate(
    collectives: Collectives, clients: list[ClientState], shared: dict[str, Tensor], weights: Tensor, num_clients: int
) -> dict[str, Tensor]:
    """Average each shared prompt over the clients that trained (weights |D~_k|, in client-id order) and
    hand the average to every client, also those that sat the round out. Every rank calls this."""
    averaged = {}
    for name, current in shared.items():
        uploads = {c.client_id: getattr(c, name) for c in clients if weights[c.client_id] > 0}
        stacked = collectives.gather_clients(uploads, num_clients, like=current, what=f"{name} prompts")  # (K, *shape)
        average = weighted_average(stacked, weights)
        averaged[name] = current if average is None else average
        for client in clients:
            setattr(client, name, averaged[name])
    return averaged


def evaluate_clients(
    fabric: Fabric,
    collectives: Collectives,
    model: PromptedCLIP,
    clients: list[ClientState],
    split: ImageSplit,
    transform,
    cfg: Config,
    zero_shot_text: Tensor | None = None,
    with_confusion: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(K, 2) [correct, total] of every client on its own test set with its prompts (the global visual
    prompt and its own text prompt), or zero-shot CLIP with `zero_shot_text`; and with `with_confusion`
    the clients' (K, C, C) confusion matrices from the same pass (else None)."""
    counts, confusions = {}, {}
    for client in clients:
        model.load_prompts(client.visual, client.text_ctx)
        labels = torch.from_numpy(split.labels[client.test_indices])
        images = ClientImages(split, client.test_indices, transform, (labels,))
        loader = make_loader(images, cfg.optim.eval_batch_size, cfg.data.num_workers)
        logits, truth = predict(fabric, model, loader, zero_shot_text)
        counts[client.client_id] = correct_and_total(logits, truth)
        if with_confusion:
            confusions[client.client_id] = confusion_matrix(logits, truth)
    num_clients, num_classes = cfg.federation.num_clients, model.text_prompt.prefix.shape[0]
    like = torch.zeros(2, dtype=torch.long)
    accuracy = collectives.gather_clients(counts, num_clients, like=like, what="test accuracy counts")
    if not with_confusion:
        return accuracy, None
    like = torch.zeros(num_classes, num_classes, dtype=torch.long)
    return accuracy, collectives.gather_clients(confusions, num_clients, like=like, what="confusion matrices")
