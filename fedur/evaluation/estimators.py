"""Each client's accuracy estimated from the logits of its unlabelled images, each estimator a pure function of
(n, C) logits (and, for an agreement, a reference model's predictions on the same images) with its source.

Every estimate is a number in [0, 1] (reported as %): for `confidence` and the agreements it is an estimate of the
accuracy itself; for `entropy`, `dispersity` and `mano` it is the source's score, on the same scale but not
calibrated to it (their papers fit a line from the score to the accuracy on labelled shifts, which a label-free
federation does not have): rank with them, compare their values with care (docs/label-free.md).

    confidence           1/n sum_i max_c p_ic                                  Hendrycks & Gimpel (ICLR 2017),
                                                                               as an accuracy estimate: Guillory et al.
                                                                               (ICCV 2021) "AC", Sec. 3
    entropy              1 - 1/n sum_i H(p_i) / log C                          the negative entropy score (Garg et al.,
                                                                               ICLR 2022, ATC-NE, Sec. 3), normalised
    agreement_zero_shot  1/n sum_i [argmax_c z_ic = argmax_c z0_ic]            agreement with zero-shot CLIP: Jiang et al.
                                                                               (ICLR 2022), Baek et al. (NeurIPS 2022)
    agreement_server     the same with the server's model's predictions        ditto
    dispersity           ||P||_* / sqrt(n min(n, C))                           Deng et al. (ICML 2023), the nuclear norm
                                                                               of the prediction matrix, Eq. 3-4
    mano                 (1/(nC) sum_ic |s(z)_ic|^4)^(1/4), s softmax when    Xie et al. (NeurIPS 2024), Alg. 1: the
                         the mean cross-entropy to the uniform is > 5, else   criterion Phi (Eq. 8), Taylor
                         the 2nd-order Taylor normalisation                   normalisation (Eq. 6), the 4-norm (Eq. 5)

p = softmax(z); an estimator of an empty matrix (a client without images) is None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

Estimator = Literal["confidence", "entropy", "agreement_zero_shot", "agreement_server", "dispersity", "mano"]
ESTIMATORS: tuple[str, ...] = ("confidence", "entropy", "agreement_zero_shot", "agreement_server", "dispersity", "mano")
AGREEMENTS = {"agreement_zero_shot": "zero_shot", "agreement_server": "server"}  # estimator -> the reference model
DEFAULT: str = "confidence"  # evaluation.estimator's default: the lowest regret of the label-free choice over the
# measured grid, and the one estimate meant as an accuracy (benchmarks/results/label_free/, docs/label-free.md)

MANO_NORM = 4  # MaNo's p (Xie et al. 2024: p = 4)
MANO_THRESHOLD = 5.0  # MaNo's eta: the criterion above which the softmax normalises (Xie et al. 2024: 5)


def _probabilities(logits: Tensor) -> Tensor:
    return torch.softmax(logits.double(), dim=-1)  # float64: a sum over thousands of images


def confidence(logits: Tensor) -> float | None:
    """Average confidence: the mean over the images of the largest softmax probability (Hendrycks & Gimpel 2017;
    Guillory et al. 2021's AC)."""
    if len(logits) == 0:
        return None
    return float(_probabilities(logits).max(dim=-1).values.mean())


def entropy(logits: Tensor) -> float | None:
    """1 - the mean entropy of the softmax over log C (the negative-entropy score of Garg et al. 2022, put on [0, 1]:
    1 for one-hot predictions, 0 for uniform ones)."""
    if len(logits) == 0:
        return None
    num_classes = logits.shape[-1]
    if num_classes < 2:
        return 1.0
    log_p = torch.log_softmax(logits.double(), dim=-1)
    h = -(log_p.exp() * log_p).sum(dim=-1)  # (n,) nats
    return float(1.0 - h.mean() / math.log(num_classes))


def agreement(logits: Tensor, reference: Tensor | None) -> float | None:
    """The share of images whose top-1 class equals the reference model's `reference` ((n,) int64 predictions on the
    same images): an estimate of the accuracy where the two models err independently (Jiang et al. 2022, GDE; Baek et
    al. 2022). None without a reference."""
    if len(logits) == 0 or reference is None:
        return None
    return float((logits.argmax(dim=-1) == reference.to(logits.device)).double().mean())


def dispersity(logits: Tensor) -> float | None:
    """The nuclear norm of the (n, C) softmax prediction matrix over its upper bound sqrt(n min(n, C)) (Deng et al.
    2023, Eq. 3-4): 1 for confident predictions spread evenly over the classes; it falls with confidence and with
    predictions that pile onto few classes (so it reads a client's label skew as a loss: docs/label-free.md)."""
    if len(logits) == 0:
        return None
    p = _probabilities(logits)
    n, num_classes = p.shape
    return float(torch.linalg.svdvals(p).sum() / math.sqrt(n * min(n, num_classes)))


def mano_normalised(logits: Tensor) -> Tensor:
    """MaNo's normalisation (Xie et al. 2024): the softmax where the mean cross-entropy from the uniform to the softmax,
    Phi = -1/(nC) sum_ic log p_ic (Eq. 8), is above eta = 5 (a confident model); else the 2nd-order Taylor
    normalisation v / ||v||_1, v = 1 + z + z^2 / 2 (Eq. 6; positive for every z)."""
    z = logits.double()
    criterion = -torch.log_softmax(z, dim=-1).mean()
    if criterion > MANO_THRESHOLD:
        return torch.softmax(z, dim=-1)
    v = 1.0 + z + z * z / 2.0
    return v / v.sum(dim=-1, keepdim=True)


def mano(logits: Tensor) -> float | None:
    """MaNo's score (Xie et al. 2024, Alg. 1): the entry-wise 4-norm of the normalised prediction matrix over
    (nC)^(1/4), in [0, 1]."""
    if len(logits) == 0:
        return None
    s = mano_normalised(logits)
    n, num_classes = s.shape
    return float((s.abs() ** MANO_NORM).sum() ** (1.0 / MANO_NORM) / (n * num_classes) ** (1.0 / MANO_NORM))


SCORES: dict[str, Callable[[Tensor], float | None]] = {
    "confidence": confidence, "entropy": entropy, "dispersity": dispersity, "mano": mano}


def estimates(logits: Tensor, references: dict[str, Tensor | None]) -> dict[str, float | None]:
    """{estimator: value in [0, 1] or None} of one model on one client's images, in ESTIMATORS order; `references`:
    {"zero_shot": (n,), "server": (n,)} the reference models' predictions on the same images (None, or absent: that
    agreement is None; the model itself is never its own reference: the caller leaves it out)."""
    out = {}
    for name in ESTIMATORS:
        if name in AGREEMENTS:
            out[name] = agreement(logits, references.get(AGREEMENTS[name]))
        else:
            out[name] = SCORES[name](logits)
    return out


def as_percent(values: dict[str, float | None]) -> dict[str, float | None]:
    return {name: None if v is None else 100.0 * v for name, v in values.items()}
