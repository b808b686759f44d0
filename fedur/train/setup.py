"""What a rank builds before the first round: the frozen backbone with its prompt slots, the data (decoded
once into the image cache) and its split across clients, and the state of the clients placed on it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from lightning import Fabric

from fedur.config import Config, new_client_count
from fedur.data.cache import CacheOptions, prepare_splits, stderr_progress
from fedur.data.datasets import DataOptions, ImageDataset, prepare_dataset
from fedur.data.held_out import hold_out
from fedur.data.loaders import ImageLoader
from fedur.data.partition import PartitionError, PartitionSpec, Parts, class_histogram, split_clients
from fedur.data.split_file import image_ids, keep_rows, left_out_ids, part_ids, read_split_file
from fedur.errors import FedurError
from fedur.federated.client import ClientState
from fedur.federated.collectives import Collectives
from fedur.federated.placement import clients_on_rank
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import load_clip, zero_shot_weights
from fedur.train.host import HeldOutSet, Host, LocalWork
from fedur.train.memory import MemoryEstimate, ModelSpec, estimate_memory
from fedur.train.module import PromptTuner
from fedur.train.progress import Progress


class SetupError(FedurError, ValueError):
    """The settings build a model the method cannot train; the message names them."""


@dataclass
class Truth:
    """What only monitoring reads, kept apart from the rank: once the split is made the rank's train split
    carries no labels, so no method, labeller or loader can train on one."""

    train_labels: np.ndarray | None  # (N,) the true label of every train row; None when the data has none
    partition: dict  # partition.json: the class counts per client (when labelled) and each client's image ids


def setup(
    fabric: Fabric, collectives: Collectives, cfg: Config, progress: Progress
) -> tuple[Host, Truth, list[str]]:
    """This process's Host (its dataset's train split without labels); the true train labels and the split as
    partition.json records it (the split is the same on every rank); and the images left out as unreadable
    (data.corrupt_images: skip)."""
    d, fed, optim, method = cfg.data, cfg.federation, cfg.optim, cfg.method
    labeller = method.pair(cfg.labeller)
    if labeller is not None:
        labeller.bind(cfg.dataset.key)
    with fabric.rank_zero_first():  # rank 0 downloads and decodes, the others then read its copy
        protocol = hold_out(load_data(cfg), cfg.evaluation.base_to_novel, cfg.evaluation.held_out_domain)
        dataset = protocol.dataset  # what the clients train on; the held-out test images stay in its test split
        given = read_split_file(fed.partition_file, dataset.train, dataset.test, cfg.dataset.root) \
            if fed.partition == "file" else None  # checked before the model is loaded and any image decoded
        torch.manual_seed(cfg.run.seed)  # a random-init backbone must be the same on every rank
        clip = load_clip(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
        raw = dataset.train, dataset.test  # before unreadable images are left out
        loading = prepare_splits(
            dataset.train, dataset.test, clip.preprocess, clip.image_size, cfg.dataset.cache_key,
            CacheOptions(d.cache, d.cache_dir, d.corrupt_images),
            progress=stderr_progress() if fabric.is_global_zero and cfg.run.progress else None,
        )
    dataset.train, dataset.test = loading.train, loading.test  # without skipped images, rows of the cache
    held_out = [replace(h, rows=keep_rows([h.rows], loading.test_kept)[0]) for h in protocol.held_out]
    if given is None:  # the clients split the test images not held out (all of them but for the protocols')
        rows = None if protocol.client_test_rows is None else keep_rows([protocol.client_test_rows], loading.test_kept)[0]
        test = dataset.test if rows is None else dataset.test.subset(rows)
        train_parts, test_parts = split_clients(partition_spec(cfg), dataset.train, test, cfg.dataset.key)
        test_parts = test_parts if rows is None else [rows[part] for part in test_parts]
        shared_test = fed.partition == "clients" and dataset.test.clients is None
    else:
        train_parts, shared_test = keep_rows(given[0], loading.train_kept), given[1] is None
        test_parts = [np.arange(len(dataset.test), dtype=np.int64)] * len(train_parts) if shared_test \
            else keep_rows(given[1], loading.test_kept)
    if fed.partition in ("clients", "file"):  # fedur's own splits keep min_train_per_client; these come as given
        emptied = [k for k, part in enumerate(train_parts) if len(part) == 0]
        if emptied:
            raise PartitionError(f"client(s) {', '.join(map(str, emptied))} have no train image left once the "
                                 f"unreadable ones were skipped (data.corrupt_images: skip); fix or remove those "
                                 f"images, or drop the client from the split")
    record = partition_record(dataset, train_parts, test_parts, shared_test, cfg.dataset.root)
    if loading.skipped:  # so that this run's partition.json replays: the images it left out, by their ids
        record["skipped_ids"] = {split: left_out_ids(data, kept, cfg.dataset.root)
                                 for split, data, kept in zip(("train", "test"), raw, (loading.train_kept, loading.test_kept))}
    truth = Truth(dataset.train.labels, record)
    dataset.train = dataset.train.without_labels()  # from here on, training cannot read a true train label
    model = PromptedCLIP(clip, dataset.classnames, cfg.model.n_ctx, cfg.model.visual_tokens, cfg.model.visual_depth,
                         cfg.model.ctx_init_std, cfg.run.seed, cfg.model.ctx_suffix)
    model.shared_prefix_text, model.checkpointing = cfg.model.shared_prefix_text, cfg.model.checkpointing
    model.normalize = loading.normalize  # cached uint8 batches are normalised on the device
    start = initial_values(method.pieces(), model, cfg.run.seed)  # every client starts from these, held on the CPU
    tuner = PromptTuner(model, method, labeller).to(fabric.device)
    if method.trains and not tuner.trained_names(start):
        raise SetupError(f"nothing to train: {type(method).__name__} has no prompt or other piece with elements "
                         f"({', '.join(start) or 'none declared'}) with model.n_ctx={cfg.model.n_ctx} and "
                         f"model.visual_tokens={cfg.model.visual_tokens}")
    model.zero_shot_text = zero_shot_weights(clip, dataset.classnames, dataset.template, fabric.device)  # after the move
    local_ids = clients_on_rank(fed.num_clients, fabric.world_size, fabric.global_rank, cfg.run.clients_per_step)
    clients = [ClientState(k, train_parts[k], test_parts[k], dict(start)) for k in local_ids]
    work = LocalWork(optim.batch_size, optim.eval_batch_size, cfg.run.seed, cfg.run.log_every_n_steps,
                     cfg.run.clients_per_step)
    images = ImageLoader({"train": dataset.train, "test": dataset.test}, loading.transform, d.num_workers,
                         pin_memory=fabric.device.type == "cuda")
    training = torch.arange(fed.num_clients, device="cpu") < fed.num_clients - new_client_count(cfg.evaluation.new_clients, fed.num_clients)
    test_owners = owners_of(test_parts, training, len(dataset.test))
    held = [HeldOutSet(h.name, h.rows, h.labels(dataset.test.labels), model.for_classes(h.classnames, dataset.template)
                       if h.classnames != dataset.classnames else model) for h in held_out]
    host = Host(fabric, collectives, tuner, clients, dataset, images, fed.num_clients, work, progress, start, training,
                test_owners, held, memory=memory_estimate(cfg, dataset.classnames, fabric))
    return host, truth, loading.skipped


def memory_estimate(cfg: Config, classnames: list[str], fabric: Fabric) -> MemoryEstimate | None:
    """Rank 0's estimate of a unit's peak memory (fedur/train/memory.py) where run.memory_estimate asks for one (auto:
    on a GPU); None elsewhere."""
    asked = cfg.run.memory_estimate
    if not fabric.is_global_zero or asked == "off" or (asked == "auto" and fabric.device.type != "cuda"):
        return None
    m = cfg.model
    spec = ModelSpec(m.name, tuple(classnames), m.n_ctx, m.visual_tokens, m.visual_depth, m.ctx_init_std, m.ctx_suffix,
                     m.shared_prefix_text, m.checkpointing)
    return estimate_memory(spec, cfg.method, cfg.optim.batch_size, cfg.optim.eval_batch_size, cfg.run.clients_per_step,
                           cfg.fabric.precision, cfg.run.seed)


def owners_of(test_parts: Parts, training, num_test: int) -> np.ndarray:
    """(n_test,) int64: for each test row, the lowest id of the training clients whose test set holds it (the one
    the global protocol scores it for: every image once), -1 where none does."""
    owners = np.full(num_test, -1, dtype=np.int64)
    for k in reversed(range(len(test_parts))):  # the lowest id written last
        if training[k]:
            owners[test_parts[k]] = k
    return owners


def partition_record(
    dataset: ImageDataset, train_parts: Parts, test_parts: Parts, shared_test: bool, root: str | None
) -> dict:
    """partition.json: the class names; each client's (K, C) class counts of its train and test images (null
    without labels); each client's train and test image ids (`fedur.data.split_file`: paths relative to
    dataset.root, or indices; test_ids null when every client is tested on the whole test set), which
    federation.partition=file reads back; and the clients' names when the data brings its own clients."""
    train, test, num_classes = dataset.train, dataset.test, dataset.num_classes
    return {
        "classnames": dataset.classnames,
        "train": _listed(class_histogram(train.labels, train_parts, num_classes)),
        "test": _listed(class_histogram(test.labels, test_parts, num_classes)),
        "train_sizes": [len(part) for part in train_parts],
        "test_sizes": [len(part) for part in test_parts],
        "client_names": dataset.client_names,
        "train_ids": part_ids(train_parts, image_ids(train, root)),
        "test_ids": None if shared_test else part_ids(test_parts, image_ids(test, root)),
    }


def _listed(hist: np.ndarray | None) -> list | None:
    return None if hist is None else hist.tolist()


def load_data(cfg: Config) -> ImageDataset:
    """The dataset as configured: loaded by its class, with the class names, template and fractions of `data:`."""
    d = cfg.data
    options = DataOptions(d.classnames_file, d.template, d.train_fraction, d.test_fraction)
    return prepare_dataset(cfg.dataset, options, data_seed(cfg))


def partition_spec(cfg: Config) -> PartitionSpec:
    fed = cfg.federation
    return PartitionSpec(fed.partition, fed.num_clients, fed.beta, fed.class_fraction, fed.clients_per_domain,
                         fed.partition_seed, fed.min_train_per_client)


def data_seed(cfg: Config) -> int:
    """The seed of the generated images and of the train/test fractions: the partition's, so that the run
    seed changes only the prompts' init and the data order (as in the reference), not the data."""
    seed = cfg.federation.partition_seed
    return 500 if seed == "reference" else seed


def describe(host: Host, cfg: Config) -> str:
    """The run's first line: the data, the federation and where it runs."""
    fed, dataset, labeller = cfg.federation, host.dataset, host.tuner.labeller
    return (
        f"fedur: {dataset.name} ({dataset.num_classes} classes, {len(dataset.train)} train / {len(dataset.test)} test), "
        f"{fed.num_clients} clients on {host.fabric.world_size} rank(s), {fed.partition} split, "
        f"{fed.rounds} rounds x {fed.local_epochs} local epochs, method {host.method.key} with labeller "
        f"{'none' if labeller is None else labeller.describe()}, device {host.fabric.device}"
        + "".join(f"; {part}" for part in protocol_parts(host))
    )


def protocol_parts(host: Host) -> list[str]:
    """What the evaluation protocols hold out (docs/protocols.md), for the run's first line."""
    parts = [f"new clients {', '.join(map(str, host.new_clients))} (held out of every round)"] if host.new_clients else []
    for held in host.held_out:
        classes = f", among {held.model.num_classes} other classes" if held.model is not host.model else ""
        parts.append(f"held out for the server's model: {held.name} ({len(held.rows)} test images{classes})")
    return parts
