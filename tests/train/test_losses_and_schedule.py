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


class ConstantWarmupScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Dassl's constant warm-up around a successor (PanBikang/PromptFolio @ 8f729aa,
    Dassl/dassl/optim/lr_scheduler.py L10-54), transcribed."""

    def __init__(self, optimizer, successor, warmup_epoch, cons_lr, last_epoch=-1):
        self.successor, self.warmup_epoch, self.cons_lr = successor, warmup_epoch, cons_lr
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch >= self.warmup_epoch:
            return self.successor.get_last_lr()
        return [self.cons_lr for _ in self.base_lrs]

    def step(self, epoch=None):
        if self.last_epoch >= self.warmup_epoch:
            self.successor.step(epoch)
            self._last_lr = self.successor.get_last_lr()
        else:
            super().step(epoch)


def promptfolio_rates(lr: float, epochs: int, t_max: int, warmup: int, cons_lr: float) -> list[float]:
    """The learning rate of each local epoch under PromptFolio's released schedule (build_lr_scheduler L83-150:
    CosineAnnealingLR(T_max = MAX_EPOCH) in Dassl's constant warm-up, WARMUP_RECOUNT True; `update_lr` once per local
    epoch, trainers/PromptFolio.py L352-353, never reset), one client's epochs in a row."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = ConstantWarmupScheduler(optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, float(t_max)),
                                        warmup, cons_lr)
    rates = []
    for _ in range(epochs):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_a_cosine_never_restarted_is_torchs_cosine_annealing_in_dassls_warm_up(tiny_clip, warmup):
    """optim.cosine_epochs T (with optim.warmup_epochs): the rates of a client's local epochs over the rounds are those
    of PromptFolio's scheduler stepped through them (T = 5, 5 local epochs a round: the cosine falls to 0 within a
    round and rises again in the next), whatever the refresh period."""
    from fedur.labels.fpl import FPL
    from fedur.methods.promptfolio import PromptFolio
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.module import Optimization

    model = PromptedCLIP(tiny_clip, ["cat", "dog"], n_ctx=2, visual_tokens=0, visual_depth=None, init_std=0.02, seed=1)
    tuner = PromptTuner(model, PromptFolio(), FPL())
    optim = Optimization(lr=0.002, local_epochs=5, refresh_every=5, cosine_epochs=5, warmup_epochs=warmup, warmup_lr=1e-5)
    rates = []
    for round_idx in range(4):
        optimization = tuner.configure_optimizers([torch.zeros(2, requires_grad=True)], round_idx, optim)
        optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        for _ in range(5):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    expected = promptfolio_rates(0.002, 20, 5, warmup, 1e-5) if warmup else promptfolio_rates(0.002, 20, 5, 0, 0.0)
    assert rates == pytest.approx(expected, rel=1e-9, abs=1e-15)
    rising = rates[warmup + 5: warmup + 10]  # after T epochs the cosine is at 0 and rises again
    assert rising[0] == pytest.approx(0.0, abs=1e-12) and rising == sorted(rising) and rising[-1] > 0.0017
    restarting = Optimization(lr=0.002, local_epochs=5, refresh_every=5)  # FedUR's: one cosine over 25 epochs
    fifth = tuner.configure_optimizers([torch.zeros(2, requires_grad=True)], 4, restarting)["optimizer"].param_groups[0]["lr"]
    assert fifth == pytest.approx(0.002 * 0.5 * (1 + math.cos(math.pi * 20 / 25)))  # round 5 starts at 9.5% of the rate
    assert fifth <= 0.096 * 0.002
