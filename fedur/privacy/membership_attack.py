"""Membership inference's arithmetic (fedur-attack, docs/privacy-attacks.md): each image's score under an attacked
model, the members and non-members balanced, and how well a score tells them apart. Pure functions of arrays.

A score is higher for an image the attack takes for a member. Two attacks:
- loss (Yeom et al., CSF 2018, "Privacy risk in machine learning"): score = -CE(logits, y), the model's loss on the
  true label; a model fits its train images better than others. Without labels, the confidence: max softmax.
- calibrated (Watson et al., ICLR 2022, "On the importance of difficulty calibration in membership inference
  attacks"): score = -(CE(logits, y) - CE(reference logits, y)), the loss less the loss a reference model that saw
  none of the images has on the same image, so that an image easy for every model is not taken for a member.
  Without labels, y is the attacked model's own prediction.
"""

from __future__ import annotations

import math

import numpy as np
import torch.nn.functional as F
from torch import Tensor

LOW_FPR = 0.01  # the false-positive rate the low-FPR metric is read at (Carlini et al. 2022: TPR at 1% FPR)


def attack_scores(logits: Tensor, reference: Tensor, labels: Tensor | None) -> dict[str, np.ndarray]:
    """{"loss": (n,), "calibrated": (n,)} float64 scores of `logits` (n, C) with `reference` (n, C) the reference
    model's logits on the same images and `labels` (n,) their true classes (None: the data has none; then "loss" is
    the confidence, max softmax, and "calibrated" reads the attacked model's prediction as the label)."""
    logits, reference = logits.double(), reference.double()
    if labels is None:
        predicted = logits.argmax(dim=-1)
        calibrated = -(F.cross_entropy(logits, predicted, reduction="none") - F.cross_entropy(reference, predicted, reduction="none"))
        return {"loss": logits.softmax(dim=-1).amax(dim=-1).numpy(), "calibrated": calibrated.numpy()}
    loss = F.cross_entropy(logits, labels, reduction="none")  # (n,)
    return {"loss": (-loss).numpy(), "calibrated": (-(loss - F.cross_entropy(reference, labels, reduction="none"))).numpy()}


def roc_auc(members: np.ndarray, non_members: np.ndarray) -> float:
    """The area under the ROC curve of a score that calls an image a member when it is high: the probability that a
    member drawn at random scores above a non-member drawn at random, a tie counted half (the Mann-Whitney U over
    n_m n_n). Exact: from the midranks of the pooled scores, U = (sum of the members' ranks) - n_m (n_m + 1) / 2."""
    members, non_members = np.asarray(members, dtype=np.float64), np.asarray(non_members, dtype=np.float64)
    if len(members) == 0 or len(non_members) == 0:  # internal: fedur-attack leaves empty clients out first
        raise ValueError(f"an AUC needs members and non-members, got {len(members)} and {len(non_members)}")  # internal
    pooled = np.concatenate([members, non_members])
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank (from 1) of each distinct value's last copy
    midranks = last - (counts - 1) / 2.0
    u = midranks[inverse[: len(members)]].sum() - len(members) * (len(members) + 1) / 2.0
    return float(u / (len(members) * len(non_members)))


def tpr_at_fpr(members: np.ndarray, non_members: np.ndarray, max_fpr: float = LOW_FPR) -> float:
    """The largest true-positive rate of a threshold rule "member when score >= t" whose false-positive rate is at
    most `max_fpr`. At most k = floor(max_fpr n_n) non-members may reach t: the best t lies just above the (k+1)-th
    highest non-member score v, so the rate is the share of members scoring above v (every member when k >= n_n).
    With fewer than 1 / max_fpr non-members k is 0: the members scoring above every non-member."""
    members, non_members = np.asarray(members, dtype=np.float64), np.asarray(non_members, dtype=np.float64)
    if len(members) == 0 or len(non_members) == 0:  # internal: fedur-attack leaves empty clients out first
        raise ValueError(f"a TPR needs members and non-members, got {len(members)} and {len(non_members)}")  # internal
    allowed = math.floor(max_fpr * len(non_members) + 1e-9)  # the tolerance: 0.01 x 300 must stay 3
    if allowed >= len(non_members):
        return 1.0
    v = np.sort(non_members)[::-1][allowed]
    return float((members > v).mean())


def balanced(members: int, non_members: int, seed: int, client_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted positions of the members and non-members kept of a client's `members` train and `non_members` test
    images: the smaller set whole, the larger subsampled to its size without replacement, from a generator of
    (seed, client_id) alone (a client's draw does not depend on the others')."""
    n = min(members, non_members)
    generator = np.random.default_rng([seed, client_id])

    def keep(total: int) -> np.ndarray:
        return np.arange(total, dtype=np.int64) if total == n else np.sort(generator.choice(total, n, replace=False))
    return keep(members), keep(non_members)


def measured(members: np.ndarray, non_members: np.ndarray) -> dict:
    """What membership.json reports of one attack on one model."""
    return {"auc": roc_auc(members, non_members), "tpr_at_1pct_fpr": tpr_at_fpr(members, non_members),
            "members": len(members), "non_members": len(non_members)}


def mean_rows(rows: list[dict], model: str) -> list[dict]:
    """The means over `rows` (the personal models' results) of each attack's AUC and TPR, with the images summed."""
    means = []
    for attack in dict.fromkeys(row["attack"] for row in rows):
        mine = [row for row in rows if row["attack"] == attack]
        means.append({"model": model, "attack": attack, "score": mine[0]["score"], "models": len(mine),
                      "auc": float(np.mean([r["auc"] for r in mine])),
                      "tpr_at_1pct_fpr": float(np.mean([r["tpr_at_1pct_fpr"] for r in mine])),
                      "members": sum(r["members"] for r in mine), "non_members": sum(r["non_members"] for r in mine)})
    return means
