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
from pathlib import Path

import torch
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_parsing_settings

from fedur.config import GROUPS, Config, FabricConfig
from fedur.data.datasets import DataUnavailableError, check_available
from fedur.data.partition import PartitionError
from fedur.federated.placement import PlacementError
from fedur.model.clip import ModelUnavailableError, check_model

SUPPORTED_PRECISION = ("32-true", "32", "bf16-mixed", "bf16")


class ConfigError(ValueError):
    """A setting is invalid; the message names the key and the accepted values."""


USER_ERRORS = (ConfigError, DataUnavailableError, ModelUnavailableError, PartitionError, PlacementError)


def build_parser() -> ArgumentParser:
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog="fedur",
        description="FedUR: federated unsupervised visual recognition with CLIP, every client on a Lightning "
        "Fabric rank. Launch with `fabric run [--devices N] fedur/main.py ...` or `python fedur/main.py ...`.",
        default_config_files=[],
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML settings file (repeatable; later wins).")
    for name, group in GROUPS.items():
        parser.add_class_arguments(group, name, help=group.__doc__)
    return parser


def parse_config(argv: list[str] | None = None) -> tuple[Config, str]:
    """The typed settings and their resolved YAML (saved to the run directory)."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    resolved = Namespace({name: namespace[name] for name in GROUPS})
    config_yaml = parser.dump(resolved)
    groups = parser.instantiate(resolved)
    return Config(**{name: groups[name] for name in GROUPS}), config_yaml


def validate(cfg: Config) -> None:
    """Reject bad settings before anything is loaded or launched."""
    fed, method, optim, model, data = cfg.federation, cfg.fedur, cfg.optim, cfg.model, cfg.data
    checks = [
        (fed.num_clients >= 1, f"federation.num_clients must be >= 1, got {fed.num_clients}"),
        (fed.rounds >= 1, f"federation.rounds must be >= 1, got {fed.rounds}"),
        (fed.local_epochs >= 1, f"federation.local_epochs must be >= 1, got {fed.local_epochs}"),
        (fed.refresh_every >= 1, f"federation.refresh_every must be >= 1, got {fed.refresh_every}"),
        (fed.partition != "dirichlet" or fed.beta > 0, f"federation.beta must be > 0, got {fed.beta}"),
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
        (data.num_workers >= 0, "data.num_workers must be >= 0"),
        (cfg.run.threads is None or cfg.run.threads >= 1, "run.threads must be >= 1 or null"),
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
    check_model(model.name, model.pretrained, model.config_file, model.cache_dir)
    check_available(data.name, data.root, data.download)


def resolve_precision(settings: FabricConfig) -> str | None:
    """'auto' is bf16-mixed on CUDA and 32-true on CPU; None defers to `fabric run --precision`."""
    if os.environ.get("LT_PRECISION") is not None or settings.precision != "auto":
        return None if os.environ.get("LT_PRECISION") is not None else settings.precision
    accelerator = os.environ.get("LT_ACCELERATOR", settings.accelerator)
    cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    return "bf16-mixed" if cuda else "32-true"


def make_fabric(settings: FabricConfig):
    from lightning import Fabric

    return Fabric(
        accelerator=settings.accelerator,
        strategy=settings.strategy,
        devices=settings.devices,
        num_nodes=settings.num_nodes,
        precision=resolve_precision(settings),
    )


def set_threads(fabric, threads: int | None) -> int:
    """Compute threads per rank from the config, not from the launcher (fabric run sets OMP_NUM_THREADS)."""
    ranks_here = getattr(fabric.strategy, "num_processes", 1)
    threads = threads or max(1, (os.cpu_count() or 1) // ranks_here)
    torch.set_num_threads(threads)
    return threads


def prepare_run_dir(fabric, output_dir: str | None) -> Path:
    """Create the run directory; refuse one that already holds files (no run overwrites another)."""
    if output_dir is None:
        output_dir = fabric.broadcast(os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")), src=0)
    path = Path(output_dir)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"run.output_dir={path} already exists and is not empty; choose a new run.output_dir")
    fabric.barrier()
    if fabric.is_global_zero:
        path.mkdir(parents=True, exist_ok=True)
    fabric.barrier()
    return path


def run(cfg: Config, config_yaml: str):
    from fedur.train.fit import fit

    if cfg.run.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    fabric = make_fabric(cfg.fabric)
    if os.environ.get("LT_CLI_USED") != "1":  # under `fabric run` the processes already exist
        fabric.launch()
    if cfg.optim.optimizer_state == "shared" and fabric.world_size > 1:
        raise ConfigError("optim.optimizer_state=shared passes momentum from client to client and needs one rank")
    set_threads(fabric, cfg.run.threads)
    run_dir = prepare_run_dir(fabric, cfg.run.output_dir)
    return fit(fabric, cfg, run_dir, config_yaml)


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines reach log files as they happen
    cfg, config_yaml = parse_config(argv)
    try:
        validate(cfg)
        run(cfg, config_yaml)
    except USER_ERRORS as err:
        print(f"fedur: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
