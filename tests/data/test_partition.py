import numpy as np
import pytest

from fedur.data.partition import PartitionError, class_histogram, dirichlet_split, iid_split


def labels(n_per_class, classes, seed=0):
    rng = np.random.RandomState(seed)
    return rng.permutation(np.repeat(np.arange(classes), n_per_class))


TRAIN, TEST = labels(200, 10), labels(40, 10, seed=1)


def reference_dirichlet(train, test, n_parties, beta, seed):
    """FedCoPL's `prepare_dataset_UL_fed(partition="noniid")`, driven by the global NumPy RNG as there."""
    np.random.seed(seed)
    n, n_test = len(train), len(test)
    min_size = 0
    while min_size < 10:
        batch, batch_test = [[] for _ in range(n_parties)], [[] for _ in range(n_parties)]
        for k in range(10):
            idx_k = [i for i, v in enumerate(train) if v == k]
            idx_k_test = [i for i, v in enumerate(test) if v == k]
            np.random.shuffle(idx_k)
            np.random.shuffle(idx_k_test)
            p = np.random.dirichlet(np.repeat(beta, n_parties))
            p_train = np.array([q * (len(b) < n / n_parties) for q, b in zip(p, batch)])
            p_test = np.array([q * (len(b) < n_test / n_parties) for q, b in zip(p, batch_test)])
            p_train, p_test = p_train / p_train.sum(), p_test / p_test.sum()
            cut = (np.cumsum(p_train) * len(idx_k)).astype(int)[:-1]
            cut_test = (np.cumsum(p_test) * len(idx_k_test)).astype(int)[:-1]
            batch = [b + c.tolist() for b, c in zip(batch, np.split(idx_k, cut))]
            batch_test = [b + c.tolist() for b, c in zip(batch_test, np.split(idx_k_test, cut_test))]
            min_size = min(len(b) for b in batch)
    for j in range(n_parties):
        np.random.shuffle(batch[j])
        np.random.shuffle(batch_test[j])
    return batch, batch_test


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dirichlet_reproduces_the_reference_split(seed):
    train_parts, test_parts = dirichlet_split(TRAIN, TEST, 10, 0.1, seed)
    ref_train, ref_test = reference_dirichlet(TRAIN, TEST, 10, 0.1, seed)
    assert [p.tolist() for p in train_parts] == ref_train
    assert [p.tolist() for p in test_parts] == ref_test


def test_dirichlet_is_deterministic_disjoint_covering_and_min_size():
    a_train, a_test = dirichlet_split(TRAIN, TEST, 10, 0.1, seed=5)
    b_train, b_test = dirichlet_split(TRAIN, TEST, 10, 0.1, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a_train + a_test, b_train + b_test))
    for parts, n in ((a_train, len(TRAIN)), (a_test, len(TEST))):
        joined = np.concatenate(parts)
        assert len(joined) == n and len(np.unique(joined)) == n  # disjoint and covering
    assert min(len(p) for p in a_train) >= 10
    c_train, _ = dirichlet_split(TRAIN, TEST, 10, 0.1, seed=6)
    assert not all(np.array_equal(x, y) for x, y in zip(a_train, c_train))


def test_test_labels_follow_train_labels():
    train_parts, test_parts = dirichlet_split(TRAIN, TEST, 10, 0.1, seed=1)
    train_hist = class_histogram(TRAIN, train_parts, 10) / 200
    test_hist = class_histogram(TEST, test_parts, 10) / 40
    assert np.corrcoef(train_hist.ravel(), test_hist.ravel())[0, 1] > 0.9


def test_smaller_beta_is_more_skewed():
    def mean_max_share(beta):
        parts, _ = dirichlet_split(TRAIN, TEST, 10, beta, seed=1)
        hist = class_histogram(TRAIN, parts, 10)
        return float((hist.max(axis=1) / hist.sum(axis=1)).mean())

    assert mean_max_share(0.05) > mean_max_share(1.0) + 0.2


def test_iid_gives_every_client_every_class():
    parts, test_parts = iid_split(TRAIN, TEST, 4, seed=1)
    hist = class_histogram(TRAIN, parts, 10)
    assert (hist == 50).all()
    assert sum(len(p) for p in test_parts) == len(TEST)


def test_impossible_splits_say_what_to_change():
    with pytest.raises(PartitionError, match="num_clients"):
        dirichlet_split(TRAIN[:50], TEST, 10, 0.1, seed=1)  # 50 samples cannot give 10 clients 10 each
    with pytest.raises(PartitionError, match="beta"):
        dirichlet_split(TRAIN, TEST, 10, 0.0, seed=1)
