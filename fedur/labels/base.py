"""What a pseudo-labeller is: how a client picks its training samples and labels from its predictions, and
the loss they are trained with. Every federated method can be paired with every labeller (Table 7).

A refresh (fedur/train/refresh.py) goes: predictions -> [`estimate` -> all clients' histograms ->
`allocate`, for cooperative labellers] -> `select` per client -> class weights from the global selected
counts -> `loss` during local training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedur.config import LabelsConfig
from fedur.federated.selection import mass_negatives, negative_mask
from fedur.train.losses import negative_loss, positive_loss


@dataclass(frozen=True)
class PseudoLabels:
    """A client's pseudo-labelled training samples, kept (and checkpointed) until the next refresh."""

    indices: Tensor  # (n,) positions in the client's train images, ascending
    labels: Tensor  # (n,) hard pseudo-labels (argmax, or argmax within the candidate set)
    mask: Tensor  # (n, C) bool per-sample class mask the loss reads: negative labels, or CPL's candidate set
    pools: Tensor | None = None  # (n,) cpl: the class pool each sample filled (GRIP's next caps read them)


class Labeller:
    """Hard pseudo-labels trained with (class-weighted) cross-entropy plus optional negative pseudo-labels.

    Subclasses choose the samples (`choose`); `cooperative` ones also upload a class histogram and receive
    per-class quotas (`estimate`, `allocate`).
    """

    name = "base"
    cooperative = False  # uploads a (C,) histogram at every refresh and selects within quotas
    default_class_weights = "none"  # what `labels.class_weights: auto` means for this labeller
    default_negatives = "none"

    def __init__(self, cfg: LabelsConfig, dataset: str | None = None) -> None:
        self.cfg = cfg
        self.class_weight_fn = cfg.class_weights if cfg.class_weights != "auto" else self.default_class_weights
        self.negatives = cfg.negatives if cfg.negatives != "auto" else self.default_negatives
        self.tau_neg, self.neg_loss_weight = cfg.tau_neg, cfg.neg_loss_weight

    def describe(self) -> str:
        return f"{self.name} (class weights {self.class_weight_fn}, negatives {self.negatives})"

    def estimate(self, probs: Tensor) -> Tensor:
        """(C,) int64: the client's upload before a cooperative selection."""
        raise NotImplementedError(f"{self.name} does not cooperate")

    def allocate(self, estimated: Tensor, n_total: int, refresh_idx: int) -> Tensor:
        """(K, C) quotas from every client's estimate (identical on every rank)."""
        raise NotImplementedError(f"{self.name} does not cooperate")

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        """(indices, labels) of the client's training samples from its (n, C) probabilities."""
        raise NotImplementedError

    def select(self, probs: Tensor, quotas: Tensor | None = None, refresh_idx: int = 0,
               previous: PseudoLabels | None = None) -> PseudoLabels:
        """The client's pseudo-labels at refresh `refresh_idx` (0-based), given what it selected at the one
        before (`previous`; None at the first). Only schedules that grow with the refreshes read the last two."""
        indices, labels = self.choose(probs, quotas)
        mask = negative_mask(probs[indices], labels, self.negatives, self.tau_neg)
        if mask is None:  # rules 'online' and 'none' store nothing
            mask = torch.zeros(len(indices), probs.shape[1], dtype=torch.bool)
        return PseudoLabels(indices, labels, mask)

    def loss(self, logits: Tensor, labels: Tensor, mask: Tensor, class_weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, positive part, negative part) of a batch: L_pos + lambda * L_neg (FedUR sec. 3.4)."""
        loss_pos = positive_loss(logits, labels, class_weights)
        if self.negatives == "none":
            return loss_pos, loss_pos.detach(), torch.zeros((), device=logits.device)
        if self.negatives == "online":  # from the current model's detached probabilities
            mask = mass_negatives(logits.detach().float().softmax(dim=-1), self.tau_neg)
            mask[torch.arange(len(labels), device=labels.device), labels] = False
        loss_neg = negative_loss(logits, mask)
        return loss_pos + self.neg_loss_weight * loss_neg, loss_pos.detach(), loss_neg.detach()
