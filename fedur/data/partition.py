"""Seeded, pure splits of a labelled train/test pair across clients.

Every rank calls these with the same arguments and gets the same split, so no rank has to send
indices to another. Each function returns (train_parts, test_parts): one int64 index array per client,
into the train and the test split; together a scheme's parts hold every sample exactly once.
`split_clients` picks the scheme named by `federation.partition` and the random state named by
`federation.partition_seed`: "reference" replays the NumPy state FedCoPL partitions from (see
`fedur.data.reference_rng`; the same split for every run seed), an integer seeds a RandomState of its own.

The label-skew splits take `seed` as an int (a fresh `np.random.RandomState(seed)`) or as a RandomState
to draw from, and make their calls on it in the order FedCoPL's `prepare_dataset_UL_fed` makes them on
the global `np.random`. Given the state the reference starts from (`seed="reference"` in
`split_clients`), they therefore give the reference's split of the same label arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedur.data.images import ImageSplit
from fedur.data.reference_rng import REFERENCE_DATASETS, REFERENCE_SEED, reference_random_state
from fedur.errors import FedurError

Parts = list[np.ndarray]
Seed = int | np.random.RandomState
"""An int seeds a fresh RandomState; a RandomState is drawn from (and advanced) as it is."""


class PartitionError(FedurError, ValueError):
    """The split cannot be made as configured; the message says which setting to change."""


def dirichlet_split(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    beta: float,
    seed: Seed,
    min_train: int = 10,
    max_attempts: int = 1000,
    num_classes: int | None = None,
) -> tuple[Parts, Parts]:
    """Dirichlet label skew as in FedCoPL (`methods/main_UL.py::prepare_dataset_UL_fed`, "noniid").

    Per class c: shuffle its train and test indices, draw ONE p ~ Dir(beta * 1_K) for both splits,
    zero the share of clients already holding more than N/K samples of that split, renormalise, and cut
    the shuffled indices at cumsum(p) * n_c. The whole draw repeats (without reseeding) until every
    client has at least `min_train` train samples; then every client's train and test indices are
    shuffled, client by client. A client's test labels therefore follow its train labels, and the
    client test sets together are the whole test set. The calls on the RandomState (`seed`, see `Seed`)
    are made in the reference's order: started from the reference's state (`split_clients` with
    seed="reference"), this is the reference's split; an int seed gives a split of its own, not the
    reference's (which does not depend on the run seed). The classes are 0 .. num_classes-1 when
    `num_classes` is given (as in the reference, a class without samples still draws its p), else the
    labels present.

    Example (CIFAR-10, K=10, beta=0.1, seed=1): client train sizes range from a few dozen to ~10,000.
    """
    _check_split_args(train_labels, num_clients, min_train)
    if beta <= 0:
        raise PartitionError(f"federation.beta must be > 0, got {beta}")
    rng = _random_state(seed)
    classes = _classes(train_labels, test_labels, num_classes)
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
    """Append to each client's part its share of `indices` (the reference's Dirichlet cut): shares p of the
    clients below `cap`, renormalised, cut at floor(cumsum(share) * n)."""
    share = np.array([p_j * (len(part) < cap) for p_j, part in zip(p, parts)])
    share = share / share.sum() if share.sum() > 0 else p  # every client full: fall back to the raw draw
    return _split_at(parts, indices, share)


def _split_at(parts: list[list[int]], indices: list[int], share: np.ndarray) -> list[list[int]]:
    cuts = (np.cumsum(share) * len(indices)).astype(int)[:-1]
    return [part + list(chunk) for part, chunk in zip(parts, np.split(np.asarray(indices, dtype=np.int64), cuts))]


def iid_split(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    seed: Seed,
    min_train: int = 1,
    num_classes: int | None = None,
) -> tuple[Parts, Parts]:
    """Every class cut into K equal shares (the reference's "iid"): all clients see the same label mix.

    Draws as the reference (`prepare_dataset_UL_fed`, "iid"): per class, shuffle its train then its test
    indices, cut at floor(cumsum(1/K, ..., 1/K) * n) (the float shares as they are, not renormalised: for
    K = 7 the cumulative sum stays just below 1 and a class of 7 samples splits 1,1,1,1,0,1,2); at the end
    shuffle each client's train then test indices. `seed` and `num_classes` as in `dirichlet_split`."""
    _check_split_args(train_labels, num_clients, min_train)
    rng = _random_state(seed)
    uniform = np.full(num_clients, 1.0 / num_clients)
    train_parts: list[list[int]] = [[] for _ in range(num_clients)]
    test_parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in _classes(train_labels, test_labels, num_classes):
        idx_train = list(np.flatnonzero(train_labels == c))
        idx_test = list(np.flatnonzero(test_labels == c))
        rng.shuffle(idx_train)
        rng.shuffle(idx_test)
        train_parts = _split_at(train_parts, idx_train, uniform)
        test_parts = _split_at(test_parts, idx_test, uniform)
    for k in range(num_clients):
        rng.shuffle(train_parts[k])
        rng.shuffle(test_parts[k])
    return _arrays(train_parts), _arrays(test_parts)


def quantity_split(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    class_fraction: float,
    seed: Seed,
    min_train: int = 1,
    num_classes: int | None = None,
) -> tuple[Parts, Parts]:
    """Quantity-based label skew as in FedCoPL (`prepare_dataset_UL_fed`, "noniid-labeldir").

    Every client has `class_fraction * C` class slots (a float) and every class goes to
    `int(K / C * class_fraction * C)` owners (int(0.2 K) for the paper's 0.2: 2 for K=10, 1 for K=5).
    Classes are handed out in index order, each to the lowest-index clients that still have slots left
    (slots > 0, so 9.4 slots hold 10 classes). Class c's n_c train samples are taken in index order:
    each owner but the last gets randint(max(n_c/m/K, 10/C), n_c/m) of them (m owners, NumPy truncating
    both bounds to int), the last owner the rest; the test samples go to the same owners with sizes
    drawn the same way, independently. With m > 2 owners every one of the first m-1 gets less than
    n_c/m, so the last one holds the largest share; with one owner a class is not split (no draw).
    No index is shuffled. The RandomState (`seed`, see `Seed`) is called in the reference's order:
    started from the reference's state (`split_clients` with seed="reference") this is the reference's
    split; an int seed gives a split of its own. C is `num_classes` when given (the reference's class
    count), else the largest label + 1.

    Example (CIFAR-10, K=10): clients 0 and 1 hold airplane and automobile, the first owner 250-2,499
    of a class's 5,000 train images.
    """
    _check_split_args(train_labels, num_clients, min_train)
    if not 0 < class_fraction <= 1:
        raise PartitionError(f"federation.class_fraction must be in (0, 1], got {class_fraction}")
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max(initial=0))) + 1
    class_per_client = num_classes * class_fraction
    owners_per_class = int(num_clients / num_classes * class_per_client)  # the reference's expression
    if owners_per_class < 1:
        raise PartitionError(
            f"quantity skew gives each class int(federation.num_clients * federation.class_fraction) = "
            f"int({num_clients} * {class_fraction}) = 0 owners; raise federation.num_clients or "
            "federation.class_fraction"
        )
    rng = _random_state(seed)
    slots = [class_per_client] * num_clients
    train_parts: list[list[int]] = [[] for _ in range(num_clients)]
    test_parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        owners = [k for k in range(num_clients) if slots[k] > 0][:owners_per_class]
        if not owners:
            raise PartitionError(
                f"quantity skew: no client has a class slot left for class {c} of {num_classes} "
                f"({num_clients} clients x {class_per_client:g} slots, {owners_per_class} owners per class); "
                "change federation.num_clients or federation.class_fraction"
            )
        idx_train, idx_test = np.flatnonzero(train_labels == c), np.flatnonzero(test_labels == c)
        sizes_train = _owner_sizes(rng, len(idx_train), len(owners), num_clients, num_classes, c, "train")
        sizes_test = _owner_sizes(rng, len(idx_test), len(owners), num_clients, num_classes, c, "test")
        for parts, indices, sizes in ((train_parts, idx_train, sizes_train), (test_parts, idx_test, sizes_test)):
            for k, chunk in zip(owners, np.split(indices, np.cumsum(sizes)[:-1])):
                parts[k] += chunk.tolist()
        for k in owners:
            slots[k] -= 1
    small = [k for k, part in enumerate(train_parts) if len(part) < min_train]
    if small:
        raise PartitionError(
            f"quantity skew leaves client(s) {small[:10]} with fewer than {min_train} train samples "
            f"({num_clients} clients x {class_per_client:g} class slots for {num_classes} classes, "
            f"{owners_per_class} owners per class); change federation.num_clients or federation.class_fraction"
        )
    return _arrays(train_parts), _arrays(test_parts)


def _owner_sizes(
    rng: np.random.RandomState, n: int, owners: int, num_clients: int, num_classes: int, c: int, split: str
) -> list[int]:
    if owners == 1:
        return [n]  # the reference draws size-0 here, which leaves the RNG untouched
    per_owner = n / owners
    low = max(per_owner / num_clients, 10 / num_classes)
    if int(low) >= int(per_owner):
        raise PartitionError(
            f"quantity skew: class {c} has {n} {split} samples, too few to share among {owners} owners "
            f"(each but the last draws from [{int(low)}, {int(per_owner)})); lower federation.num_clients"
        )
    sizes = rng.randint(low, per_owner, owners - 1).tolist()  # NumPy truncates the float bounds, as in the reference
    return sizes + [n - sum(sizes)]


def domain_split(train_domains: np.ndarray, test_domains: np.ndarray, num_clients: int) -> tuple[Parts, Parts]:
    """Feature skew: client d holds every train and test sample of domain d (the paper's Table 3).

    The parts are in index order; nothing is drawn. Domains are 0 .. D-1 and num_clients must be D.
    """
    num_domains = _num_domains(train_domains, test_domains)
    if num_clients != num_domains:
        raise PartitionError(
            f"federation.partition=domain makes one client per domain: the data has {num_domains} domains "
            f"but federation.num_clients={num_clients}; set federation.num_clients={num_domains} "
            "(or select domains with dataset.domains)"
        )
    return (
        [np.flatnonzero(train_domains == d).astype(np.int64) for d in range(num_domains)],
        [np.flatnonzero(test_domains == d).astype(np.int64) for d in range(num_domains)],
    )


def domain_dirichlet_split(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    train_domains: np.ndarray,
    test_domains: np.ndarray,
    clients_per_domain: int,
    beta: float,
    seed: int,
    min_train: int = 10,
) -> tuple[Parts, Parts]:
    """Feature and label skew (the paper's Tables 4/5): each domain split over `clients_per_domain` clients.

    Domain d's samples are split with `dirichlet_split` (the rule of the Dirichlet split, with the
    N/K caps and the min_train redraw computed within the domain) and go to clients
    d * clients_per_domain ... (d + 1) * clients_per_domain - 1. Domain d draws from its own
    RandomState seeded by SeedSequence([seed, d]), so the domains are independent of each other and of
    the seeds next to `seed`. (The reference has no domain datasets; `split_clients` passes 500 here
    for partition_seed "reference".)
    """
    if clients_per_domain < 1:
        raise PartitionError(f"federation.clients_per_domain must be >= 1, got {clients_per_domain}")
    num_domains = _num_domains(train_domains, test_domains)
    train_parts: Parts = []
    test_parts: Parts = []
    for d in range(num_domains):
        in_train, in_test = np.flatnonzero(train_domains == d), np.flatnonzero(test_domains == d)
        domain_seed = int(np.random.SeedSequence([seed, d]).generate_state(1)[0])
        try:
            parts_train, parts_test = dirichlet_split(
                train_labels[in_train], test_labels[in_test], clients_per_domain, beta, domain_seed, min_train
            )
        except PartitionError as err:
            raise PartitionError(f"domain {d}: {err} (or lower federation.clients_per_domain)") from err
        train_parts += [in_train[part] for part in parts_train]  # back to indices of the whole split
        test_parts += [in_test[part] for part in parts_test]
    return train_parts, test_parts


def _num_domains(train_domains: np.ndarray, test_domains: np.ndarray) -> int:
    num_domains = int(max(train_domains.max(initial=-1), test_domains.max(initial=-1))) + 1
    empty = [d for d in range(num_domains) if not (train_domains == d).any()]
    if num_domains == 0 or empty or min(train_domains.min(initial=0), test_domains.min(initial=0)) < 0:
        raise PartitionError(
            f"domain indices must be 0 .. D-1 with train samples in every domain; found {num_domains} "
            f"domain(s), without train samples: {empty[:10]}"
        )
    return num_domains


@dataclass(frozen=True)
class PartitionSpec:
    """How the data is split across clients: the `federation:` settings of the same meaning."""

    scheme: Literal["dirichlet", "quantity", "domain", "domain_dirichlet", "iid", "clients", "file"]
    """federation.partition ("file" is read by `fedur.data.split_file`, not drawn here)."""
    num_clients: int
    """federation.num_clients: K."""
    beta: float
    """federation.beta: the Dirichlet concentration (dirichlet, domain_dirichlet)."""
    class_fraction: float
    """federation.class_fraction: the share of the classes each client holds (quantity)."""
    clients_per_domain: int
    """federation.clients_per_domain (domain_dirichlet)."""
    seed: int | str
    """federation.partition_seed: an integer, or "reference" (see `split_clients`)."""
    min_train: int
    """federation.min_train_per_client: train samples every client must hold."""


def split_clients(
    spec: PartitionSpec, train: ImageSplit, test: ImageSplit, dataset: str | None = None
) -> tuple[Parts, Parts]:
    """The split `federation.partition=spec.scheme` asks for, of the labels (and domains) of `train` and
    `test`; every setting that does not fit says so.

    `spec.seed` is `federation.partition_seed`:
    - "reference": FedCoPL's own split. The label-skew schemes (dirichlet, quantity, iid) draw from
      `reference_random_state(dataset)`: RandomState(500) advanced by exactly the draws the reference
      makes after its reseed and before partitioning (for dtd, resisc45, cub, ucf101, cifar10, cifar100:
      get_class_names' discarded choice(range(C), C, replace=False); see `fedur.data.reference_rng`),
      and loop over the reference's C classes. For a dataset the reference does not have (domainnet,
      officehome, imagefolder, synthetic) or dataset=None there is nothing to replay: plain
      RandomState(500), no extra draws, classes from the labels. domain_dirichlet seeds its domains with
      SeedSequence([500, d]). The run seed is not an input: every run seed gets the same split, as the
      paper's seeds 1, 2, 3 do in the reference. The split equals the paper's only if the label arrays
      list the same images in the same order as the reference's (fedur's loaders read its files).
    - an int: `np.random.RandomState(seed)` (and SeedSequence([seed, d]) for domain_dirichlet), with
      the reference's algorithm but not its split; e.g. the run seed, for a split of each seed's own.
    `dataset` is the dataset's key (`Dataset.key`); it matters only for "reference".
    """
    if spec.scheme == "clients":
        return own_clients_split(train, test, spec.num_clients)
    if train.clients is not None:
        raise PartitionError(
            f"federation.partition={spec.scheme}: this dataset's images already belong to clients (their own "
            "folders); use federation.partition=clients (or file)"
        )
    state_seed = _resolve_seed(spec.seed)
    if spec.scheme in ("domain", "domain_dirichlet"):
        return _split_by_domain(spec, train, test, state_seed)
    if spec.scheme not in ("dirichlet", "quantity", "iid"):
        raise PartitionError(
            f"federation.partition={spec.scheme!r} is unknown; use dirichlet, quantity, domain, domain_dirichlet, iid "
            "or clients (file is read by fedur.data.split_file)"
        )
    if train.labels is None or test.labels is None:
        raise PartitionError(
            f"federation.partition={spec.scheme} splits by label, and this data has no "
            f"{'train' if train.labels is None else 'test'} labels; use federation.partition=clients or file"
        )
    rng, num_classes = partition_random_state(spec.seed, dataset, train.labels, test.labels)
    labels, k, min_train = (train.labels, test.labels), spec.num_clients, spec.min_train
    if spec.scheme == "dirichlet":
        return dirichlet_split(*labels, k, spec.beta, rng, min_train, num_classes=num_classes)
    if spec.scheme == "quantity":
        return quantity_split(*labels, k, spec.class_fraction, rng, min_train, num_classes)
    return iid_split(*labels, k, rng, min_train, num_classes)


def own_clients_split(train: ImageSplit, test: ImageSplit, num_clients: int) -> tuple[Parts, Parts]:
    """Data that comes federated (`split.clients`): client k holds the train images the data gives it, in
    the split's order, and its own test images, or, when the test set is shared (`test.clients` None), every
    test image. Nothing is drawn."""
    if train.clients is None:
        raise PartitionError(
            "federation.partition=clients takes each client's images from its own folder, and this dataset has "
            "none: use dataset ClientFolders, or a split of fedur's (dirichlet, quantity, iid, ...)"
        )
    found = int(train.clients.max(initial=-1)) + 1  # a last client may hold nothing once unreadable images are skipped
    if found > num_clients:
        raise PartitionError(f"the data holds {found} clients but federation.num_clients={num_clients}; "
                             f"set federation.num_clients={found}")
    train_parts = [np.flatnonzero(train.clients == k).astype(np.int64) for k in range(num_clients)]
    if test.clients is None:
        return train_parts, [np.arange(len(test), dtype=np.int64) for _ in range(num_clients)]
    return train_parts, [np.flatnonzero(test.clients == k).astype(np.int64) for k in range(num_clients)]


def _split_by_domain(spec: PartitionSpec, train: ImageSplit, test: ImageSplit, state_seed: int) -> tuple[Parts, Parts]:
    """domain and domain_dirichlet: the checks that need the domains, then the split."""
    if train.domains is None or test.domains is None:
        raise PartitionError(
            f"federation.partition={spec.scheme} needs a dataset with domains (domainnet, officehome, synthetic_domains); this one "
            "has none: use dirichlet, quantity or iid"
        )
    if spec.scheme == "domain":
        return domain_split(train.domains, test.domains, spec.num_clients)
    num_domains = _num_domains(train.domains, test.domains)
    per_domain = spec.clients_per_domain
    if spec.num_clients != per_domain * num_domains:
        raise PartitionError(
            f"federation.partition=domain_dirichlet: federation.num_clients={spec.num_clients} must equal "
            f"federation.clients_per_domain ({per_domain}) x {num_domains} domains = {per_domain * num_domains}"
        )
    return domain_dirichlet_split(
        train.labels, test.labels, train.domains, test.domains, per_domain, spec.beta, state_seed, spec.min_train
    )


def partition_random_state(
    seed: int | str, dataset: str | None, train_labels: np.ndarray, test_labels: np.ndarray
) -> tuple[np.random.RandomState, int | None]:
    """The RandomState a label-skew split draws from, and the class count it loops over (None: the labels').

    "reference" with a dataset of the reference: its replayed state and its C (labels beyond C are an
    error: the data is not the reference's); "reference" otherwise: RandomState(500), None; an int:
    RandomState(seed), None.
    """
    state_seed = _resolve_seed(seed)
    if not _is_reference(seed):
        return np.random.RandomState(state_seed), None
    known = REFERENCE_DATASETS.get(dataset) if dataset is not None else None
    if known is None:
        return reference_random_state(None), None
    top = int(max(train_labels.max(initial=-1), test_labels.max(initial=-1)))
    if top >= known.num_classes or min(train_labels.min(initial=0), test_labels.min(initial=0)) < 0:
        raise PartitionError(
            f"federation.partition_seed=reference replays FedCoPL's {known.name} with {known.num_classes} classes, "
            f"but the labels go up to {top}; this is not the reference's data: set federation.partition_seed "
            "to an integer"
        )
    return reference_random_state(dataset), known.num_classes


def _is_reference(seed: int | str) -> bool:
    return isinstance(seed, str) and seed == "reference"


def _resolve_seed(seed: int | str) -> int:
    """The integer behind `federation.partition_seed`: "reference" -> 500, an int -> itself."""
    if _is_reference(seed):
        return REFERENCE_SEED
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    raise PartitionError(f"federation.partition_seed must be an integer or 'reference', got {seed!r}")


def _random_state(seed: Seed) -> np.random.RandomState:
    return seed if isinstance(seed, np.random.RandomState) else np.random.RandomState(seed)


def _classes(train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int | None) -> np.ndarray:
    if num_classes is not None:
        return np.arange(num_classes)
    return np.unique(np.concatenate([train_labels, test_labels]))


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


def client_domains(scheme: str, num_clients: int, clients_per_domain: int) -> list[int] | None:
    """The domain index of each client under a domain split (None for the label-skew splits)."""
    if scheme == "domain":
        return list(range(num_clients))
    if scheme == "domain_dirichlet":
        return [k // clients_per_domain for k in range(num_clients)]
    return None


def class_histogram(labels: np.ndarray | None, parts: Parts, num_classes: int) -> np.ndarray | None:
    """(K, C) counts of each class in each client's part (None without labels)."""
    if labels is None:
        return None
    return np.stack([np.bincount(labels[part], minlength=num_classes) for part in parts])
