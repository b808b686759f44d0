"""FedTPG (Qiu et al., ICLR 2024, "Text-driven prompt generation for vision-language models in federated
learning"): one prompt generator shared by every client, a small network that reads CLIP's features of the
class names and writes the text context: learned queries cross-attend to the class-name features (no
residual around the attention), then a GEGLU feed-forward block with a residual. One context for the whole
class set, placed as in CoOp ("[SOS] ctx {class}. [EOS]"); logits = CLIP's scale x cos(image, class text).
Cross-entropy only. The whole generator is averaged (uniformly, the preset); nothing is personal, so the
generator also writes contexts for class names it was not trained on (the base-to-novel protocol).

Read from boschresearch/FedTPG @ f141c2994b5a0695ac4667e6c62005b7627540c2: model/prompt_net.py L26-171
(`PromptTranslator`: soft_prompt (n_ctx, d) N(0, 0.02^2); `CrossAttention`: LayerNorms on the queries and the
context, nn.MultiheadAttention with 4 heads; `FeedForward`: LayerNorm, Linear(d, 8d), GEGLU, Linear(4d, d)),
model/FedTPG.py L118-205 (the bare class names encoded without a template, normalised; the generated context
in place of "X X X X"), federated/server.py L137-165 (every generator weight averaged uniformly); with
Yuqin-G/PMFLT @ 7c433a2 (model/FedTPG.py) as a cross-check; docs/sources/2025-baselines.md. Where fedur
differs, deliberately: the generator's widths are the backbone's (the code hard-codes 512, ViT-B's); float32
rather than fp16 weights; the generator's self-attention blocks (its `depth`, 0 by default) are left out.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from torch import Tensor, nn
from torch.func import functional_call

from fedur.errors import ConfigError
from fedur.labels import FPL, Labeller
from fedur.methods.base import Method
from fedur.methods.pieces import Piece

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

PREFIX = "generator."  # the generator's weights, one piece each


class PromptGenerator(nn.Module):
    """FedTPG's PromptTranslator at depth 0: (C, text_dim) class-name features -> (n_ctx, width) a text context.
    Its attention is nn.MultiheadAttention's with separate query, key and value projections (xavier-uniform, zero
    biases, as that module initialises them when the key width differs), written out so that its weights have the
    same names at every width."""

    def __init__(self, n_ctx: int, width: int, text_dim: int, heads: int, device: str | torch.device = "meta") -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(f"FedTPG: the text width {width} does not divide into {heads} heads (--method.heads)")
        self.heads = heads
        on = {"device": device}
        self.soft_prompt = nn.Parameter(torch.randn(n_ctx, width, **on) * 0.02)
        self.norm = nn.LayerNorm(width, **on)
        self.norm_context = nn.LayerNorm(text_dim, **on)
        self.query, self.key = nn.Linear(width, width, **on), nn.Linear(text_dim, width, **on)
        self.value, self.out = nn.Linear(text_dim, width, **on), nn.Linear(width, width, **on)
        for projection in (self.query, self.key, self.value):
            nn.init.xavier_uniform_(projection.weight)
        for projection in (self.query, self.key, self.value, self.out):
            nn.init.zeros_(projection.bias)
        self.ff_norm = nn.LayerNorm(width, **on)
        self.ff_in = nn.Linear(width, width * 8, **on)
        self.ff_out = nn.Linear(width * 4, width, **on)

    def forward(self, names: Tensor) -> Tensor:
        queries, context = self.norm(self.soft_prompt), self.norm_context(names)  # (n_ctx, width), (C, text_dim)
        split = lambda t: t.view(len(t), self.heads, -1).transpose(0, 1)  # (heads, n, width / heads)
        attended = F.scaled_dot_product_attention(split(self.query(queries)), split(self.key(context)), split(self.value(context)))
        x = self.out(attended.transpose(0, 1).reshape(len(queries), -1))  # (n_ctx, width): no residual
        hidden, gates = self.ff_in(self.ff_norm(x)).chunk(2, dim=-1)
        return self.ff_out(hidden * F.gelu(gates)) + x  # GEGLU feed-forward with its residual


class FedTPG(Method):
    """FedTPG: a prompt generator shared by every client writes the text context from the class names; FPL
    pseudo-labels."""

    preset = "fedtpg"

    def __init__(self, heads: PositiveInt = 4, **kwargs) -> None:
        """
        Args:
            heads: Attention heads of the generator's cross-attention (4); the text width must divide by it.
        """
        super().__init__(**kwargs)
        self.heads = int(heads)

    def pieces(self) -> dict[str, Piece]:
        names = [name for name, _ in generator_for(4, 8, 8, 4).named_parameters()]  # the same names at every width
        return {PREFIX + name: Piece(partial(initial_weight, name=name, heads=self.heads), shared=True, salt=4) for name in names}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """(C, D) the class features with the context the generator writes from the class names."""
        return model.text_features(generate(model, pieces, self.heads))


def generator_for(n_ctx: int, width: int, text_dim: int, heads: int, device: str | torch.device = "meta") -> PromptGenerator:
    """A generator of these shapes (on the meta device: its structure, to run with a client's weights)."""
    return PromptGenerator(n_ctx, width, text_dim, heads, device)


def shapes(model: PromptedCLIP) -> tuple[int, int, int]:
    n_ctx, width = model.text_context_shape
    return n_ctx, width, model.feature_dim


def initial_weight(model: PromptedCLIP, seed: int, name: str, heads: int) -> Tensor:
    """The generator's weight `name` as PyTorch initialises a generator built under `seed` (every weight from the
    one generator: all pieces share the seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = generator_for(*shapes(model), heads, device="cpu")
    return dict(generator.named_parameters())[name].detach().clone()


def generate(model: PromptedCLIP, pieces: dict[str, Tensor], heads: int) -> Tensor:
    """(n_ctx, width) the context the generator with the client's weights writes from the class names."""
    weights = {name[len(PREFIX):]: t for name, t in pieces.items() if name.startswith(PREFIX)}
    names = model.name_features(weights["soft_prompt"].device)
    return functional_call(generator_for(*shapes(model), heads), weights, (names.to(weights["soft_prompt"].dtype),))
