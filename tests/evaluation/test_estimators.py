"""Each estimator of fedur/evaluation/estimators.py on hand-written logits against a value computed by hand from its
source's formula."""

import math

import pytest
import torch

from fedur.evaluation.estimators import AGREEMENTS, ESTIMATORS, agreement, confidence, dispersity, entropy, estimates, mano, mano_normalised

# softmax rows [3/4, 1/4] and [1/3, 2/3]
LOGITS = torch.tensor([[math.log(3.0), 0.0], [0.0, math.log(2.0)]], dtype=torch.float64)
P = [[3 / 4, 1 / 4], [1 / 3, 2 / 3]]


def test_confidence_is_the_mean_top_1_probability():
    assert confidence(LOGITS) == pytest.approx((3 / 4 + 2 / 3) / 2, abs=1e-12)


def test_entropy_is_one_minus_the_mean_normalised_entropy():
    h = [-sum(p * math.log(p) for p in row) for row in P]
    assert entropy(LOGITS) == pytest.approx(1 - (h[0] + h[1]) / 2 / math.log(2), abs=1e-12)
    assert entropy(torch.zeros(3, 4)) == pytest.approx(0.0, abs=1e-12)  # uniform: no information
    assert entropy(torch.tensor([[50.0, 0.0, 0.0]])) == pytest.approx(1.0, abs=1e-9)  # one-hot


def test_agreement_is_the_share_of_equal_top_1_classes():
    assert agreement(LOGITS, torch.tensor([0, 1])) == 1.0
    assert agreement(LOGITS, torch.tensor([1, 1])) == 0.5
    assert agreement(LOGITS, None) is None


def test_dispersity_is_the_nuclear_norm_over_its_bound():
    """A 2 x 2 matrix's singular values sum to sqrt(||P||_F^2 + 2 |det P|); the bound is sqrt(n min(n, C)) = 2."""
    frobenius = sum(p * p for row in P for p in row)
    det = P[0][0] * P[1][1] - P[0][1] * P[1][0]
    assert dispersity(LOGITS) == pytest.approx(math.sqrt(frobenius + 2 * abs(det)) / 2, abs=1e-12)
    one_hot = torch.tensor([[40.0, 0.0], [0.0, 40.0]])
    assert dispersity(one_hot) == pytest.approx(1.0, abs=1e-9)  # confident, spread over the classes
    assert dispersity(torch.tensor([[40.0, 0.0], [40.0, 0.0]])) == pytest.approx(math.sqrt(2) / 2, abs=1e-9)  # one class


def test_mano_uses_the_taylor_normalisation_below_its_threshold():
    """Phi = -mean(log p) = 0.79 <= 5: v = 1 + z + z^2 / 2 per row, normalised to sum 1, then the 4-norm / (nC)^(1/4)."""
    rows = []
    for z in ([math.log(3.0), 0.0], [0.0, math.log(2.0)]):
        v = [1 + x + x * x / 2 for x in z]
        rows.append([x / sum(v) for x in v])
    expected = (sum(x ** 4 for row in rows for x in row) / 4) ** 0.25
    assert mano(LOGITS) == pytest.approx(expected, abs=1e-12)
    assert torch.allclose(mano_normalised(LOGITS), torch.tensor(rows, dtype=torch.float64))


def test_mano_uses_the_softmax_for_a_confident_model():
    """Phi = -mean(log p) = (20 + 20) / 4 = 10 > 5: the softmax, here one-hot up to e^-20."""
    logits = torch.tensor([[20.0, 0.0], [0.0, 20.0]])
    assert mano(logits) == pytest.approx((2 / 4) ** 0.25, abs=1e-6)


def test_an_empty_client_has_no_estimate_and_every_estimator_is_reported():
    empty = torch.zeros(0, 3)
    assert all(v is None for v in estimates(empty, {"zero_shot": torch.zeros(0, dtype=torch.long)}).values())
    found = estimates(LOGITS, {"zero_shot": torch.tensor([0, 0])})
    assert list(found) == list(ESTIMATORS) and found["agreement_zero_shot"] == 0.5
    assert found["agreement_server"] is None  # no server's predictions given
    assert set(AGREEMENTS) < set(ESTIMATORS)
    assert all(0.0 <= v <= 1.0 for v in found.values() if v is not None)
