import pytest
import torch

from fedur.labels.selection import (
    allocate,
    budget,
    class_weights,
    entropy,
    estimated_counts,
    filter_mask,
    negative_mask,
    select_top,
)

# Rows chosen so the two filters disagree: A is confident but spread, B is less confident but two-way.
#            top1  entropy
# A .6 .2 .2  .60   0.950
# B .55 .45 0 .55   0.688
# C .9 .05 .05 .90  0.394
# D .4 .3 .3  .40   1.089     medians: top1 (.55+.6)/2 = .575, entropy (.688+.950)/2 = .819
PROBS = torch.tensor([[0.6, 0.2, 0.2], [0.55, 0.45, 0.0], [0.9, 0.05, 0.05], [0.4, 0.3, 0.3]])


def test_entropy_by_hand():
    assert entropy(PROBS).tolist() == pytest.approx([0.9503, 0.6881, 0.3944, 1.0889], abs=1e-4)


@pytest.mark.parametrize(
    "confidence, entropy_filter, expected",
    [
        (True, True, [False, False, True, False]),
        (True, False, [True, False, True, False]),
        (False, True, [False, True, True, False]),
        (False, False, [True, True, True, True]),
    ],
)
def test_filters_use_per_client_medians(confidence, entropy_filter, expected):
    assert filter_mask(PROBS, confidence, entropy_filter).tolist() == expected


def test_filter_quantiles_move_thresholds():
    # confidence quantile 0.25 of [.4, .55, .6, .9] is .5125: everything but D passes
    assert filter_mask(PROBS, True, False, confidence_quantile=0.25).tolist() == [True, True, True, False]


def test_estimated_counts_count_kept_argmax():
    probs = torch.tensor([[0.7, 0.3, 0.0], [0.2, 0.8, 0.0], [0.9, 0.1, 0.0], [0.1, 0.1, 0.8]])
    keep = torch.tensor([True, True, True, False])
    assert estimated_counts(probs, keep).tolist() == [2, 1, 0]


def test_budget_is_ceil_of_mean_per_class():
    assert budget(torch.tensor([[3, 0, 1], [2, 0, 1]])) == 3  # ceil(7 / 3)
    assert budget(torch.tensor([[3, 3, 3]])) == 3


def test_allocation_by_hand_with_fallback():
    counts = torch.tensor([[3, 0, 1], [1, 0, 2]])  # totals [4, 0, 3]; M = ceil(7 / 3) = 3
    quotas = allocate(counts, n_total=100, refresh_idx=0)
    # class 0: ceil(3/4*3) = 3, ceil(1/4*3) = 1; class 2: exactly 1 and 2 (no float round-up);
    # class 1 nobody estimated: ceil(100 / 3 / 4 * 1 / 2) = ceil(4.17) = 5 for every client
    assert quotas.tolist() == [[3, 5, 1], [1, 5, 2]]
    assert allocate(counts, n_total=100, refresh_idx=1)[:, 1].tolist() == [9, 9]  # ceil(8.33)


@pytest.mark.parametrize("arithmetic", ["exact", "reference"])
def test_a_clients_quotas_read_only_its_own_row_and_the_released_totals(arithmetic):
    counts = torch.tensor([[3, 0, 1], [1, 0, 2]])
    together = allocate(counts, 100, 0, arithmetic)
    for k in range(2):  # each client alone, with the sums as released: the same quotas
        alone = allocate(counts[k:k + 1], 100, 0, arithmetic, totals=counts.sum(dim=0), num_clients=2)
        assert alone.tolist() == together[k:k + 1].tolist()
    # noised totals [6, 1, 3]: M = ceil(10 / 3) = 4; client 0: ceil(3 / 6 x 4) = 2, ceil(0) = 0, ceil(1 / 3 x 4) = 2
    noised = allocate(counts[:1], 100, 0, arithmetic, totals=torch.tensor([6, 1, 3]), num_clients=2)
    assert noised.tolist() == [[2, 0, 2]]
    # a released sum below the client's own count (noise) counts as its own count: client 0's class 0 at 3, not 1
    low = allocate(counts[:1], 100, 0, arithmetic, totals=torch.tensor([1, 1, 8]), num_clients=2)
    assert low.tolist() == [[4, 0, 1]]  # M = ceil(10 / 3) = 4: ceil(3 / 3 x 4), ceil(1 / 8 x 4)


def test_select_top_takes_most_confident_per_class():
    probs = torch.tensor([
        [0.7, 0.2, 0.1],
        [0.9, 0.05, 0.05],
        [0.6, 0.3, 0.1],
        [0.1, 0.8, 0.1],
        [0.2, 0.3, 0.5],
        [0.1, 0.1, 0.8],
    ])
    indices, labels = select_top(probs, torch.tensor([2, 5, 1]))
    # class 0: samples 1 (.9) and 0 (.7); class 1: only sample 3 predicts it; class 2: sample 5 (.8)
    assert indices.tolist() == [0, 1, 3, 5]
    assert labels.tolist() == [0, 0, 1, 2]
    assert select_top(probs, torch.tensor([0, 0, 0]))[0].numel() == 0


def test_select_top_breaks_ties_by_index():
    probs = torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.8, 0.2]])
    assert select_top(probs, torch.tensor([2, 0]))[0].tolist() == [0, 1]


ROW = torch.tensor([[0.05, 0.1, 0.15, 0.7]])


@pytest.mark.parametrize(
    "rule, expected",
    [
        ("mass", [True, True, False, False]),  # .05 + .1 = .15 <= .2 < .30
        ("threshold", [True, True, True, False]),  # p < .2
        ("ratio", [True, False, False, False]),  # ceil(.2 * 4) = 1 lowest class
    ],
)
def test_negative_rules_by_hand(rule, expected):
    assert negative_mask(ROW, torch.tensor([3]), rule, 0.2).tolist() == [expected]


def test_negatives_never_contain_the_label():
    mask = negative_mask(ROW, torch.tensor([0]), "mass", 0.2)
    assert mask.tolist() == [[False, True, False, False]]


@pytest.mark.parametrize("rule", ["online", "none"])
def test_rules_without_stored_negatives(rule):
    assert negative_mask(ROW, torch.tensor([3]), rule, 0.2) is None


def test_class_weights_inverse_frequency_mean_one():
    counts = torch.tensor([10, 30, 0, 60])  # d = .1, .3, -, .6
    assert class_weights(counts, "inv").tolist() == pytest.approx([2.0, 2 / 3, 1.0, 1 / 3])
    # inv_sqrt: raw 1/sqrt(d) = [3.1623, 1.8257, -, 1.2910], mean 2.0930
    assert class_weights(counts, "inv_sqrt").tolist() == pytest.approx([1.5109, 0.8723, 1.0, 0.6168], abs=1e-4)
    assert class_weights(counts, "none") is None
    assert class_weights(torch.zeros(3, dtype=torch.long), "inv").tolist() == [1.0, 1.0, 1.0]


def reference_quotas(counts: torch.Tensor, n_total: int, refresh_idx: int) -> torch.Tensor:
    """FedCoPL's quotas, transcribed (methods/main_UL.py:485-490 @ed7e0e0): float32 histograms (fedcopl.py:431
    `torch.zeros(len(self.classes))`, += 1 per sample), summed over clients."""
    data_distributions = [row.to(torch.float32) for row in counts]
    total_data_distributions = torch.stack(data_distributions).sum(dim=0)
    mask = total_data_distributions != 0
    total_sample_per_class = torch.ceil(torch.sum(total_data_distributions) / len(total_data_distributions))
    num_classes, client_num, len_train = counts.shape[1], counts.shape[0], n_total
    return torch.stack([
        torch.ceil(torch.where(mask, data_distributions[client] / total_data_distributions * total_sample_per_class,
                               len_train / num_classes / 4 * (refresh_idx + 1) / client_num)).int()
        for client in range(client_num)
    ]).long()


def test_quotas_by_the_formula_and_by_the_references_float32():
    counts = torch.tensor([[5, 0], [34, 39]])  # class 0: 5 of 39 estimates; M = ceil(78 / 2) = 39
    assert allocate(counts, 100, 0)[0, 0] == 5  # ceil(5 / 39 * 39) = 5 exactly
    assert allocate(counts, 100, 0, "reference")[0, 0] == 6 == reference_quotas(counts, 100, 0)[0, 0]  # 5.0000005


def test_reference_quotas_equal_the_transcription_on_random_counts():
    generator = torch.Generator().manual_seed(0)
    differ = 0
    for trial in range(300):
        clients, classes = int(torch.randint(2, 11, (1,), generator=generator)), int(torch.randint(2, 50, (1,), generator=generator))
        counts = torch.randint(0, 40, (clients, classes), generator=generator) * (torch.rand(clients, classes, generator=generator) < 0.7)
        n_total, refresh = int(torch.randint(100, 5000, (1,), generator=generator)), trial % 4
        assert torch.equal(allocate(counts, n_total, refresh, "reference"), reference_quotas(counts, n_total, refresh))
        exact = allocate(counts, n_total, refresh)
        assert ((allocate(counts, n_total, refresh, "reference") - exact).abs() <= 1).all()
        differ += int((allocate(counts, n_total, refresh, "reference") != exact).any())
    assert differ > 0  # the float32 overshoot does occur on random counts
