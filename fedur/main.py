"""fedur's entry point.

    fabric run --devices 8 fedur/main.py --config configs/cifar10.yaml [--group.key value ...]
    python fedur/main.py --config configs/smoke.yaml            (Fabric launches the ranks itself)

Settings come from YAML files (`--config`, repeatable, later wins) and `--group.key` overrides;
`--help` documents every key and `--print_config` prints the resolved settings.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: keep fedur/'s folders from shadowing top-level modules
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_parsing_settings

from fedur.config import GROUPS, Config, FabricConfig, result_settings
from fedur.data.datasets import DataUnavailableError, check_available
from fedur.data.partition import PartitionError
from fedur.federated.collectives import CollectiveError
from fedur.federated.placement import PlacementError
from fedur.model.clip import ModelUnavailableError, check_model
from fedur.train import checkpoint
from fedur.train.checkpoint import CheckpointError
from fedur.train.faults import parse_fault
from fedur.train.preemption import StopRequest
from fedur.train.recorder import ResumeError

SUPPORTED_PRECISION = ("32-true", "32", "bf16-mixed", "bf16")


class ConfigError(ValueError):
    """A setting is invalid; the message names the key and the accepted values."""


USER_ERRORS = (
    ConfigError, DataUnavailableError, ModelUnavailableError, PartitionError, PlacementError, CheckpointError, ResumeError,
)


def build_parser() -> ArgumentParser:
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog="fedur",
        description="FedUR: federated unsupervised visual recognition with CLIP, every client on a Lightning "
        "Fabric rank. Launch with `fabric run [--devices N] fedur/main.py ...` or `python fedur/main.py ...`.",
        default_config_files=[],
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML settings file (repeatable; later wins).")
    parser.add_argument(
        "--check_data", action="store_true",
        help="Check the dataset's layout, print its image counts per split, class and domain, and exit without training.",
    )
    for name, group in GROUPS.items():
        parser.add_class_arguments(group, name, help=group.__doc__)
    return parser


def parse_config(argv: list[str] | None = None) -> tuple[Config, str]:
    """The typed settings and their resolved YAML (saved to the run directory)."""
    cfg, config_yaml, _ = parse_args(argv)
    return cfg, config_yaml


def parse_args(argv: list[str] | None = None) -> tuple[Config, str, Namespace]:
    parser = build_parser()
    namespace = parser.parse_args(argv)
    resolved = Namespace({name: namespace[name] for name in GROUPS})
    config_yaml = parser.dump(resolved)
    groups = parser.instantiate(resolved)
    return Config(**{name: groups[name] for name in GROUPS}), config_yaml, namespace


def validate(cfg: Config) -> None:
    """Reject bad settings before anything is loaded or launched."""
    fed, method, optim, model, data = cfg.federation, cfg.fedur, cfg.optim, cfg.model, cfg.data
    ranks = expected_world_size(cfg.fabric)
    checks = [
        (fed.num_clients >= 1, f"federation.num_clients must be >= 1, got {fed.num_clients}"),
        (fed.rounds >= 1, f"federation.rounds must be >= 1, got {fed.rounds}"),
        (fed.local_epochs >= 1, f"federation.local_epochs must be >= 1, got {fed.local_epochs}"),
        (fed.refresh_every >= 1, f"federation.refresh_every must be >= 1, got {fed.refresh_every}"),
        ("dirichlet" not in fed.partition or fed.beta > 0, f"federation.beta must be > 0, got {fed.beta}"),
        (0 < fed.class_fraction <= 1, f"federation.class_fraction must be in (0, 1], got {fed.class_fraction}"),
        (fed.clients_per_domain >= 1, f"federation.clients_per_domain must be >= 1, got {fed.clients_per_domain}"),
        (0 < fed.join_rate <= 1, f"federation.join_rate must be in (0, 1], got {fed.join_rate}"),
        (fed.min_train_per_client >= 1, "federation.min_train_per_client must be >= 1"),
        (model.n_ctx >= 0, f"model.n_ctx must be >= 0, got {model.n_ctx}"),
        (model.visual_tokens >= 0, f"model.visual_tokens must be >= 0, got {model.visual_tokens}"),
        (model.n_ctx + model.visual_tokens > 0, "model.n_ctx and model.visual_tokens are both 0: nothing to train"),
        (model.visual_depth is None or model.visual_depth >= 1, "model.visual_depth must be >= 1 or null"),
        (model.ctx_init_std >= 0, "model.ctx_init_std must be >= 0"),
        (0 < method.confidence_quantile < 1, "fedur.confidence_quantile must be in (0, 1)"),
        (0 < method.entropy_quantile < 1, "fedur.entropy_quantile must be in (0, 1)"),
        (0 < method.tau_neg < 1, f"fedur.tau_neg must be in (0, 1), got {method.tau_neg}"),
        (method.neg_loss_weight >= 0, "fedur.neg_loss_weight must be >= 0"),
        (optim.lr > 0, f"optim.lr must be > 0, got {optim.lr}"),
        (optim.momentum >= 0 and optim.weight_decay >= 0, "optim.momentum and optim.weight_decay must be >= 0"),
        (optim.batch_size >= 1 and optim.eval_batch_size >= 1, "optim batch sizes must be >= 1"),
        (0 < data.train_fraction <= 1 and 0 < data.test_fraction <= 1, "data fractions must be in (0, 1]"),
        (0 < data.holdout_fraction < 1, f"data.holdout_fraction must be in (0, 1), got {data.holdout_fraction}"),
        (data.num_workers >= 0, "data.num_workers must be >= 0"),
        (cfg.run.threads is None or cfg.run.threads >= 1, "run.threads must be >= 1 or null"),
        (cfg.run.keep_checkpoints >= 1, f"run.keep_checkpoints must be >= 1, got {cfg.run.keep_checkpoints}"),
        (cfg.run.peer_timeout > 0, f"run.peer_timeout must be > 0 seconds, got {cfg.run.peer_timeout}"),
        (cfg.run.wait_timeout > 0, f"run.wait_timeout must be > 0 seconds, got {cfg.run.wait_timeout}"),
        (cfg.run.requeue_deadline > 0, f"run.requeue_deadline must be > 0 seconds, got {cfg.run.requeue_deadline}"),
        (fed.num_clients >= ranks, f"federation.num_clients={fed.num_clients} is fewer "
         f"than the {ranks} ranks launched; every rank needs at least one client"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    cli_precision = os.environ.get("LT_PRECISION")
    if cli_precision is not None and cli_precision not in SUPPORTED_PRECISION:
        raise ConfigError(
            f"precision {cli_precision!r} from `fabric run --precision` is not supported; use 32-true or bf16-mixed "
            "(16-mixed keeps one GradScaler per process, which would couple the clients sharing a rank)"
        )
    try:
        parse_fault(cfg.run.fault)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    check_model(model.name, model.pretrained, model.config_file, model.cache_dir)
    check_available(data.name, data.root, data.download, domains=data.domains)


def resolve_resume(cfg: Config) -> checkpoint.Committed | None:
    """The committed round to continue from (None: a fresh run), with run.output_dir set to its run.

    Refuses, before any compute: a resume without a run directory or committed checkpoint, an unreadable
    checkpoint, and changed result-affecting settings (unless run.force_resume).
    """
    resume, run = cfg.run.resume, cfg.run
    if resume is False:
        return None
    if isinstance(resume, str) and resume != "auto":
        if run.output_dir is not None and Path(run.output_dir).resolve() != Path(resume).resolve():
            raise ConfigError(f"run.resume={resume} and run.output_dir={run.output_dir} name different runs; give one")
        if not Path(resume).is_dir():
            raise CheckpointError(f"run.resume={resume} does not exist; give the directory of the run to continue")
        run.output_dir = resume
    if run.output_dir is None:
        raise ConfigError("run.resume needs run.output_dir: the directory of the run to continue")
    committed = checkpoint.latest(Path(run.output_dir))
    if committed is None:
        if resume == "auto":  # nothing committed yet: start the run over
            if Path(run.output_dir).is_dir() and any(Path(run.output_dir).iterdir()):
                removed = checkpoint.clear_run_without_commit(Path(run.output_dir))
                print(f"fedur: {run.output_dir} holds no committed round; starting over (removed {', '.join(removed)})")
            return None
        raise CheckpointError(
            f"no committed checkpoint under {run.output_dir}/{checkpoint.CHECKPOINTS}/ to resume from "
            "(a run commits one after each round); start a new run instead"
        )
    if committed.marker["num_clients"] != cfg.federation.num_clients:
        raise ConfigError(
            f"the checkpoint in {committed.folder} has {committed.marker['num_clients']} clients, "
            f"federation.num_clients is {cfg.federation.num_clients}"
        )
    changed = settings_diff(committed.marker["settings"], result_settings(asdict(cfg)))
    if changed and not run.force_resume:
        raise ConfigError(
            f"settings that change results differ from the checkpoint in {committed.folder}:\n  "
            + "\n  ".join(changed) + "\nrestore them, or pass --run.force_resume true to continue anyway"
        )
    checkpoint.verify(committed, cfg.federation.num_clients)
    return committed


def settings_diff(saved: dict, now: dict) -> list[str]:
    keys = sorted(set(saved) | set(now))
    missing = "<absent>"
    return [
        f"{key}: {saved.get(key, missing)!r} (checkpoint) -> {now.get(key, missing)!r} (now)"
        for key in keys if saved.get(key, missing) != now.get(key, missing)
    ]


def expected_world_size(settings: FabricConfig) -> int:
    """The number of ranks this launch will have, known before any process group exists."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):  # torchrun / `fabric run`; srun
        if os.environ.get(var, "").isdigit() and (var != "SLURM_NTASKS" or _slurm_launch()):
            return int(os.environ[var])
    devices = os.environ.get("LT_DEVICES", settings.devices)
    nodes = int(os.environ.get("LT_NUM_NODES", settings.num_nodes))
    accelerator = os.environ.get("LT_ACCELERATOR", settings.accelerator)
    cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    elif str(devices) in ("auto", "-1"):
        count = torch.cuda.device_count() if cuda else 1
    else:
        count = int(devices)
    return max(count, 1) * nodes


def _slurm_launch() -> bool:
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect()


def resolve_precision(settings: FabricConfig) -> str | None:
    """'auto' is bf16-mixed on CUDA and 32-true on CPU; None defers to `fabric run --precision`."""
    if os.environ.get("LT_PRECISION") is not None or settings.precision != "auto":
        return None if os.environ.get("LT_PRECISION") is not None else settings.precision
    accelerator = os.environ.get("LT_ACCELERATOR", settings.accelerator)
    cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    return "bf16-mixed" if cuda else "32-true"


def effective_precision(settings: FabricConfig) -> str:
    """The precision the run computes in: `fabric run --precision`, else `fabric.precision` with auto resolved."""
    cli = os.environ.get("LT_PRECISION")
    if cli is not None:
        return {"32": "32-true", "bf16": "bf16-mixed"}.get(cli, cli)
    return resolve_precision(settings)


def make_fabric(settings: FabricConfig, wait_timeout: float = 10800.0):
    """Fabric with DDP's process-group timeout set to `wait_timeout`: how long a rank waits in a collective
    for live peers (dead peers are caught sooner by the heartbeat in federated/collectives.py)."""
    from lightning import Fabric
    from lightning.fabric.strategies import DDPStrategy

    strategy = os.environ.get("LT_STRATEGY", settings.strategy)
    if strategy in ("auto", "ddp", "ddp_spawn") and expected_world_size(settings) > 1:
        os.environ.pop("LT_STRATEGY", None)  # `fabric run --strategy ddp`: the same strategy, built here
        strategy = DDPStrategy(
            timeout=timedelta(seconds=wait_timeout), start_method="spawn" if strategy == "ddp_spawn" else "popen"
        )
    return Fabric(
        accelerator=settings.accelerator,
        strategy=strategy,
        devices=settings.devices,
        num_nodes=settings.num_nodes,
        precision=resolve_precision(settings),
    )


def set_threads(fabric, threads: int | None) -> int:
    """Compute threads per rank from the config, not from the launcher (fabric run sets OMP_NUM_THREADS)."""
    ranks_here = getattr(fabric.strategy, "num_processes", 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # SLURM's cpus
    threads = threads or max(1, cores // ranks_here)
    torch.set_num_threads(threads)
    return threads


def prepare_run_dir(fabric, output_dir: str | None, resuming: bool = False) -> Path:
    """The run directory (created by the round loop once the data and model are loaded); refuse one that
    already holds files (no run overwrites another) unless the run resumes there."""
    if output_dir is None:
        output_dir = fabric.broadcast(os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")), src=0)
    path = Path(output_dir)
    if not resuming and path.exists() and (not path.is_dir() or any(path.iterdir())):
        hint = " (it holds a checkpoint: add --run.resume true to continue it)" if checkpoint.committed_rounds(path) else ""
        raise ConfigError(f"run.output_dir={path} already exists and is not empty{hint}; choose a new run.output_dir")
    return path


def run(cfg: Config, config_yaml: str):
    from fedur.train.fit import fit

    cfg.fabric.precision = effective_precision(cfg.fabric)  # recorded resolved: auto is not the same on CPU and GPU
    resume = resolve_resume(cfg)
    if cfg.run.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    fabric = make_fabric(cfg.fabric, cfg.run.wait_timeout)
    if os.environ.get("LT_CLI_USED") != "1":  # under `fabric run` the processes already exist
        fabric.launch()
    if cfg.optim.optimizer_state == "shared" and fabric.world_size > 1:
        raise ConfigError("optim.optimizer_state=shared passes momentum from client to client and needs one rank")
    set_threads(fabric, cfg.run.threads)
    run_dir = prepare_run_dir(fabric, cfg.run.output_dir, resuming=resume is not None)
    requeue_on = tuple(cfg.run.requeue_on) if fabric.is_global_zero else ()
    with StopRequest(requeue_on=requeue_on, requeue_deadline=cfg.run.requeue_deadline) as stop:  # stop after a commit
        return fit(fabric, cfg, run_dir, config_yaml, resume, stop)


def check_data(cfg: Config) -> None:
    """`--check_data`: load the dataset as configured and print its counts; nothing is trained or written."""
    from fedur.data.inspect import dataset_report
    from fedur.train.setup import load_data

    print(dataset_report(load_data(cfg)))  # every loader checks its layout first


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines reach log files as they happen
    cfg, config_yaml, namespace = parse_args(argv)
    try:
        if namespace.check_data:
            return check_data(cfg)
        validate(cfg)
        run(cfg, config_yaml)
    except USER_ERRORS as err:
        print(f"fedur: error: {err}", file=sys.stderr)
        sys.exit(2)
    except CollectiveError as err:
        print(f"fedur: error: {err}", file=sys.stderr, flush=True)
        os._exit(1)  # the process group is broken: do not wait in its teardown


if __name__ == "__main__":
    main()
