"""CoPL and CoDPL: FedCoPL's cooperative, globally balanced selection (spec sec. 5.1-5.3), and FedUR's
version of it with class weights and negative pseudo-labels (sec. 5.4-5.5). The math is in
fedur/federated/selection.py."""

from __future__ import annotations

import torch
from torch import Tensor

from fedur.federated.selection import allocate, estimated_counts, filter_mask, select_top
from fedur.labels.base import Labeller


class CoPL(Labeller):
    """Clients upload the argmax histogram of their confident, low-entropy samples; the server allocates M
    pseudo-labels per class in proportion; each client takes its quota of most confident samples per class.
    With `labels.cooperative_selection: false` each client keeps every filtered sample instead."""

    name = "copl"

    @property
    def cooperative(self) -> bool:  # type: ignore[override]
        return self.cfg.cooperative_selection

    def _kept(self, probs: Tensor) -> Tensor:
        c = self.cfg
        return filter_mask(probs, c.confidence_filter, c.entropy_filter, c.confidence_quantile, c.entropy_quantile)

    def estimate(self, probs: Tensor) -> Tensor:
        return estimated_counts(probs, self._kept(probs))

    def allocate(self, estimated: Tensor, n_total: int, refresh_idx: int) -> Tensor:
        return allocate(estimated, n_total, refresh_idx)

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        if quotas is not None:
            return select_top(probs, quotas)
        indices = torch.nonzero(self._kept(probs)).flatten()  # no allocation: every kept sample, argmax label
        return indices, probs[indices].argmax(dim=-1)


class CoDPL(CoPL):
    """CoPL + global inverse-frequency class weights + negative pseudo-labels: FedUR's labeller."""

    name = "codpl"
    default_class_weights = "inv"
    default_negatives = "mass"
