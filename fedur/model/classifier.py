"""Prompted CLIP classifier: logits = CLIP's logit scale x cos(image feature, class text feature)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedur.errors import ConfigError
from fedur.model.clip import FrozenCLIP, encode_image_prompted, encode_text_embeddings, vision_width_and_depth
from fedur.model.frozen import FrozenImages
from fedur.model.precision import full_precision
from fedur.model.prompts import TextPrompt, init_prompt
from fedur.model.text_tower import check_shared_prefix, encode_text_shared_prefix
from fedur.model.towers import causal_text, image_token_count, text_tower, vision_pre_norm


class PromptedCLIP(nn.Module):
    """A frozen CLIP that forms logits with the pieces a client hands it: a text context for the class
    prompts (`text_features(ctx)`) and deep visual prompts (`image_features(images, visual=...)`).

    It holds no client's pieces: a method declares them (fedur/methods/pieces.py) and their initial values
    come from the shapes and the init here (`text_context_shape`, `visual_prompt_shape`, `init_std`); a call
    without a visual prompt encodes the plain image. `normalize` is applied to every image batch first: the
    identity for normalised float images, or the cache's uint8 -> float step (data/cache.py), which then runs
    on the device instead of per sample in the loader.
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
        ctx_suffix: str = "",
    ) -> None:
        super().__init__()
        if n_ctx < 0 or visual_tokens < 0:
            raise ValueError("model.n_ctx and model.visual_tokens must be >= 0")  # internal: the settings' ranges check it first
        self.clip = clip.model
        self.tokenizer = clip.tokenizer
        self.init_std, self.seed = float(init_std), int(seed)
        self.causal_text = causal_text(self.clip)  # SigLIP's is not: whole prompts, no shared prefix
        text_width = self.token_embedding.weight.shape[1]
        self.text_context_shape = (n_ctx, text_width)
        # The class prompts' fixed words and where the context goes; its `ctx` (the init of seed * 1000 + 1) is what
        # text_features() without a context uses.
        initial = init_prompt(self.text_context_shape, init_std, seed=seed * 1000 + 1)
        self.ctx_suffix = ctx_suffix
        self.text_prompt = TextPrompt(self.token_embedding, clip.tokenizer, classnames, n_ctx, initial, ctx_suffix,
                                      whole=not self.causal_text)
        self.classnames = list(classnames)  # the class names, in label order (what a method's own templates format)
        self._template_features: dict[tuple, Tensor] = {}
        self.name_tokens = clip.tokenizer([name.replace("_", " ") for name in classnames])  # (C, L) the bare names, CPU
        self._name_features: dict[torch.device, Tensor] = {}
        self.text_prompt.ctx.requires_grad_(False)
        self._visual = (visual_tokens, visual_depth)
        self.feature_dim = feature_dim(self.clip)  # D of image and class features
        self.scale = float(self.clip.logit_scale.exp())  # the frozen logit scale as a number: read without a device sync
        # The class prompts' token ids stay on the CPU too (not a buffer): the text tower works out its packing from
        # them, and its mask check is done here, so no pass on a device reads anything back.
        self.host_tokens = self.text_prompt.tokens.clone()
        # None where the shared-prefix tower is exact (a causal mask, open_clip's blocks): its one read of the mask here
        self.prefix_reason = check_shared_prefix(self.text, self.n_shared, self.host_tokens.shape[1])
        self.checkpointing = False  # model.checkpointing: recompute the prompted towers' activations in the backward pass
        self.shared_prefix_text = True  # text tower: encode the class-independent prefix once (exact; where it is not:
        # a non-causal tower, every class in full)
        self.normalize: Callable[[Tensor], Tensor] = _identity
        self.zero_shot_text: Tensor | None = None  # (C, D) the template's class features, set by the round loop
        self.eval()  # `training` is True only inside a local training step (fedur/train/local.py): what a method's
        # hooks read to tell a training step from the pseudo-labelling and evaluation passes

    @torch.no_grad()
    def for_classes(self, classnames: list[str], template: str) -> PromptedCLIP:
        """This model over other classes (base-to-novel's novel names, another dataset's): the same frozen CLIP
        and settings, so every piece fits it, with its own class prompts, bare-name tokens and zero-shot class
        features (`template`), on this model's device. What the server's model is tested with on classes no
        client trained on (docs/protocols.md)."""
        other = copy.copy(self)
        other._modules, other._buffers, other._parameters = dict(self._modules), dict(self._buffers), dict(self._parameters)
        device = self.text_prompt.prefix.device
        embedding = nn.Embedding.from_pretrained(self.token_embedding.weight.detach().cpu())  # the tokens are on the CPU
        other.text_prompt = TextPrompt(embedding, self.tokenizer, classnames, self.text_prompt.ctx.shape[0],
                                       self.text_prompt.ctx.detach().cpu(), self.ctx_suffix, whole=not self.causal_text).to(device)
        other.classnames, other._template_features = list(classnames), {}
        other.text_prompt.ctx.requires_grad_(False)
        other.name_tokens = self.tokenizer([name.replace("_", " ") for name in classnames])
        other._name_features = {}
        other.host_tokens = other.text_prompt.tokens.cpu().clone()
        other.prefix_reason = check_shared_prefix(self.text, other.n_shared, other.host_tokens.shape[1])
        tokens = self.tokenizer([template.format(name) for name in classnames]).to(device)
        other.zero_shot_text = F.normalize(self.clip.encode_text(tokens).float(), dim=-1)  # as model/clip.py's zero_shot_weights
        return other

    def train(self, mode: bool = True) -> PromptedCLIP:
        super().train(mode)
        self.clip.eval()  # the backbone is frozen: never in training mode
        return self

    @property
    def text(self):
        """The text tower's parts under CLIP's names (`towers.text_tower`: CLIP itself, or its TextTransformer's view)."""
        return text_tower(self.clip)

    @property
    def token_embedding(self) -> nn.Embedding:
        """The text tower's token embedding."""
        return self.text.token_embedding

    @property
    def ctx_start(self) -> int:
        """The text context's first position in a class prompt (1 after CLIP's start token; 0 without one)."""
        return self.text_prompt.start

    @property
    def n_shared(self) -> int:
        """The class-independent positions at the start of every class prompt (the start token and the context)."""
        return self.text_prompt.start + self.text_prompt.ctx.shape[0]

    @property
    def num_classes(self) -> int:
        return self.text_prompt.prefix.shape[0]

    @property
    def logit_scale(self) -> Tensor:
        return self.clip.logit_scale.exp()

    @property
    def visual_tokens(self) -> int:
        """model.visual_tokens: the visual prompt tokens per prompted block."""
        return self._visual[0]

    @property
    def visual_prompt_shape(self) -> tuple[int, int, int]:
        """(depth, model.visual_tokens, vision width) of deep visual prompts; (0, 0, 0) with no visual tokens.
        model.visual_depth is checked here, when a method declares a visual prompt."""
        tokens, visual_depth = self._visual
        if tokens == 0:
            return (0, 0, 0)
        width, n_blocks = vision_width_and_depth(self.clip)
        depth = n_blocks - 1 if visual_depth is None else visual_depth
        if not 0 < depth <= n_blocks:
            raise ConfigError(f"model.visual_depth={visual_depth} must be in [1, {n_blocks}] for this backbone")
        return (depth, tokens, width)

    def text_features(self, ctx: Tensor | None = None, deep: Tensor | None = None) -> Tensor:
        """(C, D) unit-norm class features with the text context `ctx` (n_ctx, width) (default:
        `text_prompt.ctx`); with G contexts (G, n_ctx, width), (G, C, D) from one pass of the text tower.

        deep: deep text prompts (J - 1, n_ctx, width), or (G, J - 1, n_ctx, width) with G contexts: the context's
        positions of the residual stream replaced by prompt i - 1 before text block i, 1 <= i < J (MaPLe's and
        PromptSRC's deep language prompts; the shared-prefix tower keeps computing the prefix once)."""
        embeddings = self.text_prompt(ctx)  # (C, L, width) or (G, C, L, width)
        tokens = self.text_prompt.tokens
        if deep is not None:
            self.check_deep_text(deep)
        if self.shared_prefix_text and self.prefix_reason is None:
            features = encode_text_shared_prefix(self.text, embeddings, tokens, self.n_shared, self.host_tokens, deep,
                                                 self.ctx_start, self.checkpointing)
        elif embeddings.dim() == 4:  # every class of every context in one batch
            n_groups, n_cls, length, width = embeddings.shape
            flat = embeddings.reshape(n_groups * n_cls, length, width)
            rows = None if deep is None else deep.repeat_interleave(n_cls, dim=0)  # (G * C, J - 1, n_ctx, width)
            features = encode_text_embeddings(self.clip, flat, tokens.repeat(n_groups, 1), rows, self.ctx_start,
                                              self.checkpointing).view(n_groups, n_cls, -1)
        else:
            features = encode_text_embeddings(self.clip, embeddings, tokens, deep, self.ctx_start, self.checkpointing)
        return F.normalize(features, dim=-1)

    @torch.no_grad()
    def word_context(self, words: str) -> Tensor:
        """(n_ctx, width) float32 on the CPU: CLIP's token embeddings of the first n_ctx tokens of `words` (a text
        context that starts as those words). A ConfigError where `words` has fewer tokens."""
        n_ctx, start = self.text_context_shape[0], self.ctx_start
        tokens = self.tokenizer([words])[0]
        end = int(self.tokenizer([""])[0][start])  # the end token: what follows the start in an empty text
        length = int((tokens[start:] == end).nonzero()[0]) if bool((tokens[start:] == end).any()) else len(tokens) - start
        if length < n_ctx:
            raise ConfigError(f"the context's words {words!r} are {length} tokens, fewer than model.n_ctx={n_ctx}: set "
                              f"model.n_ctx to {length} or less (the words' first n_ctx tokens start the context)")
        weight = self.token_embedding.weight.detach()
        return weight[tokens[start:start + n_ctx].to(weight.device)].float().cpu()

    @property
    def text_depth(self) -> int:
        """The text tower's blocks."""
        return len(self.text.transformer.resblocks)

    def check_deep_text(self, deep: Tensor) -> None:
        """Deep text prompts fit this model: (..., J - 1, n_ctx, width) with J <= the text blocks."""
        n_ctx, width = self.text_context_shape
        if deep.shape[-2:] != (n_ctx, width) or deep.shape[-3] > self.text_depth - 1:
            raise ConfigError(f"deep text prompts of shape {tuple(deep.shape[-3:])} do not fit this model: at most "
                              f"{self.text_depth - 1} prompted blocks after the first, of {(n_ctx, width)} (model.n_ctx, text width)")

    @torch.no_grad()
    def template_features(self, templates: tuple[str, ...], device: torch.device, average: str = "raw") -> Tensor:
        """(C, D) unit-norm frozen CLIP class features of the templates (each with one `{}` for the class name), float32
        on `device`: one template's; several averaged over the templates, of the raw features then normalised
        (`average` 'raw': PromptSRC's teacher) or of each template's unit-norm features ('unit': CLIP's ensemble).
        Encoded once per device."""
        key = (templates, str(device), average)
        if key not in self._template_features:
            features = []
            with full_precision(device):
                for template in templates:
                    tokens = self.tokenizer([template.format(name.replace("_", " ")) for name in self.classnames]).to(device)
                    encoded = self.clip.encode_text(tokens).float()
                    features.append(encoded if average == "raw" else F.normalize(encoded, dim=-1))
            self._template_features[key] = F.normalize(torch.stack(features).mean(dim=0), dim=-1)
        return self._template_features[key]

    @torch.no_grad()
    def name_features(self, device: torch.device) -> Tensor:
        """(C, D) unit-norm frozen CLIP features of the bare class names (no template, no context), float32 on
        `device`: what a prompt generator conditions on (FedTPG). Encoded once per device."""
        if device not in self._name_features:
            with full_precision(device):
                features = self.clip.encode_text(self.name_tokens.to(device))
            self._name_features[device] = F.normalize(features.float(), dim=-1)
        return self._name_features[device]

    def image_features(self, images: Tensor | FrozenImages, prompted: bool = True, visual: Tensor | None = None,
                       persist: bool = False) -> Tensor:
        """Unit-norm features of an image batch with the visual prompts `visual`, (depth, n_tok, width) or one per
        image (B, depth, n_tok, width); None (or no elements): the frozen encoder's prompt-free path. With
        `prompted=False`, plain CLIP's `encode_image`. `persist`: the last prompted block's prompt outputs go on
        through the later blocks (MaPLe's vision tower; `encode_image_prompted`). `images` may be rows of the
        frozen-feature cache (`FrozenImages`: their features, where no prompt is given)."""
        if isinstance(images, FrozenImages):
            return images.read("features", visual if prompted else None)
        images = self.normalize(images)
        if not prompted:
            return F.normalize(self.clip.encode_image(images), dim=-1)
        prompts = visual if visual is not None and visual.numel() else None
        return F.normalize(encode_image_prompted(self.clip.visual, images, prompts, persist=persist,
                                                 checkpointed=self.checkpointing), dim=-1)

    @property
    def image_token_count(self) -> int:
        """1 + P: the output tokens of `image_tokens` per image (fedur/model/towers.py::image_token_count)."""
        return image_token_count(self.clip.visual)

    @property
    def vision_width(self) -> int:
        """The vision tower's width (a visual prompt token's)."""
        return vision_width_and_depth(self.clip)[0]

    @property
    def vision_depth(self) -> int:
        """The vision transformer's blocks (a ConfigError for a tower without them)."""
        return vision_width_and_depth(self.clip)[1]

    def vision_pre_norm(self, tokens: Tensor) -> Tensor:
        """`tokens` through the norm the vision tower's embedded tokens pass before its first block (ln_pre, norm_pre)."""
        return vision_pre_norm(self.clip.visual)(tokens)

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
            return self.biased(self.logit_scale.float() * cos)

    def biased(self, logits: Tensor) -> Tensor:
        """`logits` plus the model's logit bias where it has one (SigLIP's, learnt with its sigmoid loss), in float32;
        every place fedur forms logits from CLIP's scale adds it, so a SigLIP model's logits are its own."""
        bias = getattr(self.clip, "logit_bias", None)
        return logits + bias.float() if bias is not None else logits

    def paired_logits(self, image_features: Tensor, text_features: Tensor) -> Tensor:
        """(B, C) logits of each of (B, D) image features against its own (B, C, D) class features (CoCoOp's
        image-conditioned prompts), in fp32 like `logits`."""
        with full_precision(image_features.device):
            cos = torch.einsum("bd,bcd->bc", image_features.float(), text_features.float())
            return self.biased(self.logit_scale.float() * cos)

    def forward(self, images: Tensor) -> Tensor:
        return self.logits(self.image_features(images), self.text_features())

    def zero_shot_classifier(self, text_features: Tensor) -> Callable[[Tensor], Tensor]:
        """images -> zero-shot CLIP logits: plain image features against template text features (C, D)."""
        text = text_features.to(self.logit_scale.device)
        return lambda images: self.logits(self.image_features(images, prompted=False), text)

    def image_tokens(self, images: Tensor | FrozenImages, visual: Tensor | None = None) -> Tensor:
        """(B, 1 + N, D) unit-norm projected output tokens (class token first, then the patches), with the
        visual prompts `visual` (None: none); of `FrozenImages`, their cached tokens (no prompt given)."""
        if isinstance(images, FrozenImages):
            return images.read("tokens", visual)
        images = self.normalize(images)
        prompts = visual if visual is not None and visual.numel() else None
        return F.normalize(encode_image_prompted(self.clip.visual, images, prompts, return_tokens=True), dim=-1)


def feature_dim(clip: nn.Module) -> int:
    """D: the width of CLIP's joint embedding (the image tower's output)."""
    output = getattr(clip.visual, "output_dim", None)
    if output is not None:
        return int(output)
    projection = text_tower(clip).text_projection  # a timm tower has no output_dim: the text side's projection
    return int(projection.out_features if isinstance(projection, nn.Linear) else projection.shape[1])


def _identity(images: Tensor) -> Tensor:
    return images
