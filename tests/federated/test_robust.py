"""Robust aggregation (fedur/federated/robust.py): hand-computed answers, then Flower's own functions on random
uploads (flwr is in the dev extras, not a dependency of fedur: `pip install -e ".[dev]"`)."""

import functools
import importlib

import numpy as np
import pytest
import torch

from fedur.federated.robust import (
    clip_to_norm,
    coordinate_median,
    krum_scores,
    krum_select,
    median_norm,
    pairwise_sq_distances,
    trimmed_mean,
)


def rows_of(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_median_of_odd_n_is_the_middle_value_and_of_even_n_the_mean_of_the_two_middle_ones():
    assert coordinate_median(rows_of([[1, 5], [3, -1], [2, 0]])).tolist() == [2.0, 0.0]
    even = rows_of([[1, 4], [3, 0], [2, 10], [10, 2]])
    assert coordinate_median(even).tolist() == [2.5, 3.0]
    assert torch.median(even, dim=0).values.tolist() == [2.0, 2.0]  # the lower one: why robust.py does not use it
    assert coordinate_median(rows_of([[7, -1]])).tolist() == [7.0, -1.0]


def test_trimmed_mean_cuts_int_beta_n_from_each_end():
    five = rows_of([[1, -50], [100, 3], [3, 0], [2, 2], [4, 1]])  # beta 0.2: one cut from each end
    assert trimmed_mean(five, 0.2).tolist() == [3.0, 1.0]  # (2 + 3 + 4) / 3, (0 + 1 + 2) / 3
    ten = rows_of([[v, 1.0] for v in [5, 1, 1000, 2, 8, 3, -1000, 4, 6, 7]])  # two cut from each end
    assert trimmed_mean(ten, 0.2).tolist() == [4.5, 1.0]  # (2 + ... + 7) / 6
    four = rows_of([[1], [2], [3], [10]])
    assert trimmed_mean(four, 0.2).tolist() == [4.0]  # int(0.8) = 0: the plain mean
    assert trimmed_mean(ten, 0.0).tolist() == pytest.approx([3.6, 1.0])  # nothing cut: the mean
    assert trimmed_mean(ten, 0.45).tolist() == [4.5, 1.0]  # int(4.5) = 4: the two middle values
    for beta in (0.5, -0.1):
        with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
            trimmed_mean(ten, beta)


def test_krum_picks_the_honest_rows_and_multi_krum_the_best_in_score_order():
    rows = rows_of([[0], [1], [3], [100]])  # n 4, f 0: each row's 2 closest others
    assert pairwise_sq_distances(rows)[0].tolist() == [0.0, 1.0, 9.0, 10000.0]
    assert krum_scores(rows, 0) == [10.0, 5.0, 13.0, 9409.0 + 9801.0]
    assert krum_select(rows, 0) == [1]
    assert krum_select(rows, 0, 2) == [1, 0]
    assert krum_select(rows, 0, 3) == [1, 0, 2]
    assert krum_select(rows, 0, 4) == [1, 0, 2, 3]
    assert krum_scores(rows, 1) == [1.0, 1.0, 4.0, 9409.0]  # n - f - 2 = 1: the closest other row
    assert krum_select(rows, 1) == [0]  # equal scores: the lower index (np.argmin)
    assert krum_select(rows, 1, 2) == [0, 1]

    square = rows_of([[0, 0], [1, 0], [0, 1], [1, 1], [100, 100]])  # one far row, f 1: 2 closest others
    assert krum_scores(square, 1) == [2.0, 2.0, 2.0, 2.0, 19602.0 + 19801.0]
    assert krum_select(square, 1) == [0]
    assert krum_select(square, 1, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        krum_select(square, 1, 6)


def test_krum_with_duplicates_skips_one_zero_and_a_single_row_scores_zero():
    twins = rows_of([[0.0], [0.0], [5.0]])  # n 3: each row's closest other; the twins' is each other, at 0
    assert krum_scores(twins, 0) == [0.0, 0.0, 25.0]
    assert krum_select(twins, 0) == [0] and krum_select(twins, 0, 2) == [0, 1]
    triplets = rows_of([[0.0], [0.0], [0.0], [4.0], [6.0]])  # n 5: f 1 leaves each row's 2 closest others
    assert krum_scores(triplets, 1) == [0.0, 0.0, 0.0, 4.0 + 16.0, 4.0 + 36.0]
    assert krum_scores(triplets, 0) == [0.0 + 0.0 + 16.0, 16.0, 16.0, 4.0 + 16.0 + 16.0, 4.0 + 36.0 + 36.0]
    assert krum_scores(rows_of([[3.0, 4.0]]), 2) == [0.0]  # Flower's slice [1:2] of one distance is empty
    assert krum_select(rows_of([[3.0, 4.0]]), 0) == [0] == krum_select(rows_of([[3.0, 4.0]]), 0, 1)


def test_clipping_bounds_each_norm_keeps_direction_and_leaves_a_zero_row():
    updates = rows_of([[3, 4], [0.3, 0.4], [0, 0], [-6, 8]])
    clipped = clip_to_norm(updates, 1.0)
    assert torch.allclose(clipped, rows_of([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0], [-0.6, 0.8]]))
    assert torch.equal(clipped[1], updates[1]) and torch.equal(clipped[2], updates[2])  # within the bound: untouched
    assert clip_to_norm(updates, 0.0).abs().sum() == 0
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        v = torch.randn(9, 301, generator=generator, dtype=torch.float64) * scale
        out = clip_to_norm(v, 0.5)
        norms = torch.linalg.vector_norm(out, dim=1)
        assert bool((norms <= 0.5 * (1 + 1e-12)).all())
        assert torch.allclose(out / norms[:, None], v / torch.linalg.vector_norm(v, dim=1)[:, None])
    with pytest.raises(ValueError):
        clip_to_norm(updates, -1.0)


def test_median_norm_is_np_median_of_the_row_norms():
    assert median_norm(rows_of([[3, 4], [0.3, 0.4], [0, 0]])) == pytest.approx(0.5)
    assert median_norm(rows_of([[3, 4], [0.3, 0.4], [0, 0], [0, 1]])) == pytest.approx(0.75)
    assert median_norm(rows_of([[3, 4]])) == 5.0


def test_results_are_bitwise_the_same_on_any_number_of_threads():
    rows = torch.randn(7, 100_003, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    threads = torch.get_num_threads()

    def everything():
        return (coordinate_median(rows), trimmed_mean(rows), krum_scores(rows, 1), clip_to_norm(rows, 300.0), median_norm(rows))

    try:
        torch.set_num_threads(1)
        one = everything()
        torch.set_num_threads(max(2, threads))
        many = everything()
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


# Flower's functions on random uploads. Each row is split into a random set of layers (Flower's NDArrays) and given a
# random num_examples; some cases copy rows (equal Krum scores) or add a far one.

CASES = 150


def flower():
    """Flower's aggregate and differential_privacy modules (flwr 1.42.0 of the dev extras; earlier releases kept the
    second in flwr.common)."""
    try:
        aggregate = importlib.import_module("flwr.server.strategy.aggregate")
    except ImportError:
        pytest.fail('flwr is missing: the tests need the dev extras (pip install -e ".[dev]")')
    for name in ("flwr.supercore.differential_privacy", "flwr.common.differential_privacy"):  # 1.42.0, earlier
        try:
            return aggregate, importlib.import_module(name)
        except ImportError:
            continue
    pytest.fail(f"flwr {importlib.import_module('flwr').__version__} has no differential_privacy module")


def random_case(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 13))
    shapes = [tuple(int(s) for s in rng.integers(1, 5, size=rng.integers(1, 4))) for _ in range(rng.integers(1, 4))]
    d = sum(int(np.prod(s)) for s in shapes)
    rows = rng.normal(size=(n, d)) * 10.0 ** rng.integers(-3, 3)
    if n >= 3 and seed % 3 == 0:
        rows[rng.integers(0, n)] = rows[rng.integers(0, n)]
    if n >= 4 and seed % 4 == 1:
        rows[rng.integers(0, n)] += 100.0 * np.abs(rows).max()
    layers = []
    for row in rows:
        pieces, start = [], 0
        for s in shapes:
            size = int(np.prod(s))
            pieces.append(row[start:start + size].reshape(s).copy())
            start += size
        layers.append(pieces)
    results = [(pieces, int(rng.integers(1, 50))) for pieces in layers]
    return torch.from_numpy(rows.copy()), results, rng


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a).ravel() for a in arrays])


def multi_krum_average(results, kept: list[int]) -> np.ndarray:
    """Flower's weighted average of the kept rows, summed in its order (the reverse of krum_select's)."""
    order = kept[::-1]
    total = sum(results[i][1] for i in order)
    return sum((flat(results[i][0]) * results[i][1] for i in order[1:]), flat(results[order[0]][0]) * results[order[0]][1]) / total


@pytest.mark.slow
def test_matches_flowers_median_trimmed_mean_clipping_and_median_norm():
    aggregate, dp = flower()
    for seed in range(CASES):
        rows, results, rng = random_case(seed)
        assert np.array_equal(coordinate_median(rows).numpy(), flat(aggregate.aggregate_median(results)))
        for beta in (0.0, 0.1, 0.2, 0.25, 0.3, 0.45):
            np.testing.assert_allclose(trimmed_mean(rows, beta).numpy(), flat(aggregate.aggregate_trimmed_avg(results, beta)),
                                       rtol=1e-12, atol=1e-300)
        norms = [dp.get_norm(pieces) for pieces, _ in results]
        assert median_norm(rows) == pytest.approx(float(np.median(norms)), rel=1e-12)
        for bound in (0.5 * min(norms), median_norm(rows), 2.0 * max(norms)):
            base = [[rng.normal(size=p.shape) for p in pieces] for pieces, _ in results] if seed % 2 else \
                [[np.zeros_like(p) for p in pieces] for pieces, _ in results]
            ours = clip_to_norm(rows - torch.from_numpy(np.stack([flat(b) for b in base])), float(bound))
            for i, (pieces, _) in enumerate(results):
                param1 = [p.copy() for p in pieces]
                dp.compute_clip_model_update(param1, base[i], float(bound))
                np.testing.assert_allclose(ours[i].numpy() + flat(base[i]), flat(param1), rtol=1e-12, atol=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize("stable", [True, False], ids=["argsort-stable", "argsort-default"])
def test_matches_flowers_krum_and_multi_krum(monkeypatch, stable):
    """With np.argsort made stable Flower breaks ties as krum_select documents, and the two agree on every case; with
    numpy's default kind (unstable on AVX-512 CPUs) they may keep different rows only where scores tie at the cut."""
    aggregate, _ = flower()
    if stable:
        monkeypatch.setattr(np, "argsort", functools.partial(np.argsort, kind="stable"))
    ties = 0
    for seed in range(CASES):
        rows, results, _ = random_case(seed)
        n = rows.shape[0]
        for num_malicious in range(4):
            scores = krum_scores(rows, num_malicious)
            for to_keep in range(n + 1):
                kept = krum_select(rows, num_malicious, to_keep)
                theirs = flat(aggregate.aggregate_krum([(list(p), k) for p, k in results], num_malicious, to_keep))
                if to_keep == 0:
                    assert len(kept) == 1 and np.array_equal(theirs, rows[kept[0]].numpy())
                    continue
                assert len(kept) == to_keep
                if np.allclose(theirs, multi_krum_average(results, kept), rtol=1e-12, atol=1e-300):
                    continue
                order = sorted(range(n), key=lambda i: scores[i])
                assert not stable and to_keep < n and scores[order[to_keep - 1]] == scores[order[to_keep]], (seed, num_malicious, to_keep)
                ties += 1
