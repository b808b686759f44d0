"""A client's own state and its local training round."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from lightning import Fabric
from torch import Tensor

from fedur.data.datasets import ImageSplit
from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.streams import client_generator
from fedur.train.checkpoint import CheckpointError
from fedur.train.module import PromptTuner
from fedur.train.progress import QUIET, Progress


@dataclass
class PseudoLabels:
    """A client's selected training set until the next refresh."""

    indices: Tensor  # (n_sel,) positions in the client's train indices
    labels: Tensor  # (n_sel,) argmax pseudo-labels
    negatives: Tensor  # (n_sel, C) bool stored negative pseudo-labels (all False for rules online/none)


@dataclass
class ClientState:
    """Everything that belongs to one client. After aggregation a shared prompt is the same tensor for
    every client; nothing is ever modified in place, so clients cannot affect each other."""

    client_id: int
    train_indices: np.ndarray  # into the dataset's train split
    test_indices: np.ndarray  # into the dataset's test split
    visual: Tensor  # (depth, n_tok, width): the visual prompt it uses (the global one when shared)
    text_ctx: Tensor  # (n_ctx, width): the text prompt it uses (personal unless fedur.share shares it)
    optimizer_state: dict | None = None  # kept across rounds only with optim.optimizer_state=client
    pseudo_labels: PseudoLabels | None = None

    # A client's random streams are a pure function of (run.seed, client_id, round) (federated/streams.py):
    # the round counter in the checkpoint is all they need.
    def state_dict(self) -> dict:
        labels = self.pseudo_labels
        return {
            "client_id": self.client_id,
            "train_indices": torch.from_numpy(self.train_indices),
            "test_indices": torch.from_numpy(self.test_indices),
            "visual": self.visual.cpu(),
            "text_ctx": self.text_ctx.cpu(),
            "optimizer_state": self.optimizer_state,
            "pseudo_labels": None if labels is None else vars(labels),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint; the data split must be the one the checkpoint was made with."""
        for name in ("train_indices", "test_indices"):
            if not np.array_equal(state[name].numpy(), getattr(self, name)):
                raise CheckpointError(
                    f"client {self.client_id}: its {name} differ from the checkpoint's; the dataset or its "
                    "split changed since the run started (data.root contents, fractions, partition)"
                )
        device = self.visual.device
        self.visual, self.text_ctx = state["visual"].to(device), state["text_ctx"].to(device)
        self.optimizer_state = state["optimizer_state"]
        labels = state["pseudo_labels"]
        self.pseudo_labels = None if labels is None else PseudoLabels(**labels)


@dataclass
class LocalResult:
    loss: float  # means over the round's optimizer steps
    loss_pos: float
    loss_neg: float
    optimizer_state: dict | None


def train_client(
    fabric: Fabric,
    tuner: PromptTuner,
    client: ClientState,
    split: ImageSplit,
    transform: Callable,
    round_idx: int,
    *,
    local_epochs: int,
    refresh_every: int,
    batch_size: int,
    num_workers: int,
    seed: int,
    optimizer_state: dict | None,
    log_every_n_steps: int = 0,
    progress: Progress = QUIET,
) -> LocalResult:
    """Train the client's prompts `local_epochs` epochs on its selected pseudo-labels, in place.

    The client starts from the prompts it holds (after aggregation: the global ones for what is
    shared) and keeps what it learned; the round loop decides what is uploaded.
    """
    model = tuner.model
    model.load_prompts(client.visual, client.text_ctx)
    optimizer = tuner.configure_optimizers()
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    labels = client.pseudo_labels
    data = ClientImages(split, client.train_indices[labels.indices.numpy()], transform, (labels.labels, labels.negatives))
    loader = make_loader(
        data, batch_size, num_workers, generator=client_generator(seed, client.client_id, round_idx),
        pin_memory=fabric.device.type == "cuda",
    )
    first_epoch = (round_idx % refresh_every) * local_epochs
    sums = torch.zeros(3, device=fabric.device)  # loss, loss_pos, loss_neg: summed on device, read once
    steps = 0
    for epoch in progress.iterate(range(local_epochs), f"client {client.client_id} epochs"):
        for group in optimizer.param_groups:
            group["lr"] = tuner.learning_rate(first_epoch + epoch)
        for batch in loader:
            batch = fabric.to_device(batch)
            with fabric.autocast():
                out = tuner.training_step(batch, steps)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(out["loss"])
            optimizer.step()
            sums += torch.stack([out["loss"].detach(), out["loss_pos"], out["loss_neg"]]).float()
            steps += 1
            if log_every_n_steps and steps % log_every_n_steps == 0:
                progress.write(f"  client {client.client_id} step {steps} loss {out['loss'].item():.4f}")  # every rank
    client.visual, client.text_ctx = model.prompts()
    means = (sums / max(steps, 1)).tolist()  # device-to-host sync, once per client-round
    return LocalResult(*means, optimizer_state=copy.deepcopy(optimizer.state_dict()))
