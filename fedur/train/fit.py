"""The federated round loop: the run's skeleton, with every client a piece of state on some Fabric rank and the
method asked a few named questions (fedur/methods/base.py). A round itself is fedur/train/round.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from lightning import Fabric
from torch import Tensor

from fedur import channel as channels
from fedur.config import Config, result_settings
from fedur.federated.client import ClientState
from fedur.federated.collectives import Collectives
from fedur.federated.placement import placement_table
from fedur.launch_env import Startup, software_environment
from fedur.privacy import Federation, Privacy, build
from fedur.privacy.releases import secret_seed
from fedur.train import checkpoint, label_free
from fedur.train.asynchronous import run_step
from fedur.train.evaluate import evaluate_zero_shot
from fedur.train.host import Host
from fedur.train.module import Optimization, PromptTuner
from fedur.train.new_clients import adapt_new_clients
from fedur.train.predictions import write_predictions
from fedur.train.preemption import StopRequest
from fedur.train.progress import Progress
from fedur.train.recorder import Recorder
from fedur.train.round import RoundPlan, run_round
from fedur.train.round_metrics import RoundOutcome, domain_summary, round_record
from fedur.train.run_dir import History, RunDir
from fedur.train.server import ServerState
from fedur.train.setup import Truth, describe, setup
from fedur.train.state import RunState

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # agreed as max over ranks: SIGUSR1 (requeue) wins


@dataclass
class FitResult:
    summary: dict | None  # None when the run stopped early on a signal (it resumes from its checkpoint)
    host: Host  # what this process held, with its clients' final prompts
    global_pieces: dict[str, Tensor]  # the last aggregate of each shared piece ("visual", "text_ctx", ...)
    stopped_by: str | None = None  # the signal that stopped the run early

    @property
    def clients(self) -> list[ClientState]:
        return self.host.clients

    @property
    def tuner(self) -> PromptTuner:
        return self.host.tuner


def fit(fabric: Fabric, cfg: Config, run_dir: RunDir, resume: checkpoint.Committed | None = None,
        stop: StopRequest | None = None, settings: dict | None = None, checked: Callable[[], None] = lambda: None,
        startup: Startup | None = None) -> FitResult:
    """Run (or continue, from `resume`) the federated rounds; `stop` ends the run after a round's commit.
    `settings`: the result-affecting settings every commit records (default: config.result_settings, read now).
    `checked`: called once every check has passed, before the run directory changes (a refused resume leaves it
    as it was: fedur/app/run.py keeps its claim on the directory from then on). `startup`: the process's clock
    (summary.json's startup_seconds; None: from now)."""
    settings = result_settings(cfg.settings) if settings is None else settings
    startup = startup or Startup(time.time())
    start_round = 0 if resume is None else resume.round_idx + 1
    collectives = Collectives(fabric, peer_timeout=cfg.run.peer_timeout)
    progress = Progress(enabled=cfg.run.progress and fabric.is_global_zero)  # rank 0's bars; the others stay quiet
    with startup.timing("setup"):
        host, truth, skipped = setup(fabric, collectives, cfg, progress)
    saved = None if resume is None else checkpoint.restore(resume, host.clients)  # its clients against the checkpoint
    numbering = checkpoint.FORMAT if resume is None else resume.marker.format  # a run keeps its numbering
    history = run_dir.history(start_round, fabric.is_global_zero, checkpoint.first_round(numbering))
    server = ServerState.start(host.method, host.model, host.start)
    plan = round_plan(cfg, host, truth, server)
    plan.channel.clock.check_deadline(sum(server.upload_bytes().values()))  # (a refusal leaves no run directory)
    checked()
    if fabric.is_global_zero:  # only now: a run that fails while loading leaves no directory behind
        run_dir.root.mkdir(parents=True, exist_ok=True)
    collectives.barrier("run directory")
    recorder = open_recorder(host, cfg, run_dir, history, start_round, truth, skipped)
    if host.memory is not None:  # run.memory_estimate: before any compute on the model
        recorder.note(host.memory.describe())
    state = RunState(server, channel=plan.channel, secret_seed=host.secret_seed)
    if saved is None:
        with startup.timing("zero_shot"):
            seen = label_free.Seen()
            counts, held_out = evaluate_zero_shot(host, seen)
            zero_shot = label_free.zero_shot(host, seen, host.label_free)  # its estimates without labels, calibration
        recorder.record_zero_shot(counts, host.training, held_out, zero_shot)
    else:
        state.load_state_dict(saved)
        host.secret_seed = state.secret_seed
        next_one = f"round {start_round + 1} of {cfg.federation.rounds}" if plan.channel.server.synchronous else \
            f"server step {start_round + 1} of {plan.rounds}"
        recorder.note(f"resumed from {resume.folder} ({next_one} is next)")
    for line in plan.channel.describe():  # (after a resume: with the clip it restored)
        recorder.note(line)

    recorder.startup = startup.seconds(time.time())  # everything before round 1
    last, start_time, wall_before = None, time.perf_counter(), state.wall_seconds
    wall = lambda: wall_before + time.perf_counter() - start_time  # noqa: E731  (over every session of the run)
    server = plan.channel.server  # rounds, or an asynchronous server's steps (docs/asynchronous.md)
    advance, unit = (run_round, "rounds") if server.synchronous else (run_step, "server steps")
    for round_idx in progress.iterate(range(start_round, plan.rounds), unit, total=plan.rounds, initial=start_round):
        stop_line = plan.channel.stop_before(round_idx, plan.rounds, plan.refreshes(round_idx, host.tuner.labeller))
        if stop_line:  # (privacy.target_epsilon: this round's releases would pass it)
            recorder.note(stop_line)
            break
        last = advance(host, state, round_idx, plan)
        recorder.record_round(round_record(last, history.first_round))
        state.wall_seconds = wall()
        marker = checkpoint.Marker(round_idx, host.num_clients, fabric.world_size, settings, format=numbering)
        checkpoint.save_round(host, run_dir.root, state, marker, cfg.run.keep_checkpoints)
        received = agreed_stop(collectives, stop)
        if received and round_idx + 1 < plan.rounds:
            return stop_early(host, stop, state, round_idx, plan.rounds, received)
    if plan.channel.system:
        recorder.record_virtual_time()
    summary = finish(host, cfg, run_dir, recorder, state, plan, last, wall)
    return FitResult(summary, host, state.server.shared)


def round_plan(cfg: Config, host: Host, truth: Truth, server: ServerState) -> RoundPlan:
    """The run's RoundPlan from its settings, with its channel (fedur/channel/). Every rank calls this (the clients'
    train sizes are gathered, privacy's secret seed broadcast)."""
    fed, optim = cfg.federation, cfg.optim
    sizes = {c.client_id: torch.tensor(len(c.train_indices), device="cpu") for c in host.clients}
    train_sizes = host.gather(sizes, like=torch.tensor(0, device="cpu"), what="train sizes")
    rounds, num_training = host.method.rounds(fed.rounds), int(host.training.sum())
    host.secret_seed = secret(cfg, host)
    privacy = private_releases(cfg, host, server, rounds, train_sizes)
    channel = channels.build(cfg.stages, privacy, num_training, cfg.run.seed, optim.batch_size, fed.local_epochs,
                             fed.join_rate)
    return RoundPlan(
        rounds=channel.server.run_steps(rounds), refresh_every=fed.refresh_every, join_rate=fed.join_rate, seed=cfg.run.seed,
        optim=Optimization(optim.lr, optim.momentum, optim.weight_decay, fed.local_epochs, fed.refresh_every, optim.schedule,
                           optim.cosine_epochs, optim.warmup_epochs, optim.warmup_lr),
        optimizer_state=optim.optimizer_state, global_model=cfg.evaluation.global_model,
        train_sizes=train_sizes, train_labels=truth.train_labels, channel=channel,
    )


def private_releases(cfg: Config, host: Host, server: ServerState, rounds: int, train_sizes: torch.Tensor) -> Privacy | None:
    """privacy.mode central | local: the run's mechanism and its accountant (None: privacy off). Every rank calls this
    (the secret seed is broadcast)."""
    if cfg.privacy.mode == "none":
        return None
    training = host.training
    federation = Federation(int(training.sum()), cfg.federation.join_rate, host.secret_seed, rounds,
                            cfg.federation.refresh_every, train_sizes[training])
    return build(cfg.privacy, federation, host.tuner.labeller, host.method, {**server.shared, **server.messages})


def secret(cfg: Config, host: Host) -> int | None:
    """The run's secret seed where it draws noise nobody may replay (privacy on, or a method's own secret noise:
    ClientSide.draws_secret_noise): privacy.noise_seed, or drawn from the operating system's randomness on rank 0 and
    broadcast (a resume continues the saved one). None: the run draws none. Every rank calls this."""
    if cfg.privacy.mode == "none" and not host.method.draws_secret_noise:
        return None
    if cfg.privacy.noise_seed is not None:
        return cfg.privacy.noise_seed
    return host.fabric.broadcast(secret_seed() if host.fabric.is_global_zero else None, src=0)


def open_recorder(host: Host, cfg: Config, run_dir: RunDir, history: History, start_round: int, truth: Truth,
                  skipped: list[str]) -> Recorder:
    """Rank 0's sink, with what a run writes before its first round: config.yaml, its first line, placement.json,
    partition.json, and what it says once. Every rank calls this (the placement is gathered)."""
    recorder = Recorder(run_dir, host.fabric.is_global_zero, history, start_round, host.progress, cfg.run.figures,
                        tuple(cfg.run.loggers))
    recorder.start(cfg.yaml(), describe(host, cfg))
    recorder.record_placement(gather_placement(host))
    recorder.record_partition(truth.partition)
    recorder.note_skipped(skipped)
    recorder.note_unlabelled(truth.train_labels is not None, host.dataset.test.labelled and len(host.dataset.test) > 0)
    return recorder


def finish(host: Host, cfg: Config, run_dir: RunDir, recorder: Recorder, state: RunState, plan: RoundPlan,
           last: RoundOutcome | None, wall: Callable[[], float]) -> dict:
    """After the last round: the confusion matrix, the new clients' adaptation (after the last commit: a resume
    adapts them again, the same way), the final prompts, the predictions of data without labels, summary.json."""
    fabric, fed, method, labeller = host.fabric, cfg.federation, host.method, host.tuner.labeller
    if last is not None and last.confusion is not None:  # None: a resumed run that had already finished its rounds
        recorder.record_confusion(last.confusion, host.dataset.classnames)
    if host.new_clients and method.trains:
        epochs = cfg.evaluation.new_client_epochs or fed.local_epochs
        adaptation = replace(plan.optim, local_epochs=epochs, refresh_every=1, cosine_epochs=None, warmup_epochs=0)  # one cosine cycle
        recorder.record_adapted(adapt_new_clients(host, labeller, adaptation, cfg.evaluation.new_client_labels == "zero_shot",
                                                  plan.train_sizes, plan.rounds, plan.train_labels), host.training)
    training = torch.nonzero(host.training).flatten().tolist()
    without_labels = label_free.summary(recorder.rounds, recorder.zero_shot, host.label_free, training)
    if "label_free_choice" in without_labels and recorder.rounds:  # each client's chosen model, by the rank hosting it
        label_free.check_and_save_choice(host, without_labels["label_free_choice"], run_dir.path("prompts/chosen"))
    host.collectives.close()
    checkpoint.save_prompts(run_dir.path("prompts"), state.server.shared, host.clients, write_shared=fabric.is_global_zero)
    recorder.record_reliability()
    if plan.train_labels is None or not recorder.test_labels:  # data without labels: what the model says per image
        write_predictions(host, run_dir.path("predictions"), cfg.dataset.root)
    wall_seconds = wall()
    final = recorder.rounds[-1]["client_accuracy"] if recorder.rounds else recorder.zero_shot.get("zero_shot_client_accuracy")
    domains = domain_summary(final, host.dataset, fed.partition, fed.num_clients, fed.clients_per_domain)
    host.images.close()
    return recorder.finish(cfg.settings, {
        "num_clients": fed.num_clients, "world_size": fabric.world_size, "wall_seconds": wall_seconds,
        "dataset": host.dataset.name, "method": method.key, "labeller": None if labeller is None else labeller.key,
        "skipped_images": recorder.skipped, "train_labels": plan.train_labels is not None, "test_labels": recorder.test_labels,
        **domains, **plan.channel.summary(recorder.rounds), **without_labels, "template": host.dataset.template,
        "environment": software_environment(fabric.device),
        **({} if host.memory is None else {"memory": host.memory.as_dict()})})


def gather_placement(host: Host) -> dict:
    """placement.json: which node and local rank every rank is, and the clients it hosts."""
    fabric = host.fabric
    ranks = host.collectives.gather_ranks(torch.tensor([fabric.node_rank, fabric.local_rank], device="cpu"), what="placement")
    environment = getattr(fabric.strategy, "cluster_environment", None)
    name = type(environment).__name__ if environment is not None else None
    return placement_table(host.num_clients, [tuple(r) for r in ranks.tolist()], name, host.work.clients_per_step)


def agreed_stop(collectives: Collectives, stop: StopRequest | None) -> str | None:
    """The stop signal any rank received since the last round (SIGUSR1, a requeue, wins), or None. Every rank calls
    this."""
    code = STOP_SIGNALS.index(stop.received) + 1 if stop is not None and stop.received else 0
    code = collectives.max_over_ranks(code, what="stop request")
    return STOP_SIGNALS[code - 1] if code else None


def stop_early(host: Host, stop: StopRequest, state: RunState, round_idx: int, rounds: int, received: str) -> FitResult:
    host.collectives.close()
    host.images.close()
    if host.fabric.is_global_zero:
        print(f"stopped after round {round_idx + 1} of {rounds} on {received}; the checkpoint is committed")
        stop.received = stop.received or received  # a peer's signal counts as this rank's
        outcome = stop.requeue()
        if outcome:
            print(outcome)
    return FitResult(None, host, state.server.shared, stopped_by=received)
