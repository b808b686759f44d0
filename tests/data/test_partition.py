import numpy as np
import pytest

from fedur.data.images import ImageSplit
from fedur.data.partition import (
    PartitionError,
    PartitionSpec,
    class_histogram,
    dirichlet_split,
    domain_dirichlet_split,
    domain_split,
    iid_split,
    quantity_split,
    split_clients,
)


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


def reference_quantity(train, test, n_parties, num_classes, seed):
    """FedCoPL's `prepare_dataset_UL_fed(partition="noniid-labeldir")`, transcribed, on the global NumPy RNG."""
    np.random.seed(seed)
    parts, parts_test = {}, {}
    class_per_client = num_classes * 0.2
    idx_for_each_class = [[i for i, v in enumerate(train) if v == k] for k in range(num_classes)]
    idx_for_each_class_test = [[i for i, v in enumerate(test) if v == k] for k in range(num_classes)]
    class_num_per_client = [class_per_client for _ in range(n_parties)]
    for i in range(num_classes):
        selected = []
        for client in range(n_parties):
            if class_num_per_client[client] > 0:
                selected.append(client)
            selected = selected[: int(n_parties / num_classes * class_per_client)]
        num_per = len(idx_for_each_class[i]) / len(selected)
        num_per_test = len(idx_for_each_class_test[i]) / len(selected)
        num_samples = np.random.randint(max(num_per / n_parties, 10 / num_classes), num_per, len(selected) - 1).tolist()
        num_samples.append(len(idx_for_each_class[i]) - sum(num_samples))
        num_samples_test = np.random.randint(
            max(num_per_test / n_parties, 10 / num_classes), num_per_test, len(selected) - 1
        ).tolist()
        num_samples_test.append(len(idx_for_each_class_test[i]) - sum(num_samples_test))
        idx = 0
        for client, n in zip(selected, num_samples):
            parts[client] = parts.get(client, []) + idx_for_each_class[i][idx : idx + n]
            idx += n
            class_num_per_client[client] -= 1
        idx = 0
        for client, n in zip(selected, num_samples_test):
            parts_test[client] = parts_test.get(client, []) + idx_for_each_class_test[i][idx : idx + n]
            idx += n
    return [parts[k] for k in range(n_parties)], [parts_test.get(k, []) for k in range(n_parties)]


@pytest.mark.parametrize(
    "num_clients, num_classes, seed", [(10, 10, 1), (10, 10, 2), (5, 10, 3), (10, 47, 1), (20, 10, 1)]
)
def test_quantity_reproduces_the_reference_split(num_clients, num_classes, seed):
    train, test = labels(60, num_classes, seed=4), labels(20, num_classes, seed=5)
    train_parts, test_parts = quantity_split(train, test, num_clients, 0.2, seed)
    ref_train, ref_test = reference_quantity(train, test, num_clients, num_classes, seed)
    assert [p.tolist() for p in train_parts] == ref_train
    assert [p.tolist() for p in test_parts] == ref_test


@pytest.mark.parametrize(
    "num_clients, num_classes, owners, classes_per_client",
    [
        (10, 10, 2, [2] * 10),
        (5, 10, 1, [2] * 5),
        (20, 10, 4, [2] * 20),
        (10, 47, 2, [10] * 8 + [7] * 2),  # 9.4 slots hold 10 classes; the last pair gets the remaining 7
    ],
)
def test_quantity_skew_gives_each_class_its_owners_and_each_client_its_classes(
    num_clients, num_classes, owners, classes_per_client
):
    train, test = labels(60, num_classes, seed=4), labels(20, num_classes, seed=5)
    train_parts, test_parts = quantity_split(train, test, num_clients, 0.2, seed=1)
    hist = class_histogram(train, train_parts, num_classes)
    assert ((hist > 0).sum(axis=0) == owners).all()
    assert (hist > 0).sum(axis=1).tolist() == classes_per_client
    test_hist = class_histogram(test, test_parts, num_classes)
    assert ((test_hist > 0) <= (hist > 0)).all()  # test samples go to the class's train owners only
    if owners == 2:  # the first owner's share is drawn from [max(n/2/K, 10/C), n/2)
        first = np.array([hist[np.flatnonzero(hist[:, c])[0], c] for c in range(num_classes)])
        assert (first >= int(max(30 / num_clients, 10 / num_classes))).all() and (first < 30).all()
        assert len(np.unique(first)) > 1


def test_feature_skew_gives_each_client_exactly_one_domain():
    rng = np.random.RandomState(0)
    train_domains, test_domains = rng.randint(0, 4, 300), rng.randint(0, 4, 100)
    train_parts, test_parts = domain_split(train_domains, test_domains, 4)
    for d, (part, part_test) in enumerate(zip(train_parts, test_parts)):
        assert set(train_domains[part]) == {d} and set(test_domains[part_test]) == {d}
    with pytest.raises(PartitionError, match="federation.num_clients=4"):
        domain_split(train_domains, test_domains, 6)


def test_domain_dirichlet_splits_each_domain_over_its_own_clients():
    rng = np.random.RandomState(0)
    train_domains, test_domains = np.repeat(np.arange(3), 400), np.repeat(np.arange(3), 100)
    train, test = rng.randint(0, 10, 1200), rng.randint(0, 10, 300)
    train_parts, test_parts = domain_dirichlet_split(train, test, train_domains, test_domains, 3, 0.1, 1, 10)
    assert len(train_parts) == len(test_parts) == 9
    for k, (part, part_test) in enumerate(zip(train_parts, test_parts)):
        assert set(train_domains[part]) == {k // 3} and set(test_domains[part_test]) == {k // 3}
        assert len(part) >= 10
    near_iid, _ = domain_dirichlet_split(train, test, train_domains, test_domains, 3, 1000.0, 1, 10)
    assert max_class_share(train_parts, train) > max_class_share(near_iid, train) + 0.15  # label skew within domains


def max_class_share(train_parts, train, num_classes=10) -> float:
    hist = class_histogram(train, train_parts, num_classes)
    return float((hist.max(axis=1) / np.maximum(hist.sum(axis=1), 1)).mean())


def test_smaller_beta_is_more_skewed_than_larger_beta_and_iid_over_seeds():
    def share(split):
        return np.mean([max_class_share(split(seed)[0], TRAIN) for seed in range(1, 6)])

    iid = share(lambda seed: iid_split(TRAIN, TEST, 10, seed))
    beta_1 = share(lambda seed: dirichlet_split(TRAIN, TEST, 10, 1.0, seed))
    beta_005 = share(lambda seed: dirichlet_split(TRAIN, TEST, 10, 0.05, seed))
    assert iid == pytest.approx(0.1)  # every client holds every class equally
    assert beta_1 > iid + 0.1 and beta_005 > beta_1 + 0.2


SCHEMES = {
    "dirichlet": {"num_clients": 6},
    "quantity": {"num_clients": 10},  # 2 owners per class: sizes are drawn (1 owner draws nothing)
    "domain": {"num_clients": 3},
    "domain_dirichlet": {"num_clients": 6, "clients_per_domain": 2},
    "iid": {"num_clients": 6},
}


def split_with(scheme, seed, **overrides):
    settings = {"beta": 0.5, "class_fraction": 0.2, "clients_per_domain": 2, "seed": seed, "min_train": 10}
    settings.update(SCHEMES[scheme])
    settings.update(overrides)
    train, test = ImageSplit(TRAIN, domains=DOMAINS_TRAIN), ImageSplit(TEST, domains=DOMAINS_TEST)
    return split_clients(PartitionSpec(scheme, **settings), train, test)


def without_domains(scheme, num_clients):
    spec = PartitionSpec(scheme, num_clients, beta=0.1, class_fraction=0.2, clients_per_domain=1, seed=1, min_train=1)
    return spec, ImageSplit(TRAIN), ImageSplit(TEST)


DOMAINS_TRAIN, DOMAINS_TEST = np.arange(len(TRAIN)) % 3, np.arange(len(TEST)) % 3


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_scheme_puts_every_sample_in_exactly_one_client_and_is_seeded(scheme):
    train_parts, test_parts = split_with(scheme, seed=1)
    assert len(train_parts) == len(test_parts) == SCHEMES[scheme]["num_clients"]
    for parts, n in ((train_parts, len(TRAIN)), (test_parts, len(TEST))):
        assert all(part.dtype == np.int64 for part in parts)
        joined = np.concatenate(parts)
        assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))
    again_train, again_test = split_with(scheme, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(train_parts + test_parts, again_train + again_test))
    other_train, _ = split_with(scheme, seed=2)
    same = all(np.array_equal(a, b) for a, b in zip(train_parts, other_train))
    assert same == (scheme == "domain")  # only feature skew draws nothing


@pytest.mark.parametrize(
    "scheme, overrides, message",
    [
        ("domain", {"num_clients": 4}, "federation.num_clients=4"),
        ("domain_dirichlet", {"num_clients": 5}, "federation.clients_per_domain"),
        ("domain_dirichlet", {"clients_per_domain": 0, "num_clients": 0}, "federation.clients_per_domain must be >= 1"),
        ("quantity", {"num_clients": 4}, "federation.class_fraction"),  # int(0.2 * 4) = 0 owners per class
        ("quantity", {"num_clients": 6}, "client\\(s\\) \\[5\\]"),  # 5 clients x 2 slots take all 10 classes
        ("quantity", {"class_fraction": 1.5}, "federation.class_fraction must be in"),
        ("dirichlet", {"beta": 0.0}, "federation.beta"),
        ("bogus", {}, "federation.partition='bogus'"),
    ],
)
def test_bad_settings_name_the_key_to_change(scheme, overrides, message):
    if scheme == "bogus":
        with pytest.raises(PartitionError, match=message):
            split_clients(*without_domains(scheme, num_clients=2))
        return
    with pytest.raises(PartitionError, match=message):
        split_with(scheme, seed=1, **overrides)


@pytest.mark.parametrize("scheme", ["domain", "domain_dirichlet"])
def test_domain_schemes_need_a_dataset_with_domains(scheme):
    with pytest.raises(PartitionError, match=f"federation.partition={scheme} needs a dataset with domains"):
        split_clients(*without_domains(scheme, num_clients=3))


def test_quantity_refuses_classes_too_small_to_share():
    train, test = np.repeat(np.arange(10), 2), np.repeat(np.arange(10), 2)  # 2 samples, 2 owners: [1, 1) is empty
    with pytest.raises(PartitionError, match="class 0 has 2 train samples"):
        quantity_split(train, test, 10, 0.2, seed=1)
