"""`federation.partition_seed: reference` gives FedCoPL's own split, whatever the run seed.

The reference below is a transcription of what FedCoPL (`krumpguo/FedCoPL`, commit ed7e0e0) does on
the global NumPy RNG from `main()` to the end of `prepare_dataset_UL_fed`, on hand-made label arrays
(class ids instead of class names; `label_to_idx` maps the reference's names to ids in file order).
"""

import numpy as np
import pytest

from fedur.data.images import ImageSplit
from fedur.data.partition import (
    PartitionError,
    PartitionSpec,
    dirichlet_split,
    domain_dirichlet_split,
    iid_split,
    quantity_split,
    split_clients,
)
from fedur.data.reference_rng import REFERENCE_DATASETS, reference_random_state

# fedur name: (FedCoPL DATASET_NAME, C = len(classes) in get_class_names, does its loader reach
# split_data?, clients in the paper's script run-textPT_ALL.sh:59-71)
PAPER = {
    "dtd": ("DTD", 47, False, 10),
    "resisc45": ("RESISC45", 45, False, 10),
    "cub": ("CUB", 200, False, 5),
    "ucf101": ("UCF101", 101, False, 5),
    "cifar10": ("cifar10", 10, False, 10),
    "cifar100": ("cifar100", 100, False, 10),
}


def reference_run(num_classes, train, test, n_parties, partition, beta=0.1, optim_seed=1, split_data=False):
    """FedCoPL's global-RNG calls from main() to the partition, then `prepare_dataset_UL_fed`."""
    # methods/main_UL.py:637 become_deterministic(OPTIM_SEED) -> utils/utils.py:103
    np.random.seed(optim_seed)
    # methods/main_UL.py:316 get_class_names(dataset, dataset_dir), seed=500 by default
    # (utils/prepare_data.py:11); the dataset's branch, e.g. DTD :108-111:
    np.random.seed(500)
    seen_indices = np.random.choice(range(num_classes), size=int(num_classes * 1), replace=False)
    assert sorted(seen_indices) == list(range(num_classes))  # every class is "seen"; the order is unused
    # methods/main_UL.py:332 get_labeled_and_unlabeled_data: the six paper datasets return from their own
    # branch (prepare_data.py:451, 499, 547, 685, 733, 915); only a fall-through to the end (aPY, AwA2)
    # runs split_data (prepare_data.py:918-928), which reseeds with 500 (:940) and also subsamples the
    # train set; not transcribed, as no dataset of the paper (or of fedur) gets there:
    assert not split_data
    # methods/main_UL.py:338-349 prepare_dataset_UL, dataset_object, DatasetObject(...): no draws
    # methods/main_UL.py:353 -> prepare_dataset_UL_fed (:87)
    return prepare_dataset_UL_fed(num_classes, list(train), list(test), n_parties, partition, beta)


def prepare_dataset_UL_fed(K, train_ids, test_ids, n_parties, partition, beta):
    """methods/main_UL.py:87-250, on label ids (UL_train_lbs_true_id, UL_test_lbs_true_id)."""
    party2dataidx, party2dataidx_test = {}, {}
    if partition == "iid":  # :125-153
        idx_batch = [[] for _ in range(n_parties)]
        idx_batch_test = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = [idx for idx, value in enumerate(train_ids) if value == k]
            idx_k_test = [idx for idx, value in enumerate(test_ids) if value == k]
            np.random.shuffle(idx_k)
            np.random.shuffle(idx_k_test)
            proportions = np.full(n_parties, float(1 / n_parties))
            proportions_train = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            proportions_test = (np.cumsum(proportions) * len(idx_k_test)).astype(int)[:-1]
            idx_batch = [j + idx.tolist() for j, idx in zip(idx_batch, np.split(idx_k, proportions_train))]
            idx_batch_test = [
                j + idx.tolist() for j, idx in zip(idx_batch_test, np.split(idx_k_test, proportions_test))
            ]
        for j in range(n_parties):
            np.random.shuffle(idx_batch[j])
            party2dataidx[j] = idx_batch[j]
            np.random.shuffle(idx_batch_test[j])
            party2dataidx_test[j] = idx_batch_test[j]
    elif partition == "noniid-labeldir":  # :155-215
        least_samples = 10
        num_classes = K
        class_per_client = num_classes * 0.2
        idx_for_each_class, idx_for_each_class_test = [], []
        for k in range(K):
            idx_for_each_class.append([idx for idx, value in enumerate(train_ids) if value == k])
            idx_for_each_class_test.append([idx for idx, value in enumerate(test_ids) if value == k])
        class_num_per_client = [class_per_client for _ in range(n_parties)]
        for i in range(num_classes):
            selected_clients = []
            for client in range(n_parties):
                if class_num_per_client[client] > 0:
                    selected_clients.append(client)
                selected_clients = selected_clients[: int(n_parties / num_classes * class_per_client)]
            num_all_samples = len(idx_for_each_class[i])
            num_selected_clients = len(selected_clients)
            num_per = num_all_samples / num_selected_clients
            num_all_samples_test = len(idx_for_each_class_test[i])
            num_per_test = num_all_samples_test / num_selected_clients
            num_samples = np.random.randint(
                max(num_per / n_parties, least_samples / num_classes), num_per, num_selected_clients - 1
            ).tolist()
            num_samples.append(num_all_samples - sum(num_samples))
            num_samples_test = np.random.randint(
                max(num_per_test / n_parties, least_samples / num_classes), num_per_test, num_selected_clients - 1
            ).tolist()
            num_samples_test.append(num_all_samples_test - sum(num_samples_test))
            idx = 0
            for client, num_sample in zip(selected_clients, num_samples):
                if client not in party2dataidx:
                    party2dataidx[client] = idx_for_each_class[i][idx : idx + num_sample]
                else:
                    party2dataidx[client] = np.append(
                        party2dataidx[client], idx_for_each_class[i][idx : idx + num_sample], axis=0
                    )
                idx += num_sample
                class_num_per_client[client] -= 1
            idx = 0
            for client, num_sample in zip(selected_clients, num_samples_test):
                if client not in party2dataidx_test:
                    party2dataidx_test[client] = idx_for_each_class_test[i][idx : idx + num_sample]
                else:
                    party2dataidx_test[client] = np.append(
                        party2dataidx_test[client], idx_for_each_class_test[i][idx : idx + num_sample], axis=0
                    )
                idx += num_sample
    elif partition == "noniid":  # :218-250
        min_size, min_require_size = 0, 10
        N, N_test = len(train_ids), len(test_ids)
        while min_size < min_require_size:
            idx_batch = [[] for _ in range(n_parties)]
            idx_batch_test = [[] for _ in range(n_parties)]
            for k in range(K):
                idx_k = [idx for idx, value in enumerate(train_ids) if value == k]
                idx_k_test = [idx for idx, value in enumerate(test_ids) if value == k]
                np.random.shuffle(idx_k)
                np.random.shuffle(idx_k_test)
                proportions = np.random.dirichlet(np.repeat(beta, n_parties))
                proportions_train = np.array([p * (len(j) < N / n_parties) for p, j in zip(proportions, idx_batch)])
                proportions_test = np.array(
                    [p * (len(j) < N_test / n_parties) for p, j in zip(proportions, idx_batch_test)]
                )
                proportions_train = proportions_train / proportions_train.sum()
                proportions_test = proportions_test / proportions_test.sum()
                proportions_train = (np.cumsum(proportions_train) * len(idx_k)).astype(int)[:-1]
                proportions_test = (np.cumsum(proportions_test) * len(idx_k_test)).astype(int)[:-1]
                idx_batch = [j + idx.tolist() for j, idx in zip(idx_batch, np.split(idx_k, proportions_train))]
                idx_batch_test = [
                    j + idx.tolist() for j, idx in zip(idx_batch_test, np.split(idx_k_test, proportions_test))
                ]
                min_size = min([len(j) for j in idx_batch])
        for j in range(n_parties):
            np.random.shuffle(idx_batch[j])
            party2dataidx[j] = idx_batch[j]
            np.random.shuffle(idx_batch_test[j])
            party2dataidx_test[j] = idx_batch_test[j]
    else:
        raise ValueError(partition)
    # :254-268 reads party2dataidx[j] for every client j (a client without data is a KeyError there)
    return (
        [np.asarray(party2dataidx[j]).tolist() for j in range(n_parties)],
        [np.asarray(party2dataidx_test.get(j, [])).tolist() for j in range(n_parties)],
    )


def hand_made(num_classes, train_per_class, test_per_class, seed):
    """Shuffled labels with uneven class sizes (every class present, as in the real datasets)."""
    rng = np.random.RandomState(seed)
    train = np.repeat(np.arange(num_classes), train_per_class + rng.randint(0, 3, num_classes))
    test = np.repeat(np.arange(num_classes), test_per_class + rng.randint(0, 2, num_classes))
    return rng.permutation(train), rng.permutation(test)


FEDUR_SCHEME = {"noniid": "dirichlet", "noniid-labeldir": "quantity", "iid": "iid"}


def fedur_split(scheme, train, test, num_clients, seed, dataset, beta=0.1, min_train=10):
    spec = PartitionSpec(scheme, num_clients, beta, class_fraction=0.2, clients_per_domain=1, seed=seed,
                         min_train=min_train)
    return split_clients(spec, ImageSplit(train), ImageSplit(test), dataset)


def as_lists(parts):
    return [p.tolist() for p in parts]


@pytest.mark.parametrize("dataset", list(PAPER))
@pytest.mark.parametrize("partition", ["noniid", "noniid-labeldir", "iid"])
def test_reference_seed_gives_fedcopls_split(dataset, partition):
    _, num_classes, split_data, clients = PAPER[dataset]
    train, test = hand_made(num_classes, max(12, 400 // num_classes), 4, seed=len(dataset))
    ref_train, ref_test = reference_run(num_classes, train, test, clients, partition, split_data=split_data)
    min_train = 10 if partition == "noniid" else 1
    train_parts, test_parts = fedur_split(FEDUR_SCHEME[partition], train, test, clients, "reference", dataset,
                                          min_train=min_train)
    assert as_lists(train_parts) == ref_train
    assert as_lists(test_parts) == ref_test


@pytest.mark.parametrize("dataset, per_class", [("cifar10", 18), ("dtd", 2)])  # 8 and 3 draws
def test_reference_seed_replays_the_min_size_redraws(dataset, per_class):
    """beta=0.05 on few images: the reference's `while min_size < 10` loop redraws without reseeding."""
    _, num_classes, _, clients = PAPER[dataset]
    train, test = hand_made(num_classes, per_class, 2, seed=3)
    ref_train, ref_test = reference_run(num_classes, train, test, clients, "noniid", beta=0.05)
    train_parts, test_parts = fedur_split("dirichlet", train, test, clients, "reference", dataset, beta=0.05)
    assert as_lists(train_parts) == ref_train and as_lists(test_parts) == ref_test
    with pytest.raises(PartitionError, match="draws"):  # one draw is not enough here: the redraw was exercised
        dirichlet_split(train, test, clients, 0.05, reference_random_state(dataset), 10, max_attempts=1,
                        num_classes=num_classes)


@pytest.mark.parametrize("dataset", list(PAPER))
def test_reference_seed_state_is_500_advanced_by_get_class_names_draw(dataset):
    _, num_classes, _, _ = PAPER[dataset]
    assert REFERENCE_DATASETS[dataset].num_classes == num_classes
    np.random.seed(500)
    np.random.choice(range(num_classes), size=num_classes, replace=False)
    expected = np.random.get_state()
    state = reference_random_state(dataset).get_state()
    assert np.array_equal(state[1], expected[1]) and state[2:] == expected[2:]


@pytest.mark.parametrize("partition", ["noniid", "noniid-labeldir"])
def test_paper_seeds_share_one_partition(partition):
    """The reference gives seeds 1, 2, 3 one split; so does fedur, whose run seed is not an input of it."""
    train, test = hand_made(10, 30, 6, seed=7)
    runs = [reference_run(10, train, test, 10, partition, optim_seed=s) for s in (1, 2, 3)]
    assert runs[0] == runs[1] == runs[2]
    splits = []
    for run_seed in (1, 2):
        np.random.seed(run_seed)  # the global RNG (seeded by a run) does not reach the split either
        min_train = 10 if partition == "noniid" else 1  # the reference's min_require_size; quantity has none
        scheme = FEDUR_SCHEME[partition]
        splits.append(fedur_split(scheme, train, test, 10, "reference", "cifar10", min_train=min_train))
    for a, b in zip(splits[0][0] + splits[0][1], splits[1][0] + splits[1][1]):
        assert np.array_equal(a, b)
    assert as_lists(splits[0][0]) == runs[0][0]


def test_split_clients_leaves_the_global_rng_alone():
    train, test = hand_made(10, 30, 6, seed=7)
    np.random.seed(123)
    before = np.random.get_state()
    fedur_split("dirichlet", train, test, 10, "reference", "cifar10")
    after = np.random.get_state()
    assert np.array_equal(before[1], after[1]) and before[2:] == after[2:]


@pytest.mark.parametrize("scheme", ["dirichlet", "quantity", "iid"])
def test_an_int_seed_keeps_the_old_split(scheme):
    train, test = hand_made(10, 30, 6, seed=7)
    old = {  # the split functions called with an int seed, as split_clients did before partition_seed
        "dirichlet": lambda s: dirichlet_split(train, test, 10, 0.1, s, 1),
        "quantity": lambda s: quantity_split(train, test, 10, 0.2, s, 1),
        "iid": lambda s: iid_split(train, test, 10, s, 1),
    }[scheme]
    for seed in (1, 2, np.int64(3)):
        for dataset in ("cifar10", None):  # the dataset name matters only for "reference"
            got = fedur_split(scheme, train, test, 10, seed, dataset, min_train=1)
            want = old(int(seed))
            assert all(np.array_equal(a, b) for a, b in zip(got[0] + got[1], want[0] + want[1]))
    one = fedur_split(scheme, train, test, 10, 1, "cifar10", min_train=1)
    two = fedur_split(scheme, train, test, 10, 2, "cifar10", min_train=1)
    assert not all(np.array_equal(a, b) for a, b in zip(one[0], two[0]))  # per-seed splits differ


def test_int_seed_matches_the_reference_algorithm_seeded_with_that_int():
    """An int seed is the reference's algorithm on RandomState(seed), without the get_class_names draw."""
    train, test = hand_made(10, 30, 6, seed=7)
    np.random.seed(4)
    ref = prepare_dataset_UL_fed(10, list(train), list(test), 10, "noniid", 0.1)
    got = fedur_split("dirichlet", train, test, 10, 4, "cifar10")
    assert (as_lists(got[0]), as_lists(got[1])) == ref


@pytest.mark.parametrize("dataset", [None, "domainnet", "officehome", "imagefolder", "synthetic"])
def test_reference_without_a_reference_dataset_is_plain_seed_500(dataset):
    train, test = hand_made(10, 30, 6, seed=7)
    got = fedur_split("dirichlet", train, test, 10, "reference", dataset)
    want = dirichlet_split(train, test, 10, 0.1, 500, 10)
    assert all(np.array_equal(a, b) for a, b in zip(got[0] + got[1], want[0] + want[1]))
    replayed = fedur_split("dirichlet", train, test, 10, "reference", "cifar10")
    assert not all(np.array_equal(a, b) for a, b in zip(got[0], replayed[0]))  # the class-name draw matters


def test_domain_dirichlet_maps_reference_to_500():
    rng = np.random.RandomState(0)
    train_domains, test_domains = np.repeat(np.arange(3), 400), np.repeat(np.arange(3), 100)
    train, test = rng.randint(0, 10, 1200), rng.randint(0, 10, 300)
    spec = PartitionSpec("domain_dirichlet", num_clients=6, beta=0.1, class_fraction=0.2, clients_per_domain=2,
                         seed="reference", min_train=10)
    got = split_clients(spec, ImageSplit(train, domains=train_domains), ImageSplit(test, domains=test_domains), "domainnet")
    want = domain_dirichlet_split(train, test, train_domains, test_domains, 2, 0.1, 500, 10)
    assert all(np.array_equal(a, b) for a, b in zip(got[0] + got[1], want[0] + want[1]))


def test_reference_loops_over_the_reference_classes_even_when_one_is_missing():
    """The reference draws a Dirichlet p for every one of its C classes, also for one without samples."""
    train, test = hand_made(10, 30, 6, seed=7)
    train, test = train[train != 9], test[test != 9]  # class 9 gone, the reference still has 10 classes
    ref = reference_run(10, train, test, 10, "noniid")
    got = fedur_split("dirichlet", train, test, 10, "reference", "cifar10")
    assert (as_lists(got[0]), as_lists(got[1])) == ref


def test_reference_refuses_labels_beyond_the_reference_classes():
    train, test = hand_made(12, 30, 6, seed=7)
    with pytest.raises(PartitionError, match="partition_seed to an integer"):
        fedur_split("dirichlet", train, test, 10, "reference", "cifar10")


@pytest.mark.parametrize("seed", ["Reference", "500", 1.5, None, True])
def test_a_bad_partition_seed_names_the_key(seed):
    train, test = hand_made(10, 30, 6, seed=7)
    with pytest.raises(PartitionError, match="federation.partition_seed must be an integer or 'reference'"):
        fedur_split("dirichlet", train, test, 10, seed, "cifar10")


@pytest.mark.parametrize("n_parties", range(1, 31))
def test_iid_is_the_references_for_every_number_of_clients(n_parties):
    """The reference cuts each class at floor(cumsum(1/K, ..., 1/K) * n) without renormalising the shares: for K
    such as 7 the sum stays just below 1 and the cuts move by one (a class of 7 samples: 1,1,1,1,0,1,2)."""
    train, test = hand_made(10, 7 + n_parties % 5, 3, seed=n_parties)  # classes of 7-13 train, 3-4 test samples
    ref_train, ref_test = reference_run(10, train, test, n_parties, "iid")
    train_parts, test_parts = fedur_split("iid", train, test, n_parties, "reference", "cifar10", min_train=0)
    assert as_lists(train_parts) == ref_train
    assert as_lists(test_parts) == ref_test


def test_iid_with_seven_clients_splits_a_class_of_seven_as_the_reference():
    parts, _ = iid_split(np.zeros(7, dtype=np.int64), np.zeros(7, dtype=np.int64), 7, np.random.RandomState(0), 0)
    assert [len(p) for p in parts] == [1, 1, 1, 1, 0, 1, 2]
