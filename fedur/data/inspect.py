"""A dataset at a glance: image counts per class and split, per domain when there are domains, with totals.

`python fedur/main.py --config X --check_data` prints `dataset_report` and exits without training.
"""

from __future__ import annotations

import numpy as np

from fedur.data.images import ImageDataset, ImageSplit

SPLITS = ("train", "test")


def count_table(split: ImageSplit, num_classes: int, num_domains: int) -> np.ndarray:
    """(num_domains, num_classes) image counts; one row when the split has no domains."""
    domains = split.domains if split.domains is not None else np.zeros(len(split), dtype=np.int64)
    counts = np.zeros((num_domains, num_classes), dtype=np.int64)
    np.add.at(counts, (domains, split.labels), 1)
    return counts


def dataset_report(dataset: ImageDataset) -> str:
    """Header, one row per class (train / test per domain, then the totals), a total row, and a line
    naming any class that has no image in some split (and domain). Data that brings its own clients: one
    row per client instead (`clients_report`)."""
    if dataset.client_names is not None:
        return clients_report(dataset)
    domain_names = dataset.domain_names or []
    num_domains = max(1, len(domain_names))
    counts = {s: count_table(getattr(dataset, s), dataset.num_classes, num_domains) for s in SPLITS}
    groups = [(name, d) for d, name in enumerate(domain_names)] + [("total", None)]

    def cells(split: str, d: int | None) -> np.ndarray:  # (num_classes,)
        return counts[split].sum(axis=0) if d is None else counts[split][d]

    columns = [(group, split, cells(split, d)) for group, d in groups for split in SPLITS]
    width = max(8, *(len(f"{c.sum():,}") + 1 for _, _, c in columns), *(len(g) // 2 + 1 for g, _ in groups))
    label_width = max(12, *(len(n) for n in dataset.classnames)) + 8
    top = " " * label_width + "".join(f"{group:^{2 * width}}" for group, _ in groups)
    sub = f"{'label  class':<{label_width}}" + "".join(f"{split:>{width}}" for _, split, _ in columns)
    rows = [
        f"{c:>5}  {name:<{label_width - 7}}" + "".join(f"{int(col[c]):>{width},}" for _, _, col in columns)
        for c, name in enumerate(dataset.classnames)
    ]
    total = f"{'':>5}  {'total':<{label_width - 7}}" + "".join(f"{int(col.sum()):>{width},}" for _, _, col in columns)
    rule = "-" * len(sub)
    n_train, n_test = len(dataset.train), len(dataset.test)
    header = [
        (
            f"{dataset.name}: {dataset.num_classes} classes, {n_train:,} train / {n_test:,} test images, "
            f"template {dataset.template!r}"
        ),
    ]
    if domain_names:
        header.append(f"domains ({len(domain_names)}): {', '.join(domain_names)}")
    table = ([top] if domain_names else []) + [sub, rule, *rows, rule, total]
    return "\n".join(header + [""] + table + _empty_cells(dataset, counts, domain_names))


def _empty_cells(dataset: ImageDataset, counts: dict[str, np.ndarray], domain_names: list[str]) -> list[str]:
    """One line per split (and domain) listing the classes without any image there."""
    notes = []
    for split in SPLITS:
        for d in range(counts[split].shape[0]):
            empty = np.flatnonzero(counts[split][d] == 0)
            if len(empty):
                where = f"{split}" + (f" of {domain_names[d]}" if domain_names else "")
                shown = ", ".join(dataset.classnames[c] for c in empty[:8]) + (", ..." if len(empty) > 8 else "")
                notes.append(f"no images in {where} for {len(empty)} classes: {shown}")
    return notes


def clients_report(dataset: ImageDataset) -> str:
    """Clients' own folders: the classes, then one row per client (id, folder, train and test images), and
    what the test images are (labelled per client, one shared labelled set, unlabelled, none)."""
    train, test, names = dataset.train, dataset.test, dataset.client_names
    train_counts = np.bincount(train.clients, minlength=len(names))
    test_counts = np.bincount(test.clients, minlength=len(names)) if test.clients is not None else None
    if len(test) == 0:
        kind = "none"
    elif test.clients is None:
        kind = f"one shared labelled set of {len(test):,} images, every client tested on it"
    else:
        kind = "labelled per client (class folders)" if test.labelled else "per client, unlabelled (predictions only)"
    width = max(8, *(len(n) for n in names))
    lines = [
        f"{dataset.name}: {len(names)} clients, {len(train):,} train images (unlabelled) / {len(test):,} test images",
        f"classes ({dataset.num_classes}, data.classnames_file): {', '.join(dataset.classnames)}",
        f"test images: {kind}", "",
        f"{'client':>6}  {'folder':<{width}}  {'train':>8}  {'test':>8}",
    ]
    for k, name in enumerate(names):
        shown = "shared" if test_counts is None else f"{int(test_counts[k]):,}"
        lines.append(f"{k:>6}  {name:<{width}}  {int(train_counts[k]):>8,}  {shown:>8}")
    return "\n".join(lines)
