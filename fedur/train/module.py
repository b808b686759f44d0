"""The LightningModule of local prompt tuning: the training step, and the optimizer with its schedule.

Fabric drives it (fedur/train/client.py); it is never wrapped in DistributedDataParallel, because
local training must not synchronize anything across ranks.
"""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from fedur.federated.selection import NegativeRule, mass_negatives
from fedur.model.classifier import PromptedCLIP
from fedur.train.losses import negative_loss, positive_loss


def cosine_factor(epoch: int, first_epoch: int, total_epochs: int) -> float:
    """(1 + cos(pi * e / E)) / 2 at e = first_epoch + epoch: the share of the peak learning rate."""
    return 0.5 * (1.0 + math.cos(math.pi * (first_epoch + epoch) / total_epochs))


class PromptTuner(L.LightningModule):
    """Trains the prompts of `model` (its frozen CLIP stays as it is) with L = L_pos + lambda * L_neg."""

    def __init__(
        self,
        model: PromptedCLIP,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.05,
        local_epochs: int = 10,
        refresh_every: int = 5,
        negatives: NegativeRule = "mass",
        tau_neg: float = 0.2,
        neg_loss_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.local_epochs, self.refresh_every = local_epochs, refresh_every
        self.negatives, self.tau_neg, self.neg_loss_weight = negatives, tau_neg, neg_loss_weight
        self.register_buffer("class_weights", None, persistent=False)  # (C,) global, from each refresh

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def load_prompts(self, visual: Tensor, text_ctx: Tensor) -> None:
        """Start from a client's prompts (copied into the prompt slots)."""
        self.model.load_prompts(visual, text_ctx)

    def prompts(self) -> tuple[Tensor, Tensor]:
        """Detached copies of the trained (visual prompt, text context)."""
        return self.model.prompts()

    def use_class_weights(self, weights: Tensor | None) -> None:
        """The global class weights of L_pos until the next pseudo-label refresh (None: unweighted)."""
        self.class_weights = None if weights is None else weights.to(self.device)

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int = 0) -> dict[str, Tensor]:
        """batch = (images (B, 3, H, W), pseudo-labels (B,), stored negative pseudo-labels (B, C) bool)."""
        images, labels, negatives = batch
        logits = self(images)  # (B, C)
        loss_pos = positive_loss(logits, labels, self.class_weights)
        if self.negatives == "none":
            loss_neg = torch.zeros((), device=logits.device)
        else:
            if self.negatives == "online":
                negatives = mass_negatives(logits.detach().float().softmax(dim=-1), self.tau_neg)
                negatives[torch.arange(len(labels), device=labels.device), labels] = False
            loss_neg = negative_loss(logits, negatives)
        loss = loss_pos + self.neg_loss_weight * loss_neg
        return {"loss": loss, "loss_pos": loss_pos.detach(), "loss_neg": loss_neg.detach()}

    def configure_optimizers(self, round_idx: int = 0) -> dict:
        """SGD over the prompts only (the reference's two SGDs with equal settings act as this one) and its
        cosine schedule, stepped once per local epoch: lr = lr0 * (1 + cos(pi * e / E)) / 2, where e counts
        the local epochs since the last pseudo-label refresh and E = refresh_every * local_epochs. The
        scheduler starts at the first local epoch of round `round_idx`, so it restarts at every refresh."""
        optimizer = torch.optim.SGD(
            self.model.trainable_parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )
        first_epoch = (round_idx % self.refresh_every) * self.local_epochs
        schedule = partial(cosine_factor, first_epoch=first_epoch, total_epochs=self.refresh_every * self.local_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": LambdaLR(optimizer, schedule), "interval": "epoch"}}
