"""Calibration where labels exist: the expected calibration error over 15 equal-width confidence bins (Naeini et al.,
AAAI 2015; Guo et al., ICML 2017, Eq. 3), ECE = sum_b (n_b / n) |acc(b) - conf(b)|, and the reliability diagram's
bins.

A model's bins are a (15, 3) int64 tensor [images, correct, confidence sum in units of 2^-32] per bin: exact
integers, so bins of several clients or several ranks add up to the same numbers in any order (a placement of clients
on ranks changes nothing), and the ECE of pooled bins is the ECE of the pooled images up to the 2^-32 units."""

from __future__ import annotations

import torch
from torch import Tensor

BINS = 15
UNIT = 2**32  # a confidence of 1 in the bins' fixed point


def empty_bins() -> Tensor:
    return torch.zeros(BINS, 3, dtype=torch.long, device="cpu")


def calibration_bins(logits: Tensor, labels: Tensor) -> Tensor:
    """(BINS, 3) int64 [images, correct, sum of confidences x 2^32 (rounded)] of the images whose top-1 softmax
    probability (the confidence) lies in each bin ((b/15, (b+1)/15], the first also holding 0)."""
    if len(logits) == 0:
        return empty_bins()
    p = torch.softmax(logits.double(), dim=-1).cpu()
    conf, predicted = p.max(dim=-1)
    which = (torch.ceil(conf * BINS).long() - 1).clamp(0, BINS - 1)  # (n,) the bin of each image
    correct = (predicted == labels.cpu()).long()
    fixed = torch.round(conf * UNIT).long()
    out = empty_bins()
    out[:, 0].index_add_(0, which, torch.ones_like(which))
    out[:, 1].index_add_(0, which, correct)
    out[:, 2].index_add_(0, which, fixed)
    return out


def ece(bins: Tensor) -> float | None:
    """The expected calibration error in % of (BINS, 3) bins: sum_b |correct_b - confidence_b| / n x 100; None
    without an image."""
    n = int(bins[:, 0].sum())
    if n == 0:
        return None
    gap = (bins[:, 1].double() - bins[:, 2].double() / UNIT).abs().sum()
    return float(100.0 * gap / n)


def reliability(bins: Tensor) -> list[dict]:
    """The reliability diagram's points: per bin with images {"low", "high", "images", "accuracy", "confidence"} (%)."""
    out = []
    for b, (n, correct, fixed) in enumerate(bins.tolist()):
        if n:
            out.append({"low": 100.0 * b / BINS, "high": 100.0 * (b + 1) / BINS, "images": n,
                        "accuracy": 100.0 * correct / n, "confidence": 100.0 * fixed / UNIT / n})
    return out
