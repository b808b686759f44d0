"""A parsed Config settled once, before anything is loaded or launched: the values that follow from others, and
the checks the annotations cannot make (settings that must fit together, whether the model and the data can be
had). Every refusal is a ConfigError (or the data's or model's own FedurError) in one line."""

from __future__ import annotations

import sys

from fedur.config import Config, new_client_count
from fedur.data.split_file import count_clients
from fedur.errors import ConfigError
from fedur.launch_env import LaunchEnv
from fedur.methods.backbones import check_backbone
from fedur.model.clip import check_model
from fedur.train import faults


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


def check_uploads(cfg: Config, labeller, held: int) -> None:
    """The refusals of how clients answer (federation.drop_rate ... clip_norm; fedur/train/uploads.py), in one line."""
    from fedur.federated.attacks import MODEL_ATTACKS
    from fedur.methods.base import shared_names
    from fedur.train.uploads import build

    fed, method = cfg.federation, cfg.method
    build(fed, fed.num_clients - held, cfg.run.seed, cfg.optim.batch_size, fed.local_epochs)
    robust = fed.aggregator != "mean"
    if robust and (method.summed or not shared_names(method)):
        what = "sums its clients' statistics (Method.summed)" if method.summed else "shares no piece"
        raise ConfigError(f"federation.aggregator={fed.aggregator} combines the clients' uploads of the shared pieces, and "
                          f"{type(method).__name__} {what}; use federation.aggregator=mean")
    if fed.attack in MODEL_ATTACKS and not shared_names(method):
        raise ConfigError(f"federation.attack={fed.attack} replaces a client's update of the shared pieces, and "
                          f"{type(method).__name__} shares none; label_flip poisons its pseudo-labels instead")
    if fed.attack == "label_flip" and labeller is None:
        raise ConfigError(f"federation.attack=label_flip flips pseudo-labels, and {type(method).__name__} has none")
    if cfg.privacy.mode != "none":
        combined = [key for key, on in (("federation.drop_rate", fed.drop_rate > 0), ("federation.over_select", fed.over_select > 0),
                                        ("federation.aggregator", robust)) if on]
        if combined:
            raise ConfigError(f"privacy.mode={cfg.privacy.mode} does not combine with {', '.join(combined)} yet: the "
                              "private release is the noised mean of every drawn client's update (a lost histogram, a "
                              "surplus upload or a robust rule over the rows is not in its accounting); "
                              "federation.deadline and attackers do combine")
    if fed.over_select and fed.join_rate == 1:
        raise ConfigError("federation.over_select asks more clients than federation.join_rate draws, and join_rate 1 "
                          "draws every client already; lower join_rate")


def check(cfg: Config, env: LaunchEnv) -> None:
    """What the annotations cannot check, on a settled Config."""
    labeller = cfg.method.pair(cfg.labeller)
    held = new_client_count(cfg.evaluation.new_clients, cfg.federation.num_clients)
    if cfg.privacy.mode != "none":  # every refusal of the privacy settings, before anything is loaded
        from fedur.privacy import Federation, build

        fed = cfg.federation
        federation = Federation(fed.num_clients - held, fed.join_rate, cfg.run.seed, cfg.method.rounds(fed.rounds), fed.refresh_every)
        build(cfg.privacy, federation, labeller, cfg.method)
    check_uploads(cfg, labeller, held)
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
    cfg.dataset.check()
