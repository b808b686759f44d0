"""The expected calibration error over 15 equal-width bins on hand-written logits."""

import math

import pytest
import torch

from fedur.evaluation.calibration import BINS, UNIT, calibration_bins, ece, reliability


def logits_of(probabilities: list[list[float]]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in row] for row in probabilities])


def test_ece_of_two_images_in_two_bins():
    """Confidence 0.9 (bin 13) right, 0.7 (bin 10) wrong: (|1 - 0.9| + |0 - 0.7|) / 2 = 40%."""
    bins = calibration_bins(logits_of([[0.9, 0.1], [0.7, 0.3]]), torch.tensor([0, 1]))
    assert bins.shape == (BINS, 3) and bins[:, 0].tolist() == [0] * 10 + [1, 0, 0, 1, 0]
    assert bins[13, 1] == 1 and bins[10, 1] == 0
    assert ece(bins) == pytest.approx(40.0, abs=1e-6)


def test_ece_of_two_images_in_one_bin():
    """0.7 right and 0.72 wrong share bin 10: |1/2 - 0.71| = 21%."""
    bins = calibration_bins(logits_of([[0.7, 0.3], [0.72, 0.28]]), torch.tensor([0, 1]))
    assert bins[10, 0] == 2
    assert ece(bins) == pytest.approx(21.0, abs=1e-6)
    assert reliability(bins) == [pytest.approx({"low": 100 * 10 / 15, "high": 100 * 11 / 15, "images": 2,
                                                "accuracy": 50.0, "confidence": 71.0})]


def test_bins_add_up_exactly_in_any_order():
    """Integer bins: the pooled bins of two halves are the bins of the whole, whatever the order."""
    torch.manual_seed(0)
    logits, labels = torch.randn(50, 5) * 3, torch.randint(0, 5, (50,))
    whole = calibration_bins(logits, labels)
    assert torch.equal(calibration_bins(logits[:20], labels[:20]) + calibration_bins(logits[20:], labels[20:]), whole)
    assert int(whole[:, 0].sum()) == 50 and int(whole[:, 2].sum()) <= 50 * UNIT
    assert ece(calibration_bins(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))) is None
