"""pFedPrompt (Guo, Guo, Wang, WWW 2023; no public code): a text prompt learned by FedAvg (the users'
consensus in the linguistic space) plus a personal, non-parametric attention over the client's own visual
features. Reconstructed [guess, spec sec. 10] as a Tip-Adapter cache per client: keys are the frozen
CLIP features of the client's pseudo-labelled images, values their one-hot pseudo-labels, and

    logits = 100 cos(f, T(P^t)) + alpha * exp(-beta (1 - f K^T)) V.

The cache is rebuilt at every pseudo-label refresh, stays on the client (checkpointed with it), and only
the text prompt is averaged.
"""

from __future__ import annotations

from typing import Any

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import ClientData, Method
from fedur.methods.cache import build_cache, cache_logits
from fedur.model.classifier import PromptedCLIP


class PFedPrompt(Method):
    """pFedPrompt: a text prompt averaged by the server plus a personal Tip-Adapter cache of the client's
    pseudo-labelled image features; FPL pseudo-labels."""

    prompts = ("text_ctx",)
    shared = ("text_ctx",)

    def __init__(self, cache_alpha: NonNegativeFloat = 1.0, cache_beta: PositiveFloat = 5.5) -> None:
        """
        Args:
            cache_alpha: Weight of the cache logits alpha * exp(-beta (1 - f k)) v (Tip-Adapter's default).
            cache_beta: Sharpness beta of the cache's affinities (Tip-Adapter's default).
        """
        self.cache_alpha, self.cache_beta = float(cache_alpha), float(cache_beta)

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def logits(self, model: PromptedCLIP, images: Tensor, prompts: dict[str, Tensor], text: Any,
               client: ClientState) -> Tensor:
        features = model.image_features(images)  # no visual prompt: the frozen CLIP's features
        logits = model.logits(features, text)
        keys, labels = client.extra.get("cache_keys"), client.extra.get("cache_labels")
        if keys is None or len(keys) == 0:  # before the first refresh (zero-shot) or an empty selection
            return logits
        keys, labels = keys.to(features.device), labels.to(features.device)
        values = torch.nn.functional.one_hot(labels, logits.shape[-1]).float()
        with torch.autocast(features.device.type, enabled=False):
            return logits + cache_logits(features.float(), keys.float(), values, self.cache_alpha, self.cache_beta)

    @torch.no_grad()
    def after_refresh(self, client: ClientState, data: ClientData) -> None:
        labels = client.pseudo_labels
        features = data.train_features(client, labels.indices.numpy())
        keys, _ = build_cache(features, labels.labels, data.model.num_classes)
        client.extra = {"cache_keys": keys, "cache_labels": labels.labels.clone()}
