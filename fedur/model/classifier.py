"""Prompted CLIP classifier: logits = CLIP's logit scale x cos(image feature, class text feature)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedur.model.clip import FrozenCLIP, encode_image_prompted, encode_text_embeddings, vision_width_and_depth
from fedur.model.precision import full_precision
from fedur.model.prompts import TextPrompt, init_prompt
from fedur.model.text_tower import check_shared_prefix, encode_text_shared_prefix


class PromptedCLIP(nn.Module):
    """A frozen CLIP plus a text context (`text_prompt.ctx`), deep visual prompts (`visual_prompt`) and,
    with `local_text=True`, a second text context (`text_local`; FedOTP's local prompt).

    The slots hold the prompts every client starts from (`prompts()`); the round loop never writes them: each
    client's own prompts are handed to `text_features(ctx)` / `image_features(visual=...)` explicitly, and a
    call without them uses the initial values. `normalize` is applied to every image batch first: the identity
    for normalised float images, or the cache's uint8 -> float step (data/cache.py), which then runs on the
    device instead of per sample in the loader.
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
        local_text: bool = False,
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
        self.text_local = nn.Parameter(init_prompt((n_ctx, text_width), init_std, seed=seed * 1000 + 3)) if local_text else None
        self.scale = float(self.clip.logit_scale.exp())  # the frozen logit scale as a number: read without a device sync
        # The class prompts' token ids stay on the CPU too (not a buffer): the text tower works out its packing from
        # them, and its mask check is done here, so no pass on a device reads anything back.
        self.host_tokens = self.text_prompt.tokens.clone()
        check_shared_prefix(self.clip, 1 + n_ctx, self.host_tokens.shape[1])
        self.shared_prefix_text = True  # text tower: encode the class-independent prefix once (exact)
        self.normalize: Callable[[Tensor], Tensor] = _identity
        self.zero_shot_text: Tensor | None = None  # (C, D) the template's class features, set by the round loop

    def train(self, mode: bool = True) -> PromptedCLIP:
        super().train(mode)
        self.clip.eval()  # the backbone is frozen: never in training mode
        return self

    @property
    def num_classes(self) -> int:
        return self.text_prompt.prefix.shape[0]

    @property
    def logit_scale(self) -> Tensor:
        return self.clip.logit_scale.exp()

    def slots(self) -> dict[str, nn.Parameter]:
        slots = {"visual": self.visual_prompt, "text_ctx": self.text_prompt.ctx}
        if self.text_local is not None:
            slots["text_local"] = self.text_local
        return slots

    def trainable_slots(self) -> dict[str, nn.Parameter]:
        """The prompt slots that train, by name, in the optimizer's order."""
        return {name: p for name, p in self.slots().items() if p.requires_grad and p.numel()}

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.trainable_slots().values())

    def text_features(self, ctx: Tensor | None = None) -> Tensor:
        """(C, D) unit-norm class features with the text context `ctx` (n_ctx, width) (default:
        `text_prompt.ctx`); with G contexts (G, n_ctx, width), (G, C, D) from one pass of the text tower."""
        embeddings = self.text_prompt(ctx)  # (C, L, width) or (G, C, L, width)
        tokens = self.text_prompt.tokens
        if self.shared_prefix_text:
            features = encode_text_shared_prefix(self.clip, embeddings, tokens, 1 + self.text_prompt.ctx.shape[0], self.host_tokens)
        elif embeddings.dim() == 4:  # every class of every context in one batch
            n_groups, n_cls, length, width = embeddings.shape
            flat = embeddings.reshape(n_groups * n_cls, length, width)
            features = encode_text_embeddings(self.clip, flat, tokens.repeat(n_groups, 1)).view(n_groups, n_cls, -1)
        else:
            features = encode_text_embeddings(self.clip, embeddings, tokens)
        return F.normalize(features, dim=-1)

    def image_features(self, images: Tensor, prompted: bool = True, visual: Tensor | None = None) -> Tensor:
        """Unit-norm features of an image batch, with the visual prompts or (`prompted=False`) as plain CLIP.
        `visual`: other visual prompts than the model's slot, (depth, n_tok, width) or one per image
        (B, depth, n_tok, width)."""
        images = self.normalize(images)
        if not prompted:
            return F.normalize(self.clip.encode_image(images), dim=-1)
        prompts = self.visual_prompt if visual is None else visual
        prompts = prompts if prompts.numel() else None
        return F.normalize(encode_image_prompted(self.clip.visual, images, prompts), dim=-1)

    def logits(self, image_features: Tensor, text_features: Tensor, owners: Tensor | None = None) -> Tensor:
        """(B, C) logits of (B, D) image features against (C, D) class features, or against (G, C, D) with
        `owners` (B,) naming each image's row of them (several clients' images in one batch)."""
        # In fp32 even under bf16 autocast: bf16 logits of ~30 move in steps of ~0.2, which would tie
        # samples at the filters' median thresholds and in the top-u ranking.
        with full_precision(image_features.device):
            if owners is None:
                cos = image_features.float() @ text_features.float().t()  # (B, C)
            else:  # every image against every group's classes, then its own group's: (B, G, C) -> (B, C)
                n_groups, n_cls, _ = text_features.shape
                every = image_features.float() @ text_features.float().reshape(n_groups * n_cls, -1).t()
                cos = every.view(len(owners), n_groups, n_cls)[torch.arange(len(owners), device=owners.device), owners]
            logits = self.logit_scale.float() * cos
            bias = getattr(self.clip, "logit_bias", None)
            return logits + bias.float() if bias is not None else logits

    def forward(self, images: Tensor) -> Tensor:
        return self.logits(self.image_features(images), self.text_features())

    def zero_shot_classifier(self, text_features: Tensor) -> Callable[[Tensor], Tensor]:
        """images -> zero-shot CLIP logits: plain image features against template text features (C, D)."""
        text = text_features.to(self.logit_scale.device)
        return lambda images: self.logits(self.image_features(images, prompted=False), text)

    def image_tokens(self, images: Tensor, visual: Tensor | None = None) -> Tensor:
        """(B, 1 + N, D) unit-norm projected output tokens (class token first, then the patches), with the
        visual prompts `visual` (default: the model's slot)."""
        images = self.normalize(images)
        prompts = self.visual_prompt if visual is None else visual
        prompts = prompts if prompts.numel() else None
        return F.normalize(encode_image_prompted(self.clip.visual, images, prompts, return_tokens=True), dim=-1)

    def prompts(self, names: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        """Detached copies of the named prompts (default: every slot)."""
        slots = self.slots()
        return {name: slots[name].detach().clone() for name in (tuple(slots) if names is None else names)}


def _identity(images: Tensor) -> Tensor:
    return images
