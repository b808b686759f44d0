"""CPL: candidate pseudo-label sets, their per-class selection and the 'cc' loss (FedUR implementation spec, sec. 10).

Zhang et al., ICML 2024, `vanillaer/CPL-ICML2024`:
- candidate sets: `utils/clip_pseudolabels.py::gererate_partialY` (method 'CPL') = intra-instance
  `detect_candidate_bycum` at conf_thr = `get_partialY_byAutoThr` ('quantile') AND inter-instance
  `detect_candidate_bycls_thr`, each renormalised by `get_partialY_byThr`;
- selection: `InstanceSelector.select_topk_for_eachcls` / `_fill_pools` with `utils/utils.py::ClassPool`,
  called as in `methods/unsupervised_learning_new/textual_PL.py::_create_training_dataset`;
- loss: `utils/loss.py::PLL_loss.forward_cc` (the scripts' `loss_types=('cc')`).

Per-refresh K (`per_class`). CPL's `textual_fpl` setting selects N_PSEUDOSHOTS = 16 per class
once: an integer here, the default, as for FPL. Its `grip_textual` setting grows K at every iteration
(`training_strategies.py::grip_train`) and caps each class's pool by its previous fill
(`select_topk_for_eachcls` step 2): `grip` here, with the refreshes as GRIP's iterations. At refresh t a
client's K is `grip_per_class(n_k, C, t, step)` over its own n_k images, and each pool's capacity
`cpl_pool_caps(previous fill, K)`. [guess] K is at least 1: a client's n_k is a tenth of CPL's n, and the
formula gives 0 at the first refresh wherever n_k / 10 < C (DTD with 10 clients: 37 / 47); and every
pool may grow by at least 1 per refresh, so that pools can refill where K stalls (`CPL.pool_sizes`).
"""

from __future__ import annotations

import heapq
from typing import Literal

import torch
from jsonargparse.typing import OpenUnitInterval, PositiveInt
from torch import Tensor

from fedur.labels.base import Labeller, PseudoLabels

EPS = 1e-7  # the reference's threshold on renormalised candidate weights (`> 1e-7` everywhere)

# (alpha, beta) per dataset from `scripts/run-textPT_ALL.sh` (learning_paradigm 'ul'): alpha = CONF_QUANTILE / 100
# (quantile of the max-probs that sets conf_thr), beta = REGULAR_THRESHOLD (per-class quantile).
CPL_QUANTILES: dict[str, tuple[float, float]] = {
    "dtd": (0.75, 0.95),
    "resisc45": (0.90, 0.97),
    "cub": (0.75, 0.99),
    "flowers102": (0.60, 0.99),
    "eurosat": (0.75, 0.80),
    "fgvc_aircraft": (0.90, 0.97),
}
DEFAULT_CPL_QUANTILES = (0.75, 0.95)  # [guess] ucf101, cifar10, cifar100, domainnet, officehome, others
# STEP_QUANTILE (percent of the data added per GRIP iteration) from the same script: 20 for CUB, else 10.
CPL_STEP_QUANTILE: dict[str, int] = {"cub": 20}
DEFAULT_STEP_QUANTILE = 10


def cpl_quantiles(dataset: str) -> tuple[float, float]:
    """(alpha, beta) of CPL's candidate rules for a dataset name; (0.75, 0.95) where CPL gives none."""
    return CPL_QUANTILES.get(dataset.lower(), DEFAULT_CPL_QUANTILES)


def cpl_step_quantile(dataset: str) -> int:
    """GRIP's STEP_QUANTILE (percent) for a dataset: 20 for CUB, 10 otherwise (run-textPT_ALL.sh)."""
    return CPL_STEP_QUANTILE.get(dataset.lower(), DEFAULT_STEP_QUANTILE)


def confidence_threshold(probs: Tensor, alpha_quantile: float) -> float:
    """conf_thr: the alpha-quantile (linear interpolation) of the per-sample max-probs of (n, C) probs.

    alpha = 0 means their mean, as in `get_partialY_byAutoThr` (`target_quantile == 0`).
    """
    top1 = probs.max(dim=1).values
    if alpha_quantile == 0:
        return float(top1.mean())
    return float(torch.quantile(top1, alpha_quantile))


def intra_instance(probs: Tensor, conf_thr: float) -> Tensor:
    """(n, C) bool, `detect_candidate_bycum`: per row, sort p descending and keep every class whose
    cumulative sum is <= conf_thr, plus the first one whose cumulative sum is > conf_thr (so top-1 always).

    The sort is stable (equal p: lower class first); the reference's `torch.sort` does not promise that.
    """
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(sorted_p, dim=-1)
    exceeds = cum > conf_thr
    before = torch.cat([torch.zeros_like(exceeds[:, :1]), exceeds[:, :-1]], dim=1)
    keep = (cum <= conf_thr) | (exceeds & ~before)
    keep[:, 0] |= exceeds[:, 0]  # the reference's first_elem_mask term (already implied by the line above)
    return torch.zeros_like(keep).scatter_(1, order, keep)


def inter_instance(probs: Tensor, beta_quantile: float) -> Tensor:
    """(n, C) bool, `detect_candidate_bycls_thr`: keep class c for x iff p_c(x) >= the beta-quantile
    (torch.quantile, linear interpolation) of column c over the n samples; ties at the threshold are kept."""
    thresholds = torch.quantile(probs, beta_quantile, dim=0)  # (C,)
    return probs >= thresholds


def _renormalised_support(mask: Tensor, probs: Tensor) -> Tensor:
    """(n, C) bool: classes whose weight in p restricted to `mask` and renormalised per row is > 1e-7.

    This is `get_partialY_byThr`'s normalisation followed by the reference's `> 1e-7` test; a row with no
    mass (0 / 0 = NaN) is empty.
    """
    weights = mask.to(probs.dtype) * probs
    return weights / weights.sum(dim=1, keepdim=True) > EPS


def candidate_sets(probs: Tensor, alpha_quantile: float, beta_quantile: float) -> Tensor:
    """(n, C) bool candidate set S(x) of each sample: intra-instance AND inter-instance (`gererate_partialY`).

    conf_thr = `confidence_threshold(probs, alpha_quantile)` over all n samples of the client. Each rule's
    mask is renormalised over p and thresholded at 1e-7 before the intersection, and the intersection is
    renormalised and thresholded again (the selector reads `(PL_labels > 1e-7)`), so classes with negligible
    probability drop out. Rows left empty mark the samples CPL drops.
    """
    intra = _renormalised_support(intra_instance(probs, confidence_threshold(probs, alpha_quantile)), probs)
    inter = _renormalised_support(inter_instance(probs, beta_quantile), probs)
    return _renormalised_support(intra & inter, probs)  # as the reference; implied by the intra step


def soft_candidates(probs: Tensor, candidates: Tensor) -> Tensor:
    """(n, C) float: p renormalised within each candidate set; GRIP trains on these at its first iteration
    (`PL_labels[selected_idxs]`), hard sets afterwards. An empty row gives zeros."""
    weights = candidates.to(probs.dtype) * probs
    return torch.nan_to_num(weights / weights.sum(dim=1, keepdim=True), nan=0.0)


def grip_per_class(n_samples: int, num_classes: int, iteration: int, step_quantile: int = DEFAULT_STEP_QUANTILE) -> int:
    """K_max at GRIP iteration `iteration` (0-based; `grip_train`): int((t + 1) * int(n / (100 // step)) / C),
    or floor(n / C) if that would take more than all n samples."""
    num_iter = int(100 / step_quantile)
    per_iter = int(n_samples / num_iter)
    k = int((iteration + 1) * per_iter / num_classes)
    return k if k * num_classes <= n_samples else n_samples // num_classes


def cpl_pool_caps(previous_counts: Tensor, k_max: int, min_increment: int = 0) -> Tensor:
    """(C,) int64 pool capacities of a selection after one that filled `previous_counts` (C,) per class.

    `select_topk_for_eachcls` step 2: every pool grows by the same increment k_max - max(previous), capped at
    k_max; so a class that filled fewer samples last time gets a smaller pool. All-zero previous counts (the
    first selection) give k_max everywhere. `min_increment` > 0 lets every pool grow by at least that much
    (fedur's GRIP schedule uses 1, see `CPL.pool_sizes`).
    """
    increment = k_max - int(previous_counts.max()) if previous_counts.numel() else k_max
    if increment < 0:
        raise ValueError(f"k_max {k_max} is below a previous pool fill {int(previous_counts.max())}")  # internal: pools only grow
    return torch.clamp(previous_counts.long() + max(increment, min_increment), max=k_max)


def cpl_assign(probs: Tensor, candidates: Tensor, per_class: int | Tensor = 16) -> Tensor:
    """(n,) int64: the class pool each sample ends in, -1 if none (`InstanceSelector._fill_pools`).

    Every pool c holds at most per_class (or per_class[c]) samples ranked by uncertainty 1 - p_c (float32).
    In rounds, every sample outside the pools proposes to its next candidate class, in descending p order
    (equal p: lower class first). Per round, pools take their proposers in ascending index. A pool with room
    accepts; a full pool replaces its most uncertain member (the first slot among equals) only if the
    newcomer is strictly less uncertain, and the evicted sample proposes its next candidate next round.
    A sample that has proposed to all its candidates and is outside the pools is dropped; so are samples
    with an empty set. Candidates with p < 1e-7 are never accepted (the reference gives them infinite
    uncertainty). This is the deferred-acceptance matching of samples to class pools.
    """
    n, num_classes = probs.shape
    caps = torch.as_tensor(per_class, dtype=torch.long, device="cpu").expand(num_classes)
    p32 = probs.detach().float()
    uncs = (1 - p32).tolist()
    order = torch.argsort(p32, dim=1, descending=True, stable=True)
    usable = (candidates.bool() & (p32 >= EPS)).gather(1, order)
    prefs = [[c for c, ok in zip(row, oks) if ok] for row, oks in zip(order.tolist(), usable.tolist())]

    heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(num_classes)]  # (-unc, slot, index)
    assigned = [-1] * n
    next_choice = [0] * n
    proposers = [i for i in range(n) if prefs[i]]
    while proposers:
        by_class: dict[int, list[int]] = {}
        for i in proposers:  # ascending index
            by_class.setdefault(prefs[i][next_choice[i]], []).append(i)
            next_choice[i] += 1
        for c in sorted(by_class):
            heap, cap = heaps[c], int(caps[c])
            for i in by_class[c]:
                unc = uncs[i][c]
                if len(heap) < cap:
                    heapq.heappush(heap, (-unc, len(heap), i))
                    assigned[i] = c
                elif cap > 0 and -heap[0][0] > unc:
                    _, _, evicted = heapq.heapreplace(heap, (-unc, heap[0][1], i))
                    assigned[evicted], assigned[i] = -1, c
        proposers = [i for i in range(n) if assigned[i] < 0 and next_choice[i] < len(prefs[i])]
    return torch.tensor(assigned, dtype=torch.long, device="cpu")


def cpl_select(probs: Tensor, candidates: Tensor, per_class: int | Tensor = 16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(indices, labels, candidates, pools) of the samples CPL trains on (`select_topk_for_eachcls`).

    probs (n, C), candidates (n, C) bool from `candidate_sets`, per_class an int or (C,) pool capacities.
    Returns (m,) int64 indices ascending, (m,) int64 labels, their (m, C) bool candidate sets and (m,)
    int64 the pool each filled.
    The label is the argmax of p within the candidate set (what the trainer would predict from S(x)); the
    class whose pool the sample filled (`cpl_assign`) is a lower candidate when the sample was displaced
    from the pools of its better candidates. The loss only reads the candidate set.
    """
    pools = cpl_assign(probs, candidates, per_class)
    indices = torch.nonzero(pools >= 0).flatten()
    chosen = candidates[indices].bool()
    masked = torch.where(chosen, probs[indices], torch.full_like(probs[indices], -1.0))
    return indices, masked.argmax(dim=1), chosen, pools[indices]


def cc_loss(logits: Tensor, candidates: Tensor) -> Tensor:
    """Scalar 'cc' loss: mean over the batch of -log sum_{c in S(x)} softmax(logits)_c (`forward_cc`).

    logits (B, C); candidates (B, C) bool, or float weights y (then -log sum_c y_c p_c, the reference's
    formula with soft targets). Computed as logsumexp(z) - logsumexp(z + log y). A row with an empty set
    gives +inf, as in the reference (which never trains on one).
    """
    log_weights = torch.log(candidates.to(logits.dtype))
    return (torch.logsumexp(logits, dim=1) - torch.logsumexp(logits + log_weights, dim=1)).mean()


class CPL(Labeller):
    """CPL per client: candidate sets at the dataset's (alpha, beta) (or `quantiles`), at most `per_class`
    samples per class pool (or GRIP's growing pools), trained with the 'cc' loss on the candidate sets.

    The mask is the candidate set and its labels the argmax within it. Class weights and negative
    pseudo-labels do not apply to the cc loss: CPL has neither.
    """

    def __init__(
        self,
        quantiles: tuple[OpenUnitInterval, OpenUnitInterval] | None = None,
        per_class: PositiveInt | Literal["grip"] = 16,
    ) -> None:
        """
        Args:
            quantiles: (alpha, beta) quantiles of the intra- and inter-instance candidate rules; null: the
                dataset's value from CPL's scripts ((0.75, 0.95) where they give none).
            per_class: Pseudo-labelled samples per class and client; grip: CPL's growing pools, K = (t + 1) *
                10% (20% for CUB) of the client's images / C at refresh t (at least 1), each pool holding at
                most its previous fill + max(1, K - the largest previous fill).
        """
        self.quantiles = None if quantiles is None else (float(quantiles[0]), float(quantiles[1]))
        self.per_class = per_class if per_class == "grip" else int(per_class)
        self.alpha, self.beta = self.quantiles if self.quantiles is not None else DEFAULT_CPL_QUANTILES
        self.step_quantile = DEFAULT_STEP_QUANTILE

    def bind(self, dataset: str) -> CPL:
        """The dataset's (alpha, beta) unless `quantiles` is set, and its GRIP step."""
        if self.quantiles is None:
            self.alpha, self.beta = cpl_quantiles(dataset)
        self.step_quantile = cpl_step_quantile(dataset)
        return self

    def describe(self) -> str:
        per_class = (f"GRIP pools growing {self.step_quantile}% of the data per refresh" if self.per_class == "grip"
                     else f"{self.per_class} per class")
        return f"cpl (alpha {self.alpha}, beta {self.beta}, {per_class}, cc loss)"

    def pool_sizes(self, probs: Tensor, refresh_idx: int, previous: PseudoLabels | None) -> int | Tensor:
        """Each class pool's capacity at this refresh: `per_class`, or GRIP's.

        GRIP: K = max(1, `grip_per_class`) over the client's n images; each pool may hold its previous fill plus
        K - (the largest previous fill), as CPL, but [guess] at least one more than its previous fill (up to
        K): where K stalls (held at 1, rounded down to the same value, or at n / C after the tenth refresh)
        CPL's increment is 0 and a pool that lost samples could never refill. A previous selection with a
        pool above K (not a GRIP one) counts as none.
        """
        if self.per_class != "grip":
            return self.per_class
        n, num_classes = probs.shape
        k_max = max(1, grip_per_class(n, num_classes, refresh_idx, self.step_quantile))
        filled = torch.zeros(num_classes, dtype=torch.long, device="cpu")
        if previous is not None and previous.pools is not None:
            filled = torch.bincount(previous.pools, minlength=num_classes)
        if int(filled.max()) > k_max:
            filled.zero_()
        return cpl_pool_caps(filled, k_max, min_increment=1)

    def select(self, probs: Tensor, quotas: Tensor | None = None, refresh_idx: int = 0,
               previous: PseudoLabels | None = None) -> PseudoLabels:
        candidates = candidate_sets(probs.float(), self.alpha, self.beta)
        indices, labels, chosen, pools = cpl_select(probs.float(), candidates, self.pool_sizes(probs, refresh_idx, previous))
        return PseudoLabels(indices, labels, chosen, pools, confidence=probs[indices, labels].float())

    def loss(
        self, logits: Tensor, labels: Tensor, mask: Tensor, class_weights: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        loss = cc_loss(logits.float(), mask)
        return loss, loss.detach(), torch.zeros((), device=logits.device)
