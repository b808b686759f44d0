"""FPL: the top-K most confident zero-shot (or current-model) pseudo-labels per class (FedUR implementation spec, sec. 10).

Menghini et al., NeurIPS 2023, `BatsResearch/menghini-neurips23-code`,
`utils/clip_pseudolabels.py::compute_pseudo_labels` (the branch with k < 10000000). Used per client, with no
cooperation: each client keeps at most `per_class` samples per class from its own predictions.
"""

from __future__ import annotations

import torch
from jsonargparse.typing import PositiveInt
from torch import Tensor

from fedur.labels.base import HardLabeller
from fedur.labels.selection import select_top


def fpl_select(probs: Tensor, per_class: int = 16, fill_other_classes: bool = False) -> tuple[Tensor, Tensor]:
    """(indices, labels) of the samples FPL trains on, from probabilities (n, C).

    Default (`fill_other_classes=False`), the CPL/FedCoPL `InstanceSelector` semantics with one-hot labels:
    for each class c, the `per_class` samples whose argmax is c with the highest p_c (all of them if fewer).
    Each sample competes only for its argmax class and appears at most once. Returns (m,) int64 indices
    sorted ascending and their (m,) argmax labels; among equal p_c the lower index wins.

    `fill_other_classes=True` replays Menghini's streaming leaderboards (`_menghini_leaderboards`): a sample
    that does not enter its argmax class's top-K is offered to every other class in descending p_j order
    and joins each leaderboard it qualifies for, so one index may appear with several labels. Rows are then
    sorted by (index, label).
    """
    num_classes = probs.shape[1]
    if not fill_other_classes:
        return select_top(probs, torch.full((num_classes,), per_class, dtype=torch.long, device="cpu"))
    return _menghini_leaderboards(probs, per_class)


def _menghini_leaderboards(probs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Menghini's `compute_pseudo_labels` loop, one sample at a time in index order (lines 48-109).

    Per sample i with prediction y = argmax p(i) (first maximum on ties) and score s = p_y(i):
    - if leaderboard[y] holds fewer than k entries, append (s, i) (unsorted, as the reference does);
    - elif the LAST entry of leaderboard[y] has a score < s, insert and keep the top k by score;
    - else, for every other class j in descending (p_j, j) order (the reference sorts (prob, j) tuples
      in reverse, so equal probabilities visit the higher class first), apply the same two rules to
      leaderboard[j] with score p_j(i); there is no break, so i may join several leaderboards.
    Kept quirks: the comparison is against the last entry, which is the minimum only after a sort;
    evicted samples are never re-offered. Deviation: the reference breaks equal scores by image path
    (descending); here the lower index ranks first.
    """
    n, num_classes = probs.shape
    p = probs.detach().double().tolist()
    boards: list[list[tuple[float, int]]] = [[] for _ in range(num_classes)]

    def offer(c: int, score: float, i: int) -> bool:
        board = boards[c]
        if len(board) < k:
            board.append((score, i))
            return True
        if k > 0 and board[-1][0] < score:
            boards[c] = sorted(board + [(score, i)], key=lambda t: (-t[0], t[1]))[:k]
            return True
        return False

    preds = probs.argmax(dim=-1).tolist()
    for i in range(n):
        y = preds[i]
        if not offer(y, p[i][y], i):
            others = sorted(((p[i][j], j) for j in range(num_classes) if j != y), reverse=True)
            for score, j in others:
                offer(j, score, i)
    pairs = sorted((i, c) for c, board in enumerate(boards) for _, i in board)
    if not pairs:
        return torch.zeros(0, dtype=torch.long, device="cpu"), torch.zeros(0, dtype=torch.long, device="cpu")
    out = torch.tensor(pairs, dtype=torch.long, device="cpu")
    return out[:, 0], out[:, 1]


class FPL(HardLabeller):
    """FPL per client: the `per_class` most confident samples predicted as each class, hard labels,
    (class-weighted) cross-entropy; no cooperation, no class weights or negatives unless set."""

    def __init__(self, per_class: PositiveInt = 16, **kwargs) -> None:
        """
        Args:
            per_class: Pseudo-labels per class and client (the most confident samples predicted as the class).
        """
        super().__init__(**kwargs)
        self.per_class = int(per_class)

    def describe(self) -> str:
        return f"fpl ({self.per_class} per class, class weights {self.class_weight_fn}, negatives {self.negatives})"

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        return fpl_select(probs, self.per_class)
