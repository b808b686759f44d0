"""The LightningModule of local prompt tuning: one training step, the optimizer, and the schedule.

Fabric drives it (fedur/train/client.py); it is never wrapped in DistributedDataParallel, because
local training must not synchronize anything across ranks.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import Tensor

from fedur.federated.selection import NegativeRule, mass_negatives
from fedur.model.classifier import PromptedCLIP
from fedur.train.losses import negative_loss, positive_loss


def cosine_lr(base_lr: float, epoch: int, total_epochs: int) -> float:
    """base_lr * (1 + cos(pi * epoch / total)) / 2; `epoch` counts from the last pseudo-label refresh."""
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * epoch / total_epochs))


class PromptTuner(L.LightningModule):
    def __init__(
        self,
        model: PromptedCLIP,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.05,
        cycle_epochs: int = 50,
        negatives: NegativeRule = "mass",
        tau_neg: float = 0.2,
        neg_loss_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.cycle_epochs = cycle_epochs
        self.negatives, self.tau_neg, self.neg_loss_weight = negatives, tau_neg, neg_loss_weight
        self.class_weights: Tensor | None = None  # global, set at each pseudo-label refresh

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int = 0) -> dict[str, Tensor]:
        """batch = (images (B, 3, H, W), pseudo-labels (B,), stored negative pseudo-labels (B, C) bool)."""
        images, labels, negatives = batch
        logits = self(images)  # (B, C)
        weights = None if self.class_weights is None else self.class_weights.to(logits.device)
        loss_pos = positive_loss(logits, labels, weights)
        if self.negatives == "none":
            loss_neg = torch.zeros((), device=logits.device)
        else:
            if self.negatives == "online":
                negatives = mass_negatives(logits.detach().float().softmax(dim=-1), self.tau_neg)
                negatives[torch.arange(len(labels), device=labels.device), labels] = False
            loss_neg = negative_loss(logits, negatives)
        loss = loss_pos + self.neg_loss_weight * loss_neg
        return {"loss": loss, "loss_pos": loss_pos.detach(), "loss_neg": loss_neg.detach()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD over the prompts only (the reference's two SGDs with equal settings act as this one)."""
        return torch.optim.SGD(
            self.model.trainable_parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def learning_rate(self, cycle_epoch: int) -> float:
        """The cosine schedule, stepped per local epoch, restarting at every pseudo-label refresh."""
        return cosine_lr(self.lr, cycle_epoch, self.cycle_epochs)
