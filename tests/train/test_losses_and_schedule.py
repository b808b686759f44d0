import math

import pytest
import torch

from fedur.labels.losses import negative_loss, positive_loss
from fedur.train.module import PromptTuner, cosine_factor


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
    assert cosine_factor(0, 0, 50) == pytest.approx(1.0)
    assert cosine_factor(0, 10, 50) == pytest.approx(0.904508, rel=1e-5)  # first epoch of round 1
    assert cosine_factor(5, 20, 50) == pytest.approx(0.5)
    assert cosine_factor(9, 40, 50) == pytest.approx(0.5 * (1 + math.cos(math.pi * 49 / 50)))


def test_the_tuners_scheduler_restarts_at_every_refresh(tiny_clip):
    """configure_optimizers gives SGD and its LR scheduler, positioned at the round's first local epoch of its
    pseudo-label period: lr0 (1 + cos(pi e / E)) / 2, e counted from the last refresh (E = 3 rounds x 2 epochs)."""
    from fedur.labels.copl import CoDPL
    from fedur.methods.fedur import FedUR
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.module import Optimization

    model = PromptedCLIP(tiny_clip, ["cat", "dog"], n_ctx=2, visual_tokens=1, visual_depth=1, init_std=0.02, seed=1)
    tuner, optim = PromptTuner(model, FedUR(), CoDPL()), Optimization(lr=0.2, local_epochs=2, refresh_every=3)
    lrs = {}
    for round_idx in range(4):
        params = [torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)]
        optimization = tuner.configure_optimizers(params, round_idx, optim)
        optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        assert optimization["lr_scheduler"]["interval"] == "epoch"
        assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in params]
        epochs = []
        for _ in range(2):
            epochs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        lrs[round_idx] = epochs
    expected = [0.2 * 0.5 * (1 + math.cos(math.pi * e / 6)) for e in range(6)]
    assert lrs[0] + lrs[1] + lrs[2] == pytest.approx(expected)
    assert lrs[3] == pytest.approx(expected[:2])  # round 3 starts the next period


def test_the_constant_schedule_keeps_the_peak_rate(tiny_clip):
    """optim.schedule constant (FedOTP's released StepLR with gamma 1): every epoch of every round at optim.lr."""
    from fedur.labels.fpl import FPL
    from fedur.methods.fedotp import FedOTP
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.module import Optimization

    model = PromptedCLIP(tiny_clip, ["cat", "dog"], n_ctx=2, visual_tokens=1, visual_depth=1, init_std=0.02, seed=1)
    tuner, optim = PromptTuner(model, FedOTP(), FPL()), Optimization(lr=0.003, local_epochs=3, refresh_every=2,
                                                                     schedule="constant")
    for round_idx in range(3):
        optimization = tuner.configure_optimizers([torch.zeros(2, requires_grad=True)], round_idx, optim)
        optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        for _ in range(3):
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.003)
            optimizer.step()
            scheduler.step()
