"""The NumPy random state FedCoPL's partition starts from, replayed for `federation.partition_seed: reference`.

FedCoPL (`krumpguo/FedCoPL`, commit ed7e0e0) seeds everything with the run seed and then, before it
partitions, reseeds the global NumPy RNG with 500. For the six datasets of the paper the global
`np.random` calls between that reseed and the partition are, in order:

1. `methods/main_UL.py:637` `become_deterministic(OPTIM_SEED)` -> `utils/utils.py:103` `np.random.seed(OPTIM_SEED)`
   (1, 2 or 3; overwritten by step 2, so it has no effect on the partition).
2. `methods/main_UL.py:316` `get_class_names(dataset, dataset_dir)` with its default `seed=500`
   (`utils/prepare_data.py:11`), whose branch for the dataset runs `np.random.seed(500)` and
   `np.random.choice(range(C), size=int(C * 1), replace=False)` (the "seen classes": every class, in a
   permuted order that nothing downstream uses; the class index order stays the file order, via
   `label_to_idx` over `classes` at `methods/main_UL.py:109`): DTD `prepare_data.py:108-111`,
   cifar100 `:125-128`, cifar10 `:142-145`, UCF101 `:193-196`, RESISC45 `:212-215`, CUB `:280-283`.
   In legacy NumPy, `choice(..., replace=False)` without `p` is `permutation(C)[:C]`: one shuffle of
   `arange(C)`, so how far it advances the state depends on C.
3. `methods/main_UL.py:332` `get_labeled_and_unlabeled_data`: no draw. Each of the six datasets has a
   branch that returns early (DTD `prepare_data.py:451`, cifar100 `:499`, cifar10 `:547`, UCF101 `:685`,
   RESISC45 `:733`, CUB `:915`); `split_data` (`prepare_data.py:939`, which reseeds with 500 and draws
   again) is reached only by the aPY and Animals_with_Attributes2 branches, which fedur does not have.
4. `prepare_dataset_UL` (`main_UL.py:338`), `dataset_object` and the dataset constructors
   (`main_UL.py:340-349`, `data/dataset.py`): no draw.
5. `prepare_dataset_UL_fed` (`main_UL.py:353`, defined at `:87`): the partition's own draws ("iid"
   `:125-153`, "noniid-labeldir" `:155-215`, "noniid" `:218-250`), which `fedur.data.partition`
   makes in the same order on the RandomState returned here.

No other module touches `np.random` on the way (`random`/torch are seeded but not used there). The
state therefore depends on the dataset's class count C only, never on the run seed: the paper's three
seeds of a cell share one partition.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

REFERENCE_SEED = 500
"""The number FedCoPL reseeds NumPy with before it partitions (`utils/prepare_data.py:11`)."""


class ReferenceDataset(NamedTuple):
    name: str
    """FedCoPL's `DATASET_NAME`."""
    num_classes: int
    """C: the length of the reference's class list (its class_names.txt / train.json / classes.txt)."""
    class_names_line: int
    """Line of `utils/prepare_data.py` with the branch's `np.random.seed(seed)`."""


REFERENCE_DATASETS: dict[str, ReferenceDataset] = {
    "dtd": ReferenceDataset("DTD", 47, 108),
    "cifar100": ReferenceDataset("cifar100", 100, 125),
    "cifar10": ReferenceDataset("cifar10", 10, 142),
    "ucf101": ReferenceDataset("UCF101", 101, 193),
    "resisc45": ReferenceDataset("RESISC45", 45, 212),
    "cub": ReferenceDataset("CUB", 200, 280),
}
"""fedur `Dataset.key` -> the reference's dataset. Others (domainnet, officehome, imagefolder, synthetic)
are not in the reference."""


def reference_random_state(dataset: str | None) -> np.random.RandomState:
    """A RandomState in the state FedCoPL's global RNG has when `prepare_dataset_UL_fed` starts drawing.

    For a dataset of `REFERENCE_DATASETS`: RandomState(500) advanced by get_class_names' discarded
    `choice(range(C), C, replace=False)`. For any other name (or None): plain RandomState(500), with no
    extra draws: the reference has no such dataset, so there is no sequence to replay.
    """
    rng = np.random.RandomState(REFERENCE_SEED)
    known = REFERENCE_DATASETS.get(dataset) if dataset is not None else None
    if known is not None:
        rng.choice(range(known.num_classes), size=int(known.num_classes * 1), replace=False)  # thrown away
    return rng
