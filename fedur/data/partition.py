"""Seeded, pure splits of a labelled train/test pair across clients.

Every rank calls these with the same arguments and gets the same split, so no rank has to send
indices to another. Each function returns (train_parts, test_parts): one index array per client.
"""

from __future__ import annotations

import numpy as np

Parts = list[np.ndarray]


class PartitionError(ValueError):
    """The split cannot be made as configured; the message says which setting to change."""


def dirichlet_split(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    beta: float,
    seed: int,
    min_train: int = 10,
    max_attempts: int = 1000,
) -> tuple[Parts, Parts]:
    """Dirichlet label skew as in FedCoPL (`methods/main_UL.py::prepare_dataset_UL_fed`, "noniid").

    Per class c: shuffle its train and test indices, draw ONE p ~ Dir(beta * 1_K) for both splits,
    zero the share of clients already holding more than N/K samples of that split, renormalise, and cut
    the shuffled indices at cumsum(p) * n_c. The whole draw repeats until every client has at least
    `min_train` train samples. A client's test labels therefore follow its train labels, and the
    client test sets together are the whole test set. The calls on `np.random.RandomState(seed)` are
    made in the reference's order, so a seed gives the reference's split.

    Example (CIFAR-10, K=10, beta=0.1, seed=1): client train sizes range from a few dozen to ~10,000.
    """
    _check_split_args(train_labels, num_clients, min_train)
    if beta <= 0:
        raise PartitionError(f"federation.beta must be > 0, got {beta}")
    rng = np.random.RandomState(seed)
    classes = np.unique(np.concatenate([train_labels, test_labels]))
    n_train, n_test = len(train_labels), len(test_labels)
    for _ in range(max_attempts):
        train_parts: list[list[int]] = [[] for _ in range(num_clients)]
        test_parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx_train = list(np.flatnonzero(train_labels == c))
            idx_test = list(np.flatnonzero(test_labels == c))
            rng.shuffle(idx_train)
            rng.shuffle(idx_test)
            p = rng.dirichlet(np.repeat(beta, num_clients))
            train_parts = _cut(train_parts, idx_train, p, n_train / num_clients)
            test_parts = _cut(test_parts, idx_test, p, n_test / num_clients)
        if min(len(part) for part in train_parts) >= min_train:
            break
    else:
        raise PartitionError(
            f"no Dirichlet split with >= {min_train} train samples per client in {max_attempts} draws; "
            "raise federation.beta, lower federation.num_clients or federation.min_train_per_client"
        )
    for k in range(num_clients):
        rng.shuffle(train_parts[k])
        rng.shuffle(test_parts[k])
    return _arrays(train_parts), _arrays(test_parts)


def _cut(parts: list[list[int]], indices: list[int], p: np.ndarray, cap: float) -> list[list[int]]:
    share = np.array([p_j * (len(part) < cap) for p_j, part in zip(p, parts)])
    share = share / share.sum() if share.sum() > 0 else p  # every client full: fall back to the raw draw
    cuts = (np.cumsum(share) * len(indices)).astype(int)[:-1]
    return [part + list(chunk) for part, chunk in zip(parts, np.split(np.asarray(indices, dtype=np.int64), cuts))]


def iid_split(
    train_labels: np.ndarray, test_labels: np.ndarray, num_clients: int, seed: int, min_train: int = 1
) -> tuple[Parts, Parts]:
    """Every class cut into K equal shares (the reference's "iid"): all clients see the same label mix."""
    _check_split_args(train_labels, num_clients, min_train)
    rng = np.random.RandomState(seed)
    uniform = np.full(num_clients, 1.0 / num_clients)
    train_parts: list[list[int]] = [[] for _ in range(num_clients)]
    test_parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in np.unique(np.concatenate([train_labels, test_labels])):
        idx_train = list(np.flatnonzero(train_labels == c))
        idx_test = list(np.flatnonzero(test_labels == c))
        rng.shuffle(idx_train)
        rng.shuffle(idx_test)
        train_parts = _cut(train_parts, idx_train, uniform, np.inf)
        test_parts = _cut(test_parts, idx_test, uniform, np.inf)
    for k in range(num_clients):
        rng.shuffle(train_parts[k])
        rng.shuffle(test_parts[k])
    return _arrays(train_parts), _arrays(test_parts)


def _check_split_args(train_labels: np.ndarray, num_clients: int, min_train: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"federation.num_clients must be >= 1, got {num_clients}")
    if len(train_labels) < num_clients * max(min_train, 1):
        raise PartitionError(
            f"{len(train_labels)} train samples cannot give {num_clients} clients >= {max(min_train, 1)} samples "
            "each; lower federation.num_clients or federation.min_train_per_client"
        )


def _arrays(parts: list[list[int]]) -> Parts:
    return [np.asarray(part, dtype=np.int64) for part in parts]


def class_histogram(labels: np.ndarray, parts: Parts, num_classes: int) -> np.ndarray:
    """(K, C) counts of each class in each client's part."""
    return np.stack([np.bincount(labels[part], minlength=num_classes) for part in parts])
