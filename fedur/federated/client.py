"""A client's own state: its data, its prompts, its pseudo-labels and whatever its method keeps for it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedur.errors import FedurError, PluginError
from fedur.labels.base import PseudoLabels


class ClientStateError(FedurError, ValueError):
    """A saved client state does not fit this run; the message says what changed."""


@dataclass
class ClientState:
    """Everything that belongs to one client. After aggregation a shared piece is the same tensor for
    every client; nothing is ever modified in place, so clients cannot affect each other."""

    client_id: int
    train_indices: np.ndarray  # into the dataset's train split
    test_indices: np.ndarray  # into the dataset's test split
    pieces: dict[str, Tensor]  # the method's pieces (Method.pieces), by name ("visual", "text_ctx", ...): the global
    # aggregate for the shared ones, its own for the others
    optimizer_state: dict | None = None  # SGD momentum, kept across rounds only with optim.optimizer_state=client
    pseudo_labels: PseudoLabels | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)  # the method's per-client state (pFedPrompt's cache)
    validation_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # into the train split:
    # its label-free validation images (data.validation_fraction), never trained on nor pseudo-labelled
    label_free: dict[str, Any] = field(default_factory=dict)  # what label-free evaluation keeps between rounds
    # (fedur/train/label_free.py): zero-shot CLIP's predictions on its estimate images, the model chosen so far

    def on(self, device: torch.device) -> ClientState:
        """A copy with its pieces and the method's `extra` tensors on `device`: what a pass over the client's
        images hands the method's hooks (moved once per pass, not per batch). The client itself stays on the
        CPU between rounds."""
        return replace(self, pieces={name: t.to(device) for name, t in self.pieces.items()},
                       extra={name: t.to(device) for name, t in self.extra.items()})

    # A client's random streams are a pure function of (run.seed, client_id, round) (federated/streams.py):
    # the round counter in the checkpoint is all they need.
    def state_dict(self) -> dict:
        labels = self.pseudo_labels
        return {
            "client_id": self.client_id,
            "train_indices": torch.from_numpy(self.train_indices),
            "test_indices": torch.from_numpy(self.test_indices),
            "prompts": {name: t.cpu() for name, t in self.pieces.items()},  # the key of every format
            "optimizer_state": to_cpu(self.optimizer_state),
            "pseudo_labels": None if labels is None else vars(labels),
            "extra": {name: t.cpu() for name, t in self.extra.items()},
            "validation_indices": torch.from_numpy(self.validation_indices),
            "label_free": to_cpu(self.label_free),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state; the data split must be the one it was made with."""
        empty = torch.zeros(0, dtype=torch.long, device="cpu")  # a checkpoint from before validation splits had none
        for name in ("train_indices", "test_indices", "validation_indices"):
            if not np.array_equal(state.get(name, empty).numpy(), getattr(self, name)):
                raise ClientStateError(
                    f"client {self.client_id}: its {name} differ from the checkpoint's; the dataset or its "
                    "split changed since the run started (dataset.root contents, fractions, partition)"
                )
        if set(state["prompts"]) != set(self.pieces):
            raise ClientStateError(
                f"client {self.client_id}: the checkpoint holds pieces {sorted(state['prompts'])}, this method "
                f"{sorted(self.pieces)}; the method or its share setting changed since the run started"
            )
        self.pieces = {name: t.to(self.pieces[name].device) for name, t in state["prompts"].items()}
        self.optimizer_state = momentum_only(state["optimizer_state"])
        labels = state["pseudo_labels"]
        self.pseudo_labels = None if labels is None else PseudoLabels(**labels)
        self.extra = dict(state["extra"])
        self.label_free = dict(state.get("label_free") or {})


def check_tensors(state: dict, what: str) -> None:
    """A method's own state (a client's `extra`, the server's) is checkpointed and loaded with weights_only:
    tensors only, checked where the method writes it rather than when the round is saved."""
    wrong = {k: type(v).__name__ for k, v in state.items() if not isinstance(v, Tensor)}
    if wrong:
        raise PluginError(f"{what} must hold tensors only (it is checkpointed); not {wrong}")


def to_cpu(state):
    """`state` (nested dicts, lists and tuples of tensors and plain values, e.g. an optimizer's per-parameter
    state) with every tensor on the CPU: what a checkpoint holds, so that a plain torch.load reads it anywhere."""
    if isinstance(state, Tensor):
        return state.detach().cpu().clone()
    if isinstance(state, dict):
        return {key: to_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_cpu(value) for value in state)
    return state


def momentum_only(optimizer_state: dict | None) -> dict | None:
    """The per-parameter SGD state of a saved optimizer state (checkpoints before fedur 0.2 hold the whole
    `optimizer.state_dict()`; its param_groups are the schedule's, not the client's)."""
    if optimizer_state is not None and "param_groups" in optimizer_state:
        return optimizer_state["state"]
    return optimizer_state
