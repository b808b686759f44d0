import math

import pytest
import torch

from fedur.federated.divergence import drift_diversity, mean_pairwise_cosine_distance


def test_drift_diversity_identical_updates_is_one():
    updates = torch.tensor([[1.0, -2.0, 0.5]]).repeat(3, 1)
    assert drift_diversity(updates) == pytest.approx(1.0)
    assert drift_diversity(updates, normalize_weights=False) == pytest.approx(1 / 3)  # FedVLS's unweighted sums


def test_drift_diversity_orthogonal_equal_norm_updates_is_k():
    updates = 2 * torch.eye(3)  # sum_k (1/3) 4 = 4 over ||(2/3)(1, 1, 1)||^2 = 4/3
    assert drift_diversity(updates) == pytest.approx(3.0)
    assert drift_diversity(updates, normalize_weights=False) == pytest.approx(1.0)  # 12 / 12


def test_drift_diversity_by_hand_with_shapes_and_weights():
    updates = torch.tensor([[1.0, 0.0], [1.0, 1.0]]).reshape(2, 1, 2)  # (K, *shape)
    # uniform: (.5 * 1 + .5 * 2) / ||(1, .5)||^2 = 1.5 / 1.25
    assert drift_diversity(updates) == pytest.approx(1.2)
    # weights (3, 1) -> lambda (.75, .25) on orthogonal unit updates: 1 / (.75^2 + .25^2) = 1.6
    assert drift_diversity(torch.eye(2), torch.tensor([3.0, 1.0])) == pytest.approx(1.6)


def test_drift_diversity_degenerate_cases():
    assert math.isnan(drift_diversity(torch.ones(1, 4)))  # one client
    assert math.isnan(drift_diversity(torch.zeros(3, 4)))  # nobody moved
    assert drift_diversity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == math.inf  # cancelling updates


def test_mean_pairwise_cosine_distance_by_hand():
    updates = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    # pairs: 1 - 1/sqrt2, 1 - 0, 1 - 1/sqrt2
    expected = (3 - math.sqrt(2)) / 3
    assert mean_pairwise_cosine_distance(updates) == pytest.approx(expected)
    # a zero update has no direction: its pairs are left out
    with_zero = torch.cat([updates, torch.zeros(1, 2)])
    assert mean_pairwise_cosine_distance(with_zero) == pytest.approx(expected)
    assert mean_pairwise_cosine_distance(torch.tensor([[1.0, 2.0], [-2.0, -4.0]])) == pytest.approx(2.0)
    assert mean_pairwise_cosine_distance(torch.tensor([[1.0, 2.0], [3.0, 6.0]]).reshape(2, 2, 1)) == pytest.approx(0.0)


def test_mean_pairwise_cosine_distance_degenerate_cases():
    assert math.isnan(mean_pairwise_cosine_distance(torch.ones(1, 3)))
    assert math.isnan(mean_pairwise_cosine_distance(torch.tensor([[1.0, 0.0], [0.0, 0.0]])))
