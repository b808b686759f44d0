"""What one process holds: the clients placed on it, and what it needs to run them.

A rank holds one frozen backbone with its prompt slots (in the tuner), the data, and the state of each
client it hosts (none on a spare rank, when there are more ranks than clients). Clients take turns on
the backbone: their prompts are loaded before each pass and read back after training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from lightning import Fabric
from torch import Tensor

from fedur.data.datasets import ImageDataset
from fedur.data.loaders import ClientImages, make_loader
from fedur.federated.collectives import Collectives
from fedur.methods.base import Method
from fedur.model.classifier import PromptedCLIP
from fedur.train.client import ClientState
from fedur.train.evaluate import predict
from fedur.train.module import PromptTuner
from fedur.train.progress import QUIET, Progress


@dataclass(frozen=True)
class LocalWork:
    """How the clients' local passes run (plain values from the config)."""

    batch_size: int  # local training
    eval_batch_size: int  # pseudo-labelling and evaluation
    num_workers: int  # DataLoader workers
    seed: int  # run.seed: every client's data order derives from it
    log_every_n_steps: int = 0  # print the training loss every n optimizer steps (0: never)
    clients_per_step: int = 1  # clients of a group trained in one batch (fixed groups of consecutive ids)


@dataclass
class Rank:
    fabric: Fabric
    collectives: Collectives
    tuner: PromptTuner  # the frozen backbone with the prompt slots, and the local optimisation
    clients: list[ClientState]  # the clients this rank hosts, in client-id order
    dataset: ImageDataset  # train / test splits (rows of the image cache)
    transform: Callable  # per-sample: cached uint8 pixels, or CLIP's preprocess
    zero_shot_text: Tensor  # (C, D) zero-shot CLIP text features of the template, on the device
    num_clients: int  # K, over all ranks
    work: LocalWork
    progress: Progress = QUIET  # rank 0's progress display; the others stay quiet

    @property
    def model(self) -> PromptedCLIP:
        return self.tuner.model

    @property
    def method(self) -> Method:
        return self.tuner.method

    def gather(self, values: dict[int, Tensor], like: Tensor, what: str) -> Tensor:
        """(K, *like.shape): row k is client k's value, from whichever rank hosts it. Every rank calls this."""
        return self.collectives.gather_clients(values, self.num_clients, like=like, what=what)

    @torch.no_grad()
    def predict(
        self, split: Literal["train", "test"], zero_shot: bool = False, desc: str | None = None
    ) -> dict[int, tuple[Tensor, Tensor]]:
        """Each hosted client's (logits (n_k, C) float32 on CPU, true labels (n_k,)) over its own images of
        `split`: with its model (the method's logits with the client's prompts), or as zero-shot CLIP.
        With `desc`, rank 0 shows the progress over clients and batches."""
        out = {}
        clients = self.clients if desc is None else self.progress.iterate(self.clients, desc)
        for client in clients:
            indices = client.train_indices if split == "train" else client.test_indices
            loader = self._loader(split, indices)
            if desc is not None:
                loader = self.progress.iterate(loader, f"client {client.client_id} batches")
            with self.fabric.autocast():
                if zero_shot:
                    classify = self.model.zero_shot_classifier(self.zero_shot_text)
                else:
                    self.model.load_prompts(client.prompts)
                    classify = self.method.classifier(self.model, client)
                out[client.client_id] = predict(self.fabric, classify, loader, self.model.num_classes)
        return out

    @torch.no_grad()
    def image_features(self, split: Literal["train", "test"], indices) -> Tensor:
        """(n, D) frozen CLIP image features (no prompts) of `split` images `indices`, float32 on CPU."""
        features = []
        with self.fabric.autocast():
            for images, _ in self._loader(split, indices):
                features.append(self.model.image_features(self.fabric.to_device(images), prompted=False).float().cpu())
        return torch.cat(features) if features else torch.zeros(0, self.zero_shot_text.shape[-1])

    def _loader(self, split: Literal["train", "test"], indices):
        data = getattr(self.dataset, split)
        images = ClientImages(data, indices, self.transform, (torch.from_numpy(data.labels[indices]),))
        return make_loader(images, self.work.eval_batch_size, self.work.num_workers)
