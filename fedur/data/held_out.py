"""Test images no client holds, for the protocols that test the server's model beyond the clients' own data
(docs/protocols.md): base-to-novel's novel classes, and leave-one-domain-out's held-out domain.

`hold_out` is the one place where these protocols read a true label or domain: which train images are base
(or of a source domain) is decided from the dataset's class (or domain) of each image *before* the split
across clients, and the others are removed from the train split, so that no client, labeller or method can
see them; the train split loses its labels afterwards as always (fedur/train/setup.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fedur.data.images import ImageDataset, ImageSplit
from fedur.errors import FedurError


class HeldOutError(FedurError, ValueError):
    """The data cannot be split as the protocol asks; the message says what to change."""


@dataclass(frozen=True)
class HeldOut:
    """Test images only the server's model is tested on: rows of the test split, classified among `classnames`;
    an image's label there is its test label minus `offset` (base-to-novel's novel classes follow the base ones)."""

    name: str  # "novel", or "domain:<name>"
    rows: np.ndarray  # (n,) int64 rows of the dataset's test split
    classnames: list[str]
    offset: int = 0

    def labels(self, test_labels: np.ndarray) -> np.ndarray:
        """(n,) int64 labels in `classnames`' indexing, from the test split's labels (N,)."""
        return test_labels[self.rows].astype(np.int64) - self.offset


@dataclass(frozen=True)
class Protocol:
    """What `hold_out` gives: the dataset the clients train on, the test rows they split among themselves (None:
    every row), and the held-out sets."""

    dataset: ImageDataset
    client_test_rows: np.ndarray | None
    held_out: tuple[HeldOut, ...]


def base_classes(num_classes: int) -> int:
    """How many of the classes are base: the first half, rounded up (CoOp's `subsample_classes`, FedTPG's)."""
    return math.ceil(num_classes / 2)


def hold_out(dataset: ImageDataset, base_to_novel: bool = False, held_out_domain: str | None = None) -> Protocol:
    """The dataset as the clients see it under the protocols asked for (neither: unchanged).

    base_to_novel: the first half of the classes (`base_classes`) are base; the train split keeps only base
    images and the class names only the base names; the test split keeps every image (its rows stay those of
    the image cache), the clients split its base images, and its novel images are held out with the novel names.
    held_out_domain: the train split loses that domain's images, the other domains are renumbered in their
    order; the clients split the other domains' test images, and that domain's are held out (every class)."""
    if not base_to_novel and held_out_domain is None:
        return Protocol(dataset, None, ())
    if not dataset.train.labelled or not dataset.test.labelled:
        raise HeldOutError(f"{dataset.name} has no labels in its train or test split: base-to-novel and "
                           "leave-one-domain-out decide which images are held out from the labels (and domains)")
    train, test, classnames = dataset.train, dataset.test, list(dataset.classnames)
    domain_names, keep_test, held = dataset.domain_names, np.ones(len(test), dtype=bool), []
    if held_out_domain is not None:
        if not domain_names or train.domains is None or test.domains is None:
            raise HeldOutError(f"evaluation.held_out_domain={held_out_domain!r}: {dataset.name} has no domains "
                               "(DomainNet, OfficeHome and SyntheticDomains have)")
        if held_out_domain not in domain_names:
            raise HeldOutError(f"evaluation.held_out_domain={held_out_domain!r} is not one of {dataset.name}'s domains "
                               f"loaded: {', '.join(domain_names)}")
        if len(domain_names) < 2:
            raise HeldOutError("leave-one-domain-out needs at least two domains: one held out, one to train on")
        d = domain_names.index(held_out_domain)
        train = renumber_domains(train.subset(np.flatnonzero(train.domains != d)), d)
        held.append(HeldOut(f"domain:{held_out_domain}", np.flatnonzero(test.domains == d).astype(np.int64), classnames))
        keep_test &= test.domains != d
        test = renumber_domains(test, d)  # the held-out domain's images: domain -1, no client's
        domain_names = [name for name in domain_names if name != held_out_domain]
    if base_to_novel:
        base = base_classes(len(classnames))
        if base == len(classnames):
            raise HeldOutError(f"base-to-novel needs at least two classes, {dataset.name} has {len(classnames)}")
        train = train.subset(np.flatnonzero(train.labels < base))
        novel = np.flatnonzero(keep_test & (test.labels >= base)).astype(np.int64)
        held = [HeldOut(h.name, h.rows[test.labels[h.rows] < base], classnames[:base]) for h in held]  # its base classes
        held.insert(0, HeldOut("novel", novel, classnames[base:], offset=base))
        keep_test &= test.labels < base
        classnames = classnames[:base]
    clients = replace(dataset, classnames=classnames, train=train, test=test, domain_names=domain_names)
    return Protocol(clients, np.flatnonzero(keep_test).astype(np.int64), tuple(held))


def renumber_domains(split: ImageSplit, removed: int) -> ImageSplit:
    """`split` with the domains after `removed` moved down by one, and `removed`'s images at -1."""
    domains = np.where(split.domains > removed, split.domains - 1, split.domains)
    return replace(split, domains=np.where(split.domains == removed, -1, domains))
