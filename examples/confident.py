"""A pseudo-labeller of a user's own, outside fedur: every sample whose top-1 probability reaches a threshold,
with its argmax label (the classic confidence-thresholded pseudo-labelling of FixMatch-style self-training),
trained with fedur's cross-entropy (+ optional class weights and negatives of HardLabeller):

    PYTHONPATH=. python fedur/main.py --config configs/smoke.yaml --labeller examples.confident.Confident \\
        --labeller.threshold 0.5
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedur.labels import HardLabeller


class Confident(HardLabeller):
    """Every sample with max_c p_c >= `threshold`, labelled with its argmax."""

    def __init__(self, threshold: float = 0.5, **kwargs) -> None:
        """
        Args:
            threshold: Smallest top-1 probability of a pseudo-labelled sample.
        """
        super().__init__(**kwargs)
        self.threshold = float(threshold)

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        top, labels = probs.max(dim=-1)  # (n,) each
        indices = torch.nonzero(top >= self.threshold).flatten()
        return indices, labels[indices]
