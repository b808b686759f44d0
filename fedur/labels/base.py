"""What a pseudo-labeller is: how a client picks its training samples and labels from its predictions, and
the loss they are trained with. Every federated method can be paired with every labeller (Table 7).

A refresh (fedur/train/refresh.py) goes: predictions -> [`estimate` -> all clients' histograms ->
`allocate`, for cooperative labellers] -> `select` per client -> `class_weights` from every client's counts
-> `loss` during local training.

A labeller is a plugin: one class whose constructor arguments are its settings (`--labeller CoDPL
--labeller.tau_neg 0.3`; a class of your own by import path, `--labeller mypkg.labels.Mine`). See
docs/extending.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, OpenUnitInterval
from torch import Tensor

from fedur.labels.losses import negative_loss, positive_loss
from fedur.labels.selection import NegativeRule, WeightFn, class_weights, mass_negatives, negative_mask


@dataclass(frozen=True)
class PseudoLabels:
    """A client's pseudo-labelled training samples, kept (and checkpointed) until the next refresh."""

    indices: Tensor  # (n,) positions in the client's train images, ascending
    labels: Tensor  # (n,) hard pseudo-labels (argmax, or argmax within the candidate set)
    mask: Tensor  # (n, C) bool per-sample class mask the loss reads: negative labels, or CPL's candidate set
    pools: Tensor | None = None  # (n,) cpl: the class pool each sample filled (GRIP's next caps read them)
    confidence: Tensor | None = None  # (n,) p of the label at the selection (None: a labeller that keeps none)


class Labeller(ABC):
    """A pseudo-labeller: `select` picks a client's training samples from its (n, C) probabilities, `loss`
    trains on them. `cooperative` ones also upload a (C,) histogram at each refresh (`estimate`) and select
    within the per-class quotas all clients' histograms give (`allocate`)."""

    key: ClassVar[str] = ""  # the short name runs and tables record ("fpl"); default: the class name, lowercased
    # How the labeller describes itself to tables, configs and resumes (as fedur.methods.Method does):
    label: ClassVar[str] = ""  # its name in tables and figures ("CoDPL"); default: the class name
    # Constructor arguments added after runs were made, with the value such runs ran with: they resume and stay in
    # their table when the argument now has that value.
    added_settings: ClassVar[dict[str, Any]] = {}
    # Constructor arguments that do not change what a run computes: a resume may change them freely.
    result_neutral: ClassVar[tuple[str, ...]] = ()
    # Keys of fedur before labellers were classes, and what replaces them (fedur/app/cli.py names them in its errors;
    # "{names}": fedur's labeller class names).
    old_keys: ClassVar[dict[str, str]] = {
        "method.labeller": "--labeller CLASS ({names})",
        "labels.": "--labeller CLASS --labeller.<arg> (e.g. --labeller CoDPL --labeller.tau_neg 0.3)",
    }

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "key" not in cls.__dict__:
            cls.key = cls.__name__.lower()
        if "label" not in cls.__dict__:
            cls.label = cls.__name__

    @property
    def cooperative(self) -> bool:
        """Whether clients upload a histogram at every refresh and select within quotas."""
        return False

    def bind(self, dataset: str) -> Labeller:
        """Settings that default to the dataset's (`dataset`: its key, e.g. "cub"); called once before the run."""
        return self

    def describe(self) -> str:
        return self.key

    def estimate(self, probs: Tensor) -> Tensor:
        """(C,) int64: the client's upload before a cooperative selection."""
        raise NotImplementedError(f"{self.key} does not cooperate")  # internal: only cooperative labellers are asked

    def allocate(self, estimated: Tensor, n_total: int, refresh_idx: int, totals: Tensor | None = None,
                 num_clients: int | None = None) -> Tensor:
        """(K, C) quotas from every client's estimate (identical on every rank). With privacy on, `totals` is the
        (C,) sum over the K = `num_clients` clients as released (noised), and `estimated` the rows of the clients
        a rank hosts: a client's quotas may then read only its own row and `totals`."""
        raise NotImplementedError(f"{self.key} does not cooperate")  # internal: only cooperative labellers are asked

    @abstractmethod
    def select(self, probs: Tensor, quotas: Tensor | None = None, refresh_idx: int = 0,
               previous: PseudoLabels | None = None) -> PseudoLabels:
        """The client's pseudo-labels at refresh `refresh_idx` (0-based) from its (n, C) probabilities, within
        its (C,) `quotas` for a cooperative labeller, given what it selected at the refresh before (`previous`;
        None at the first)."""

    @abstractmethod
    def loss(self, logits: Tensor, labels: Tensor, mask: Tensor, class_weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, positive part, negative part) of a batch: logits (B, C), labels (B,), the class mask (B, C)."""

    def class_weights(self, quotas: Tensor, selected: Tensor) -> Tensor | None:
        """(C,) global class weights of the loss until the next refresh, from every client's (K, C) quotas and
        selected counts (None: unweighted)."""
        return None


class HardLabeller(Labeller):
    """Hard pseudo-labels trained with (class-weighted) cross-entropy plus optional negative pseudo-labels
    (FedUR sec. 3.4). Subclasses choose the samples (`choose`)."""

    def __init__(
        self,
        class_weights: WeightFn = "none",
        weight_source: Literal["realized", "requested"] = "realized",
        negatives: NegativeRule = "none",
        tau_neg: OpenUnitInterval = 0.2,
        neg_loss_weight: NonNegativeFloat = 1.0,
    ) -> None:
        """
        Args:
            class_weights: Class weights of the cross-entropy from the global selected distribution d_c:
                inverse frequency normalised to mean 1 ('inv'), its square root ('inv_sqrt'), or off ('none';
                Table 6 'Weighted'). Where some classes are nearly absent from every client, 'inv' gives their
                few (often wrong) pseudo-labels a large weight: try inv_sqrt or none (docs/own-data.md).
            weight_source: d_c from the selected counts each client actually got ('realized') or from the
                allocation ('requested').
            negatives: Negative pseudo-labels (Table 6 'Negative'): the lowest classes holding at most
                `tau_neg` of the probability mass ('mass'), classes with p < tau_neg ('threshold'), the
                ceil(tau_neg * C) lowest classes ('ratio'), the mass rule on the current model's detached p
                ('online'), or off ('none').
            tau_neg: tau_neg of the negative rule.
            neg_loss_weight: Weight of L_neg in L_pos + weight * L_neg (the paper: 1).
        """
        self.class_weight_fn, self.weight_source = class_weights, weight_source
        self.negatives, self.tau_neg, self.neg_loss_weight = negatives, float(tau_neg), float(neg_loss_weight)

    def describe(self) -> str:
        return f"{self.key} (class weights {self.class_weight_fn}, negatives {self.negatives})"

    @abstractmethod
    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        """(indices, labels) of the client's training samples from its (n, C) probabilities."""

    def select(self, probs: Tensor, quotas: Tensor | None = None, refresh_idx: int = 0,
               previous: PseudoLabels | None = None) -> PseudoLabels:
        indices, labels = self.choose(probs, quotas)
        mask = negative_mask(probs[indices], labels, self.negatives, self.tau_neg)
        if mask is None:  # rules 'online' and 'none' store nothing
            mask = torch.zeros(len(indices), probs.shape[1], dtype=torch.bool, device="cpu")
        return PseudoLabels(indices, labels, mask, confidence=probs[indices, labels].float())

    def loss(self, logits: Tensor, labels: Tensor, mask: Tensor, class_weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """L_pos + lambda * L_neg (FedUR sec. 3.4)."""
        loss_pos = positive_loss(logits, labels, class_weights)
        if self.negatives == "none":
            return loss_pos, loss_pos.detach(), torch.zeros((), device=logits.device)
        if self.negatives == "online":  # from the current model's detached probabilities
            mask = mass_negatives(logits.detach().float().softmax(dim=-1), self.tau_neg)
            mask[torch.arange(len(labels), device=labels.device), labels] = False
        loss_neg = negative_loss(logits, mask)
        return loss_pos + self.neg_loss_weight * loss_neg, loss_pos.detach(), loss_neg.detach()

    def class_weights(self, quotas: Tensor, selected: Tensor) -> Tensor | None:
        source = quotas if self.weight_source == "requested" else selected
        return class_weights(source.sum(dim=0), self.class_weight_fn)


def weighs_classes(labeller: Labeller) -> bool:
    """Whether the labeller's loss weighs its classes by the federation's selected counts (its `class_weights` of any
    counts is not None): only then does a refresh exchange the selected counts."""
    ones = torch.ones(1, 2, dtype=torch.long, device="cpu")
    return labeller.class_weights(ones, ones) is not None
