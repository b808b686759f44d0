"""CoPL and CoDPL: FedCoPL's cooperative, globally balanced selection (FedUR implementation spec, sec. 5.1-5.3), and FedUR's
version of it with class weights and negative pseudo-labels (sec. 5.4-5.5). The math is in
fedur/labels/selection.py."""

from __future__ import annotations

from typing import Literal

import torch
from jsonargparse.typing import OpenUnitInterval
from torch import Tensor

from fedur.labels.base import HardLabeller, NegativeRule, WeightFn
from fedur.labels.selection import allocate, estimated_counts, filter_mask, select_top


class CoPL(HardLabeller):
    """Clients upload the argmax histogram of their confident, low-entropy samples; the server allocates M
    pseudo-labels per class in proportion; each client takes its quota of most confident samples per class.
    With `cooperative_selection: false` each client keeps every filtered sample instead."""

    added_settings = {**HardLabeller.added_settings, "quota_arithmetic": "exact"}  # runs before it ran the formula

    def __init__(
        self,
        cooperative_selection: bool = True,
        confidence_filter: bool = True,
        entropy_filter: bool = True,
        confidence_quantile: OpenUnitInterval = 0.5,
        entropy_quantile: OpenUnitInterval = 0.5,
        quota_arithmetic: Literal["exact", "reference"] = "exact",
        **kwargs,
    ) -> None:
        """
        Args:
            cooperative_selection: Global allocation of M pseudo-labels per class (Table 6 'Data selection').
                Off: each client trains on all its (filtered) samples with their argmax labels.
            confidence_filter: Estimate the class histogram only from samples whose top-1 probability is
                above the client's `confidence_quantile` (Table 6 'Confidence').
            entropy_filter: Estimate the class histogram only from samples whose entropy is below the
                client's (1 - `entropy_quantile`) quantile (Table 6 'Entropy').
            confidence_quantile: Quantile of the top-1 probabilities used as the confidence threshold
                (0.5: the median).
            entropy_quantile: The entropy threshold is the (1 - this) quantile of the entropies (0.5: the median).
            quota_arithmetic: The quotas ceil(u / sum u * M) in exact integer arithmetic ('exact', the formula), or
                in float32 as FedCoPL's code ('reference': one more sample where the value is an integer that
                float32 overshoots; docs/reference-parity.md).
        """
        super().__init__(**kwargs)
        self.cooperative_selection, self.confidence_filter, self.entropy_filter = (
            cooperative_selection, confidence_filter, entropy_filter)
        self.confidence_quantile, self.entropy_quantile = float(confidence_quantile), float(entropy_quantile)
        self.quota_arithmetic = quota_arithmetic

    @property
    def cooperative(self) -> bool:
        return self.cooperative_selection

    def _kept(self, probs: Tensor) -> Tensor:
        return filter_mask(probs, self.confidence_filter, self.entropy_filter, self.confidence_quantile,
                           self.entropy_quantile)

    def estimate(self, probs: Tensor) -> Tensor:
        return estimated_counts(probs, self._kept(probs))

    def allocate(self, estimated: Tensor, n_total: int, refresh_idx: int, totals: Tensor | None = None,
                 num_clients: int | None = None) -> Tensor:
        return allocate(estimated, n_total, refresh_idx, self.quota_arithmetic, totals, num_clients)

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        if quotas is not None:
            return select_top(probs, quotas)
        indices = torch.nonzero(self._kept(probs)).flatten()  # no allocation: every kept sample, argmax label
        return indices, probs[indices].argmax(dim=-1)


class CoDPL(CoPL):
    """CoPL + global inverse-frequency class weights + negative pseudo-labels: FedUR's labeller."""

    def __init__(self, class_weights: WeightFn = "inv", negatives: NegativeRule = "mass", **kwargs) -> None:
        """
        Args:
            class_weights: Class weights of the cross-entropy from the global selected distribution d_c:
                inverse frequency normalised to mean 1 ('inv', FedUR's), its square root ('inv_sqrt'), or off
                ('none'; Table 6 'Weighted').
            negatives: Negative pseudo-labels (Table 6 'Negative'): the lowest classes holding at most
                `tau_neg` of the probability mass ('mass', FedUR's), classes with p < tau_neg ('threshold'),
                the ceil(tau_neg * C) lowest classes ('ratio'), the mass rule on the current model's detached
                p ('online'), or off ('none').
        """
        super().__init__(class_weights=class_weights, negatives=negatives, **kwargs)
