"""What a rank builds before the first round: the data (decoded once into the image cache) and its split
across clients, the frozen backbone with its prompt slots, and the state of the clients it hosts."""

from __future__ import annotations

import os

import torch
from lightning import Fabric

from fedur.config import Config
from fedur.data.cache import PreparedData, prepare_splits, stderr_progress
from fedur.data.datasets import ImageDataset, build_dataset
from fedur.data.partition import split_clients
from fedur.federated.placement import clients_on_rank
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import FrozenCLIP, load_clip
from fedur.train.client import ClientState
from fedur.train.module import PromptTuner


def setup(fabric: Fabric, cfg: Config) -> tuple[ImageDataset, FrozenCLIP, PromptTuner, list[ClientState], PreparedData]:
    """The data (decoded once into the image cache) and its split, the frozen backbone with its prompt
    slots on this rank, and this rank's clients."""
    d = cfg.data
    with fabric.rank_zero_first():  # rank 0 downloads and decodes, the others then read its copy
        dataset = load_data(cfg)
        torch.manual_seed(cfg.run.seed)  # a random-init backbone must be the same on every rank
        clip = load_clip(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
        loading = prepare_splits(
            dataset.train, dataset.test, clip.preprocess, clip.image_size, cache=d.cache, cache_dir=d.cache_dir,
            dataset_key=f"{d.name}:{os.path.abspath(d.root) if d.root else ''}", corrupt=d.corrupt_images,
            progress=stderr_progress() if fabric.is_global_zero and cfg.run.progress else None,
        )
    dataset.train, dataset.test = loading.train, loading.test  # without skipped images, rows of the cache
    fed, optim, method = cfg.federation, cfg.optim, cfg.fedur
    train_parts, test_parts = split_clients(
        fed.partition, dataset.train.labels, dataset.test.labels, dataset.train.domains, dataset.test.domains,
        num_clients=fed.num_clients, beta=fed.beta, class_fraction=fed.class_fraction,
        clients_per_domain=fed.clients_per_domain, seed=cfg.run.seed, min_train=fed.min_train_per_client,
    )
    model = PromptedCLIP(
        clip, dataset.classnames, cfg.model.n_ctx, cfg.model.visual_tokens, cfg.model.visual_depth,
        cfg.model.ctx_init_std, cfg.run.seed,
    )
    model.normalize = loading.normalize  # cached uint8 batches are normalised on the device
    tuner = PromptTuner(
        model, optim.lr, optim.momentum, optim.weight_decay, fed.refresh_every * fed.local_epochs,
        method.negatives, method.tau_neg, method.neg_loss_weight,
    ).to(fabric.device)
    visual, text = model.prompts()  # every client starts from the same prompts
    local_ids = clients_on_rank(fed.num_clients, fabric.world_size, fabric.global_rank)
    clients = [ClientState(k, train_parts[k], test_parts[k], visual, text) for k in local_ids]
    return dataset, clip, tuner, clients, loading


def load_data(cfg: Config) -> ImageDataset:
    d = cfg.data
    return build_dataset(
        d.name, d.root, d.classnames_file, d.template, d.download, d.train_fraction, d.test_fraction, cfg.run.seed,
        d.synthetic_classes, d.synthetic_train_per_class, d.synthetic_test_per_class, d.synthetic_image_size,
        domains=d.domains, domainnet_classes=d.domainnet_classes, holdout_fraction=d.holdout_fraction,
        holdout_seed=d.holdout_seed, ucf101_include_val=d.ucf101_include_val,
    )


def describe(fabric: Fabric, cfg: Config, dataset: ImageDataset, clients: list[ClientState]) -> str:
    sizes = [len(c.train_indices) for c in clients]
    return (
        f"fedur: {dataset.name} ({dataset.num_classes} classes, {len(dataset.train)} train / {len(dataset.test)} test), "
        f"{cfg.federation.num_clients} clients on {fabric.world_size} rank(s) "
        f"[rank 0 hosts {[c.client_id for c in clients]}, train sizes {min(sizes)}-{max(sizes)}], "
        f"{cfg.federation.partition} split, "
        f"{cfg.federation.rounds} rounds x {cfg.federation.local_epochs} local epochs, device {fabric.device}"
    )
