import math

import pytest
import torch

from fedur.train.losses import negative_loss, positive_loss
from fedur.train.module import cosine_lr


def test_weighted_cross_entropy_by_hand():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 1])
    l0, l1 = math.log(1 + math.exp(-2)), math.log(1 + math.exp(-1))
    assert positive_loss(logits, labels).item() == pytest.approx((l0 + l1) / 2)
    weighted = positive_loss(logits, labels, torch.tensor([3.0, 1.0])).item()
    assert weighted == pytest.approx((3 * l0 + l1) / 4)


def test_negative_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [5.0, 0.0]])
    negatives = torch.tensor([[True, False], [False, False]])  # the second sample has no negatives
    assert negative_loss(logits, negatives).item() == pytest.approx(-math.log(0.5 + 1e-7) / 2)
    three = torch.tensor([[math.log(2.0), 0.0, 0.0]])  # p = [.5, .25, .25]
    both = negative_loss(three, torch.tensor([[False, True, True]])).item()
    assert both == pytest.approx(-math.log(0.75 + 1e-7), rel=1e-5)  # averaged over |N(x)| = 2


def test_cosine_schedule_over_a_refresh_period():
    assert cosine_lr(0.1, 0, 50) == pytest.approx(0.1)
    assert cosine_lr(0.1, 10, 50) == pytest.approx(0.0904508, rel=1e-5)  # first epoch of round 1
    assert cosine_lr(0.1, 25, 50) == pytest.approx(0.05)
    assert cosine_lr(0.1, 49, 50) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 49 / 50)))
