"""Datasets, their split across clients, and fast per-client loading.

Importing the package imports every built-in `Dataset` subclass, so that jsonargparse's `--dataset CUB`
and `fedur.data.datasets.dataset_classes()` find them.
"""

from fedur.data import benchmarks, cifar, clients, coop, datasets, domains, imagenet  # noqa: F401  (defines the Dataset subclasses)
