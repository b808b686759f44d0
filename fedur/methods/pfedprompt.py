"""pFedPrompt (Guo, Guo, Wang, WWW 2023; no public code): a text prompt learned by FedAvg (the users'
consensus in the linguistic space) plus a personal, non-parametric attention over the client's own visual
features. Reconstructed [guess, spec sec. 10] as a Tip-Adapter cache per client: keys are the frozen
CLIP features of the client's pseudo-labelled images, values their one-hot pseudo-labels, and

    logits = 100 cos(f, T(P^t)) + alpha * exp(-beta (1 - f K^T)) V.

The cache is rebuilt at every pseudo-label refresh, stays on the client (checkpointed with it), and only
the text prompt is averaged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedur.methods.base import Method
from fedur.methods.cache import build_cache, cache_logits


class PFedPrompt(Method):
    groupable = False  # its logits read the client's own cache
    name = "pfedprompt"
    prompts = ("text_ctx",)
    shared = ("text_ctx",)
    default_labeller = "fpl"

    def logits(self, model, images: Tensor, text: Tensor, client) -> Tensor:
        features = model.image_features(images)  # no visual prompt: the frozen CLIP's features
        logits = model.logits(features, text)
        keys, labels = client.extra.get("cache_keys"), client.extra.get("cache_labels")
        if keys is None or len(keys) == 0:  # before the first refresh (zero-shot) or an empty selection
            return logits
        keys, labels = keys.to(features.device), labels.to(features.device)
        values = torch.nn.functional.one_hot(labels, logits.shape[-1]).float()
        with torch.autocast(features.device.type, enabled=False):
            return logits + cache_logits(features.float(), keys.float(), values, self.cfg.cache_alpha, self.cfg.cache_beta)

    @torch.no_grad()
    def after_refresh(self, rank, client) -> None:
        labels = client.pseudo_labels
        features = rank.image_features("train", client.train_indices[labels.indices.numpy()])
        keys, _ = build_cache(features, labels.labels, rank.model.num_classes)
        client.extra = {"cache_keys": keys, "cache_labels": labels.labels.clone()}
