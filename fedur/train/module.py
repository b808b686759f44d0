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

from fedur.labels.base import Labeller
from fedur.methods.base import Method
from fedur.model.classifier import PromptedCLIP
from fedur.train.client import ClientState


def cosine_factor(epoch: int, first_epoch: int, total_epochs: int) -> float:
    """(1 + cos(pi * e / E)) / 2 at e = first_epoch + epoch: the share of the peak learning rate."""
    return 0.5 * (1.0 + math.cos(math.pi * (first_epoch + epoch) / total_epochs))


class PromptTuner(L.LightningModule):
    """Trains a client's prompts of `model` (its frozen CLIP stays as it is) with the labeller's loss plus
    the method's penalty, on logits the method forms."""

    def __init__(
        self,
        model: PromptedCLIP,
        method: Method,
        labeller: Labeller,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.05,
        local_epochs: int = 10,
        refresh_every: int = 5,
    ) -> None:
        super().__init__()
        self.model, self.method, self.labeller = model, method, labeller
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.local_epochs, self.refresh_every = local_epochs, refresh_every
        self.register_buffer("class_weights", None, persistent=False)  # (C,) global, from each refresh
        self.client: ClientState | None = None  # the client being trained
        self.start: dict[str, Tensor] = {}  # the prompts it started the round with

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def begin(self, client: ClientState) -> None:
        """Train `client` next: its prompts go into the model's slots."""
        self.model.load_prompts(client.prompts)
        self.client, self.start = client, client.prompts

    def prompts(self) -> dict[str, Tensor]:
        """Detached copies of the trained prompts of the method."""
        return self.model.prompts(self.method.prompts)

    def use_class_weights(self, weights: Tensor | None) -> None:
        """The global class weights of the cross-entropy until the next pseudo-label refresh (None: unweighted)."""
        self.class_weights = None if weights is None else weights.to(self.device)

    def forward(self, images: Tensor) -> Tensor:
        return self.method.logits(self.model, images, self.method.text_side(self.model), self.client)

    def group_step(self, batches: list[tuple[Tensor, ...]], prompts: list[dict[str, Tensor]],
                   starts: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """One step of several clients at once: batch k with prompts[k] (started from starts[k]). Returns each
        client's {"loss", "loss_pos", "loss_neg"}; the sum of the losses is what to backpropagate (client k's
        prompts only reach its own loss, so each gets its own gradient)."""
        sizes = [len(b[0]) for b in batches]
        images = torch.cat([b[0] for b in batches])
        owners = torch.repeat_interleave(torch.arange(len(batches), device=images.device),
                                         torch.tensor(sizes, device=images.device))
        logits = self.method.group_logits(self.model, images, owners, prompts)
        outs = []
        for k, (part, (_, labels, mask)) in enumerate(zip(logits.split(sizes), batches)):
            loss, loss_pos, loss_neg = self.labeller.loss(part, labels, mask, self.class_weights)
            penalty = self.method.penalty(self.model, starts[k], prompts[k])
            outs.append({"loss": loss if penalty is None else loss + penalty, "loss_pos": loss_pos, "loss_neg": loss_neg})
        return outs

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int = 0) -> dict[str, Tensor]:
        """batch = (images (B, 3, H, W), pseudo-labels (B,), the labeller's class mask (B, C) bool)."""
        images, labels, mask = batch
        loss, loss_pos, loss_neg = self.labeller.loss(self(images), labels, mask, self.class_weights)
        penalty = self.method.penalty(self.model, self.start)
        if penalty is not None:
            loss = loss + penalty
        return {"loss": loss, "loss_pos": loss_pos, "loss_neg": loss_neg}

    def configure_optimizers(self, round_idx: int = 0, params: list[Tensor] | None = None) -> dict:
        """SGD over the prompts only (the reference's two SGDs with equal settings act as this one) and its
        cosine schedule, stepped once per local epoch: lr = lr0 * (1 + cos(pi * e / E)) / 2, where e counts
        the local epochs since the last pseudo-label refresh and E = refresh_every * local_epochs. The
        scheduler starts at the first local epoch of round `round_idx`, so it restarts at every refresh.
        `params`: other tensors than the model's trainable prompts (a client of a group, `train_group`)."""
        optimizer = torch.optim.SGD(
            self.model.trainable_parameters() if params is None else params, lr=self.lr, momentum=self.momentum,
            weight_decay=self.weight_decay,
        )
        first_epoch = (round_idx % self.refresh_every) * self.local_epochs
        schedule = partial(cosine_factor, first_epoch=first_epoch, total_epochs=self.refresh_every * self.local_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": LambdaLR(optimizer, schedule), "interval": "epoch"}}
