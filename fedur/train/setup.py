"""What a rank builds before the first round: the frozen backbone with its prompt slots, the data (decoded
once into the image cache) and its split across clients, and the state of the clients placed on it."""

from __future__ import annotations

import os

import numpy as np
import torch
from lightning import Fabric

from fedur.config import Config
from fedur.data.cache import prepare_splits, stderr_progress
from fedur.data.datasets import ImageDataset, build_dataset
from fedur.data.partition import class_histogram, split_clients
from fedur.federated.collectives import Collectives
from fedur.federated.placement import clients_on_rank
from fedur.labels import build_labeller
from fedur.methods import build_method
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import load_clip, zero_shot_weights
from fedur.train.client import ClientState
from fedur.train.module import PromptTuner
from fedur.train.progress import Progress
from fedur.train.rank import LocalWork, Rank


def setup(
    fabric: Fabric, collectives: Collectives, cfg: Config, progress: Progress
) -> tuple[Rank, tuple[np.ndarray, np.ndarray], list[str]]:
    """This rank; every client's (K, C) class counts of its train and of its test images (the split is the
    same pure function on every rank); and the images left out as unreadable (data.corrupt_images: skip)."""
    d, fed, optim = cfg.data, cfg.federation, cfg.optim
    method = build_method(cfg.method)
    labeller = build_labeller(method.labeller, cfg.labels, d.name)
    with fabric.rank_zero_first():  # rank 0 downloads and decodes, the others then read its copy
        torch.manual_seed(cfg.run.seed)  # a random-init backbone must be the same on every rank
        clip = load_clip(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
        dataset = load_data(cfg)
        loading = prepare_splits(
            dataset.train, dataset.test, clip.preprocess, clip.image_size, cache=d.cache, cache_dir=d.cache_dir,
            dataset_key=f"{d.name}:{os.path.abspath(d.root) if d.root else ''}", corrupt=d.corrupt_images,
            progress=stderr_progress() if fabric.is_global_zero and cfg.run.progress else None,
        )
    dataset.train, dataset.test = loading.train, loading.test  # without skipped images, rows of the cache
    train_parts, test_parts = split_clients(
        fed.partition, dataset.train.labels, dataset.test.labels, dataset.train.domains, dataset.test.domains,
        num_clients=fed.num_clients, beta=fed.beta, class_fraction=fed.class_fraction,
        clients_per_domain=fed.clients_per_domain, seed=fed.partition_seed, min_train=fed.min_train_per_client,
        dataset=d.name,
    )
    model = PromptedCLIP(
        clip, dataset.classnames, cfg.model.n_ctx, method.visual_tokens(cfg.model.visual_tokens), cfg.model.visual_depth, cfg.model.ctx_init_std,
        cfg.run.seed, local_text=method.local_text,
    )
    model.shared_prefix_text = cfg.model.shared_prefix_text
    model.normalize = loading.normalize  # cached uint8 batches are normalised on the device
    tuner = PromptTuner(
        model, method, labeller, optim.lr, optim.momentum, optim.weight_decay, fed.local_epochs, fed.refresh_every,
    ).to(fabric.device)
    start = model.prompts(method.prompts)  # every client starts from the same prompts
    local_ids = clients_on_rank(fed.num_clients, fabric.world_size, fabric.global_rank, cfg.run.clients_per_step)
    clients = [ClientState(k, train_parts[k], test_parts[k], dict(start)) for k in local_ids]
    work = LocalWork(optim.batch_size, optim.eval_batch_size, d.num_workers, cfg.run.seed, cfg.run.log_every_n_steps,
                     cfg.run.clients_per_step)
    zero_shot_text = zero_shot_weights(clip, dataset.classnames, dataset.template, fabric.device)
    rank = Rank(fabric, collectives, tuner, clients, dataset, loading.transform, zero_shot_text, fed.num_clients, work, progress)
    counts = tuple(class_histogram(s.labels, parts, dataset.num_classes)
                   for s, parts in ((dataset.train, train_parts), (dataset.test, test_parts)))
    return rank, counts, loading.skipped


def load_data(cfg: Config) -> ImageDataset:
    d = cfg.data
    return build_dataset(
        d.name, d.root, d.classnames_file, d.template, d.download, d.train_fraction, d.test_fraction, data_seed(cfg),
        d.synthetic_classes, d.synthetic_train_per_class, d.synthetic_test_per_class, d.synthetic_image_size,
        domains=d.domains, domainnet_classes=d.domainnet_classes, holdout_fraction=d.holdout_fraction,
        holdout_seed=d.holdout_seed, ucf101_include_val=d.ucf101_include_val,
    )


def data_seed(cfg: Config) -> int:
    """The seed of the generated images and of the train/test fractions: the partition's, so that the run
    seed changes only the prompts' init and the data order (as in the reference), not the data."""
    seed = cfg.federation.partition_seed
    return 500 if seed == "reference" else seed


def describe(rank: Rank, cfg: Config) -> str:
    """The run's first line: the data, the federation and where it runs."""
    fed, dataset = cfg.federation, rank.dataset
    return (
        f"fedur: {dataset.name} ({dataset.num_classes} classes, {len(dataset.train)} train / {len(dataset.test)} test), "
        f"{fed.num_clients} clients on {rank.fabric.world_size} rank(s), {fed.partition} split, "
        f"{fed.rounds} rounds x {fed.local_epochs} local epochs, method {rank.method.name} with labeller "
        f"{rank.tuner.labeller.describe()}, device {rank.fabric.device}"
    )
