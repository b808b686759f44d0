"""A parsed Config settled once, before anything is loaded or launched: the values that follow from others, and
the checks the annotations cannot make (settings that must fit together, whether the model and the data can be
had). Every refusal is a ConfigError (or the data's or model's own FedurError) in one line."""

from __future__ import annotations

import sys

from fedur import channel
from fedur.channel import clock
from fedur.config import Config, new_client_count
from fedur.data.split_file import count_clients
from fedur.errors import ConfigError
from fedur.launch_env import LaunchEnv
from fedur.methods.backbones import check_backbone
from fedur.model.clip import check_model
from fedur.train import faults
from fedur.train.trackers import check_trackers


def settle(cfg: Config, env: LaunchEnv) -> Config:
    """`cfg` settled in place (and returned): federation.num_clients from the clients' own folders or the split file,
    fabric.precision as this launch resolves it (auto is not the same on CPU and GPU); then checked. Settling a
    settled Config changes nothing."""
    settle_num_clients(cfg)
    if env.precision_error():
        raise ConfigError(env.precision_error())
    cfg.fabric.precision = env.resolved_precision(cfg.fabric)
    check(cfg, env)
    return cfg


def settle_num_clients(cfg: Config) -> int | None:
    """With federation.partition clients or file the clients come from the dataset's folders or the split file:
    federation.num_clients becomes their number (returned; None for fedur's own splits)."""
    fed = cfg.federation
    if fed.partition_file is not None and fed.partition != "file":
        raise ConfigError(f"federation.partition_file is read only with federation.partition=file (not "
                          f"{fed.partition}); set both, or drop the file")
    own = cfg.dataset.client_names()
    if fed.partition == "file":
        if fed.partition_file is None:
            raise ConfigError("federation.partition=file needs federation.partition_file: a JSON or CSV split "
                              "(e.g. an earlier run's partition.json; docs/own-data.md)")
        fed.num_clients = count_clients(fed.partition_file)
    elif fed.partition == "clients":
        if own is None:
            raise ConfigError(f"federation.partition=clients takes each client's own folder, and dataset "
                              f"{type(cfg.dataset).__name__} has none: use dataset ClientFolders, or a split of fedur's")
        fed.num_clients = len(own)
    elif own is not None:
        raise ConfigError(f"dataset {type(cfg.dataset).__name__} brings its own {len(own)} clients: set "
                          f"federation.partition=clients (or file), not {fed.partition}")
    else:
        return None
    return fed.num_clients


def check(cfg: Config, env: LaunchEnv) -> None:
    """What the annotations cannot check, on a settled Config."""
    labeller = cfg.method.pair(cfg.labeller)
    fed = cfg.federation
    training = fed.num_clients - new_client_count(cfg.evaluation.new_clients, fed.num_clients)
    channel.check(cfg.stages, cfg.method, labeller, training, fed.join_rate)  # the exchange's stages and their composition
    if cfg.privacy.mode != "none":  # every refusal of the privacy settings, before anything is loaded
        from fedur.privacy import Federation, build

        build(cfg.privacy, Federation(training, fed.join_rate, cfg.run.seed, cfg.method.rounds(fed.rounds), fed.refresh_every),
              labeller, cfg.method)
    clock.client_speeds(cfg.clock.speeds, training, cfg.clock.speed_spread, cfg.run.seed, cfg.clock.bandwidth)  # a speeds file
    held_out = cfg.evaluation.base_to_novel or cfg.evaluation.held_out_domain is not None
    if held_out and cfg.federation.partition == "file":
        raise ConfigError("evaluation.base_to_novel and evaluation.held_out_domain choose the clients' images themselves; "
                          "they do not combine with federation.partition=file (a split given image by image)")
    if cfg.run.clients_per_step > 1 and cfg.optim.optimizer_state == "shared":
        raise ConfigError("run.clients_per_step > 1 trains clients at once, so no momentum can pass from one to the "
                          "next (optim.optimizer_state=shared); use optim.optimizer_state=client or reset")
    env.layout(cfg.fabric)  # under torchrun: the settings name the processes it started
    world, clients, group = env.expected_world_size(cfg.fabric), cfg.federation.num_clients, cfg.run.clients_per_step
    if cfg.optim.optimizer_state == "shared" and world > 1:
        raise ConfigError("optim.optimizer_state=shared passes momentum from client to client and needs one rank")
    groups = -(-clients // group)
    if groups < min(world, clients) and env.is_rank_zero:  # groups are placed whole: some ranks get no client
        print(f"fedur: warning: run.clients_per_step={group} makes {groups} group(s) of {clients} clients for {world} "
              f"ranks: {world - groups} rank(s) will host no client; a smaller run.clients_per_step spreads them",
              file=sys.stderr)
    if env.precision_warning(cfg.fabric) and env.is_rank_zero:
        print(f"fedur: warning: {env.precision_warning(cfg.fabric)}", file=sys.stderr)
    if cfg.dataset.test_only:
        raise ConfigError(f"{type(cfg.dataset).__name__} is a test set only; train on another dataset (ImageNet for ImageNet's "
                          f"shifted sets) and test the run on it with fedur-cross-dataset RUN --dataset {type(cfg.dataset).__name__}")
    faults.injected()
    check_model(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
    check_backbone(cfg.method, cfg.model.name, cfg.model.visual_tokens)  # the method's prompts fit the model's towers
    check_trackers(cfg.run.loggers)  # every run.loggers library is installed
    cfg.dataset.check()
