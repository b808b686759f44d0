import math

import pytest
import torch

from fedur.methods.cache import build_cache, cache_logits, shots_per_class
from fedur.methods.proximal import proximal_term


def test_cache_logits_by_hand():
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    keys = torch.tensor([[1.0, 0.0], [0.6, 0.8]])  # key 0 votes for class 1, key 1 for class 0
    values = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    # affinities [[1, .6], [0, .8]] -> weights exp(-5.5 (1 - a)) = [[1, e^-2.2], [e^-5.5, e^-1.1]]
    expected = torch.tensor([[math.exp(-2.2), 1.0], [math.exp(-1.1), math.exp(-5.5)]])
    assert torch.allclose(cache_logits(features, keys, values), expected, rtol=1e-5)
    assert torch.allclose(cache_logits(features, keys, values, alpha=2.0, beta=5.5), 2 * expected, rtol=1e-5)
    # beta 1: [[e^-.4, 1], [e^-.2, e^-1]]
    expected_b1 = torch.tensor([[math.exp(-0.4), 1.0], [math.exp(-0.2), math.exp(-1.0)]])
    assert torch.allclose(cache_logits(features, keys, values, beta=1.0), expected_b1, rtol=1e-5)


def test_build_cache_normalises_keys_and_one_hots_labels():
    keys, values = build_cache(torch.tensor([[3.0, 4.0], [0.0, 2.0]]), torch.tensor([1, 0]), num_classes=3)
    assert torch.allclose(keys, torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
    assert values.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert values.dtype == torch.float32


def test_empty_cache_adds_nothing():
    keys, values = build_cache(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), num_classes=3)
    out = cache_logits(torch.eye(4)[:2], keys, values)
    assert out.shape == (2, 3) and not out.any()


def test_proximal_term_value_and_gradient():
    p1 = torch.tensor([1.0, 2.0], requires_grad=True)
    p2 = torch.tensor([[3.0]], requires_grad=True)
    a1 = torch.tensor([0.0, 0.0], requires_grad=True)
    a2 = torch.tensor([[1.0]])
    term = proximal_term([p1, p2], [a1, a2], mu=0.5)
    # (0.5 / 2) * (1 + 4 + 4) = 2.25 (with mu instead of mu / 2 it would be 4.5)
    assert term.item() == pytest.approx(2.25)
    term.backward()
    assert p1.grad.tolist() == [0.5, 1.0]  # mu * (p - a)
    assert p2.grad.tolist() == [[1.0]]
    assert a1.grad is None  # anchors are constants


def test_proximal_term_is_zero_at_the_anchor_and_for_no_params():
    p = torch.randn(4, 3)
    assert proximal_term([p], [p.clone()], mu=0.5).item() == 0.0
    assert proximal_term([], [], mu=0.5).item() == 0.0
    with pytest.raises(ValueError):
        proximal_term([p], [], mu=0.5)


def test_a_cached_sample_does_not_vote_for_itself():
    keys = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8]]), dim=-1)  # two cached samples
    values = torch.eye(2)
    query = keys[:1]  # the first cached sample itself, as a training batch shows it
    with_self = cache_logits(query, keys, values, alpha=1.0, beta=2.0)
    without = cache_logits(query, keys, values, alpha=1.0, beta=2.0, self_vote=False)
    assert with_self[0, 0].item() == pytest.approx(1.0)  # its own key: exp(0)
    assert without[0, 0].item() == 0.0  # ... gone
    assert without[0, 1].item() == pytest.approx(math.exp(-2.0 * (1 - 0.6)))  # the other sample still votes


def test_shots_per_class_keeps_the_most_confident_of_each_class():
    labels = torch.tensor([0, 0, 0, 1, 2, 2, 0])
    confidence = torch.tensor([0.5, 0.9, 0.7, 0.4, 0.8, 0.8, 0.9])
    # class 0: 0.9 at positions 1 and 6 (tie: the lower first), then 0.7; class 1: its one; class 2: both (tied)
    assert shots_per_class(labels, confidence, 2).tolist() == [1, 3, 4, 5, 6]
    assert shots_per_class(labels, confidence, 1).tolist() == [1, 3, 4]
    assert shots_per_class(labels[:0], confidence[:0], 3).tolist() == []
