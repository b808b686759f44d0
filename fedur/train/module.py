"""The LightningModule of local prompt tuning: the training step of a group of clients (a client alone is a
group of one), and the optimizer with its schedule.

Fabric drives it (fedur/train/local.py); it is never wrapped in DistributedDataParallel, because local
training must not synchronize anything across ranks. The frozen backbone lives in `model`; the prompts
being trained are the clients' own pieces (Method.pieces), handed to every step, so nothing of one client is
ever left in the model for the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import lightning as L
import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from fedur.federated.client import ClientState
from fedur.labels import Labeller
from fedur.methods import forward
from fedur.methods.base import LocalBatch, Method
from fedur.model.classifier import PromptedCLIP


def cosine_factor(epoch: int, first_epoch: int, total_epochs: int) -> float:
    """(1 + cos(pi * e / E)) / 2 at e = first_epoch + epoch: the share of the peak learning rate."""
    return 0.5 * (1.0 + math.cos(math.pi * (first_epoch + epoch) / total_epochs))


def warmed_factor(epoch: int, first_epoch: int, warmup_epochs: int, warmup_share: float, schedule, restarts: bool) -> float:
    """The share of the peak learning rate in local epoch t = first_epoch + epoch of the run: `warmup_share` for
    t < warmup_epochs; then `schedule`'s, of t - warmup_epochs where it never restarts (Dassl's warm-up wrapper hands
    the epochs after it to its successor), else of the round's own epoch."""
    t = first_epoch + epoch
    if t < warmup_epochs:
        return warmup_share
    return schedule(epoch if restarts else t - warmup_epochs)


class PromptTuner(L.LightningModule):
    """Trains clients' pieces on `model` (its frozen CLIP stays as it is) with the labeller's loss plus the
    method's penalty, on logits the method forms."""

    def __init__(self, model: PromptedCLIP, method: Method, labeller: Labeller | None) -> None:
        super().__init__()
        self.model, self.method, self.labeller = model, method, labeller

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def trained_names(self, pieces: dict[str, Tensor]) -> list[str]:
        """The pieces a client trains, by name, in the optimizer's order: those the method declares trainable
        that have elements (`pieces`: the client's values)."""
        return [name for name, piece in self.method.pieces().items() if piece.trains and pieces[name].numel()]

    def training_step(self, batches: list[tuple[Tensor, ...]], pieces: list[dict[str, Tensor]],
                      clients: list[ClientState], class_weights: Tensor | None = None) -> list[dict[str, Tensor]]:
        """One step of a group: client k's batch (images (B_k, 3, H, W), pseudo-labels (B_k,), the labeller's
        class mask (B_k, C) bool, the images' positions in the client's train images (B_k,)), in training mode
        (`model.training`: fedur/train/local.py sets it for a unit's local training), with the pieces
        `pieces[k]` it is training; `clients[k]`: the client with its state on the device (its pieces: those it
        began the round with); `class_weights`: (C,) the cross-entropy's, on the device (None: unweighted).
        Returns each client's {"loss", "loss_pos", "loss_neg"}; the sum of the losses is what to backpropagate (a
        client's pieces only reach its own loss, so each gets its own gradient)."""
        texts = forward.text_sides(self.method, self.model, pieces)
        logits = forward.group_logits(self.method, self.model, [b[0] for b in batches], pieces, texts, clients,
                                      [b[3] for b in batches])
        outs = []
        for part, (images, labels, mask, rows), p, text, client in zip(logits, batches, pieces, texts, clients):
            loss, loss_pos, loss_neg = self.labeller.loss(part, labels, mask, class_weights)
            batch = LocalBatch(images, labels, mask, rows, part, partial(labelled_loss, self.labeller, labels, mask, class_weights))
            penalty = self.method.penalty(self.model, p, client.pieces, client, text, batch)  # client.pieces: the round's start
            outs.append({"loss": loss if penalty is None else loss + penalty, "loss_pos": loss_pos, "loss_neg": loss_neg})
        return outs

    def configure_optimizers(self, params: list[Tensor], round_idx: int, optim: Optimization,
                             lr_scales: list[float] | None = None) -> dict:
        """SGD over one client's trained pieces `params` and its schedule, stepped once per local epoch. The cosine:
        lr = lr0 * (1 + cos(pi * e / E)) / 2, where e counts the local epochs since the last pseudo-label refresh and
        E = refresh_every * local_epochs, the scheduler starting at the first local epoch of round `round_idx`, so
        that it restarts at every refresh (the reference's two SGDs with equal settings act as this one); with
        `cosine_epochs` T, e counts the local epochs since the run's first round (after any warm-up) and E = T, never
        restarted (torch's CosineAnnealingLR, whose cosine rises again after T). The run's first `warmup_epochs`
        local epochs run at `warmup_lr`. `lr_scales`: each param's learning rate as a multiple of the schedule's (its
        piece's `lr_scale`; then one parameter group per param, in order, so that the momentum state's indices are
        the params'); None: all 1, one group."""
        o = optim
        groups = params if lr_scales is None or all(s == 1.0 for s in lr_scales) else \
            [{"params": [p], "lr": o.lr * s} for p, s in zip(params, lr_scales)]
        optimizer = torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        first_epoch = (round_idx % o.refresh_every) * o.local_epochs
        schedule = partial(cosine_factor, first_epoch=first_epoch, total_epochs=o.refresh_every * o.local_epochs)
        restarts = o.cosine_epochs is None
        if o.schedule == "constant":
            schedule = constant_factor
        elif not restarts:
            schedule = partial(cosine_factor, first_epoch=0, total_epochs=o.cosine_epochs)
        if o.warmup_epochs:
            schedule = partial(warmed_factor, first_epoch=round_idx * o.local_epochs, warmup_epochs=o.warmup_epochs,
                               warmup_share=o.warmup_lr / o.lr, schedule=schedule, restarts=restarts)
        elif not restarts:
            schedule = partial(_shifted, first_epoch=round_idx * o.local_epochs, schedule=schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": LambdaLR(optimizer, schedule), "interval": "epoch"}}


def labelled_loss(labeller: Labeller, labels: Tensor, mask: Tensor, class_weights: Tensor | None, logits: Tensor) -> Tensor:
    """The labeller's loss of `logits` on a batch's pseudo-labels (LocalBatch.loss)."""
    return labeller.loss(logits, labels, mask, class_weights)[0]


def constant_factor(epoch: int) -> float:
    """optim.schedule constant: the peak learning rate in every epoch."""
    return 1.0


def _shifted(epoch: int, first_epoch: int, schedule) -> float:
    """`schedule` at the run's local epoch first_epoch + epoch (a schedule that is never restarted)."""
    return schedule(first_epoch + epoch)


@dataclass(frozen=True)
class Optimization:
    """The local optimisation's plain values (from `optim:` and `federation:`)."""

    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.05
    local_epochs: int = 10
    refresh_every: int = 5  # the cosine schedule spans refresh_every * local_epochs epochs
    schedule: str = "cosine"  # or "constant"
    cosine_epochs: int | None = None  # the never-restarted cosine's half-period (None: one cosine per refresh period)
    warmup_epochs: int = 0  # the run's first local epochs at warmup_lr
    warmup_lr: float = 1e-5
