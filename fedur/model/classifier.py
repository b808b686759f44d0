"""Prompted CLIP classifier: logits = CLIP's logit scale x cos(image feature, class text feature)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedur.model.clip import FrozenCLIP, encode_image_prompted, encode_text_embeddings, vision_width_and_depth
from fedur.model.prompts import TextPrompt, init_prompt


class PromptedCLIP(nn.Module):
    """A frozen CLIP plus a text context (`text_prompt.ctx`) and deep visual prompts (`visual_prompt`).

    Only the two prompt tensors are trainable. The federated loop swaps client state in and out of
    them with `load_prompts` / `prompts`. `normalize` is applied to every image batch first: the
    identity for normalised float images, or the cache's uint8 -> float step (data/cache.py), which
    then runs on the device instead of per sample in the loader.
    """

    def __init__(
        self,
        clip: FrozenCLIP,
        classnames: list[str],
        n_ctx: int,
        visual_tokens: int,
        visual_depth: int | None,
        init_std: float,
        seed: int,
    ) -> None:
        super().__init__()
        if n_ctx < 0 or visual_tokens < 0:
            raise ValueError("model.n_ctx and model.visual_tokens must be >= 0")
        self.clip = clip.model
        text_width = self.clip.token_embedding.weight.shape[1]
        self.text_prompt = TextPrompt(
            self.clip.token_embedding,
            clip.tokenizer,
            classnames,
            n_ctx,
            init_prompt((n_ctx, text_width), init_std, seed=seed * 1000 + 1),
        )
        if visual_tokens > 0:
            width, n_blocks = vision_width_and_depth(self.clip)
            depth = n_blocks - 1 if visual_depth is None else visual_depth
            if not 0 < depth <= n_blocks:
                raise ValueError(f"model.visual_depth={visual_depth} must be in [1, {n_blocks}] for this backbone")
            shape = (depth, visual_tokens, width)
        else:
            shape = (0, 0, 0)
        self.visual_prompt = nn.Parameter(init_prompt(shape, init_std, seed=seed * 1000 + 2))  # (depth, n_tok, width)
        self.text_prompt.ctx.requires_grad_(n_ctx > 0)
        self.visual_prompt.requires_grad_(visual_tokens > 0)
        self.normalize: Callable[[Tensor], Tensor] = _identity

    def train(self, mode: bool = True) -> "PromptedCLIP":
        super().train(mode)
        self.clip.eval()  # the backbone is frozen: never in training mode
        return self

    @property
    def num_classes(self) -> int:
        return self.text_prompt.prefix.shape[0]

    @property
    def logit_scale(self) -> Tensor:
        return self.clip.logit_scale.exp()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.visual_prompt, self.text_prompt.ctx) if p.requires_grad]

    def text_features(self) -> Tensor:
        embeddings = self.text_prompt()  # (C, L, width)
        return F.normalize(encode_text_embeddings(self.clip, embeddings, self.text_prompt.tokens), dim=-1)

    def image_features(self, images: Tensor, prompted: bool = True) -> Tensor:
        """Unit-norm features of an image batch, with the visual prompts or (`prompted=False`) as plain CLIP."""
        images = self.normalize(images)
        if not prompted:
            return F.normalize(self.clip.encode_image(images), dim=-1)
        prompts = self.visual_prompt if self.visual_prompt.numel() else None
        return F.normalize(encode_image_prompted(self.clip.visual, images, prompts), dim=-1)

    def logits(self, image_features: Tensor, text_features: Tensor) -> Tensor:
        # In fp32 even under bf16 autocast: bf16 logits of ~30 move in steps of ~0.2, which would tie
        # samples at the filters' median thresholds and in the top-u ranking.
        with torch.autocast(image_features.device.type, enabled=False):
            logits = self.logit_scale.float() * (image_features.float() @ text_features.float().t())  # (B, C)
            bias = getattr(self.clip, "logit_bias", None)
            return logits + bias.float() if bias is not None else logits

    def forward(self, images: Tensor) -> Tensor:
        return self.logits(self.image_features(images), self.text_features())

    @torch.no_grad()
    def load_prompts(self, visual: Tensor | None = None, text: Tensor | None = None) -> None:
        if visual is not None:
            self.visual_prompt.copy_(visual)
        if text is not None:
            self.text_prompt.ctx.copy_(text)

    def prompts(self) -> tuple[Tensor, Tensor]:
        """Detached copies of (visual prompt, text context)."""
        return self.visual_prompt.detach().clone(), self.text_prompt.ctx.detach().clone()


def _identity(images: Tensor) -> Tensor:
    return images
