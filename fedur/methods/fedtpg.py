"""FedTPG (Qiu et al., ICLR 2024, "Text-driven prompt generation for vision-language models in federated
learning"): one prompt generator shared by every client, a small network that reads CLIP's features of the
class names and writes the text context: learned queries cross-attend to the class-name features (no
residual around the attention), then a GEGLU feed-forward block with a residual. One context for the whole
class set, placed as in CoOp ("[SOS] ctx {class}. [EOS]"); logits = CLIP's scale x cos(image, class text).
Cross-entropy only. The whole generator is averaged (uniformly, the preset); nothing is personal, so the
generator also writes contexts for class names it was not trained on (the base-to-novel protocol).

Each client conditions the generator on its own class names and classifies among them while it trains
(federated/client.py L90-117 hands the client's `available_classes` to the model; server.py L97-131 gives each
client its own classes, relabelled to local indices); the server's model, and every test, conditions on the
whole class list of what is tested (server.py L179-203). A client without labels does not know its classes: here
they are the classes its pseudo-labels select [guess: `--method.classes selected`, the default; `all`: every
client conditions on every class, which makes the generator's output one context for everyone].

Read from boschresearch/FedTPG @ f141c2994b5a0695ac4667e6c62005b7627540c2: model/prompt_net.py L26-171
(`PromptTranslator`: soft_prompt (n_ctx, d) N(0, 0.02^2); `CrossAttention`: LayerNorms on the queries and the
context, nn.MultiheadAttention with 4 heads; `FeedForward`: LayerNorm, Linear(d, 8d), GEGLU, Linear(4d, d)),
model/FedTPG.py L118-205 (the bare class names encoded without a template, normalised; the generated context
in place of "X X X X"), federated/client.py L57-142 (its own SGD, built once: momentum kept across rounds, the
preset's optim.optimizer_state client), federated/server.py L137-165 (every generator weight averaged uniformly);
with Yuqin-G/PMFLT @ 7c433a2 (model/FedTPG.py) as a cross-check; docs/sources/2025-baselines.md. Where fedur
differs, deliberately: the generator's widths are the backbone's (the code hard-codes 512, ViT-B's); float32
rather than fp16 weights; the generator's self-attention blocks (its `depth`, 0 by default) are left out
(docs/reference-parity.md lists every difference).
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from torch import Tensor, nn
from torch.func import functional_call

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import Method
from fedur.methods.pieces import Piece

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

PREFIX = "generator."  # the generator's weights, one piece each


class PromptGenerator(nn.Module):
    """FedTPG's PromptTranslator at depth 0: (C, text_dim) class-name features -> (n_ctx, width) a text context.
    Its attention is nn.MultiheadAttention's, written out with separate query, key and value projections so that
    its weights have the same names at every width; `reference_init` gives them the values the original's module
    draws."""

    def __init__(self, n_ctx: int, width: int, text_dim: int, heads: int, device: str | torch.device = "meta") -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(f"FedTPG: the text width {width} does not divide into {heads} heads (--method.heads)")
        self.heads = heads
        on = {"device": device}
        self.soft_prompt = nn.Parameter(torch.empty(n_ctx, width, **on))
        self.norm = nn.LayerNorm(width, **on)
        self.norm_context = nn.LayerNorm(text_dim, **on)
        self.query, self.key = nn.Linear(width, width, **on), nn.Linear(text_dim, width, **on)
        self.value, self.out = nn.Linear(text_dim, width, **on), nn.Linear(width, width, **on)
        self.ff_norm = nn.LayerNorm(width, **on)
        self.ff_in = nn.Linear(width, width * 8, **on)
        self.ff_out = nn.Linear(width * 4, width, **on)

    def forward(self, names: Tensor, keep: Tensor | None = None) -> Tensor:
        """`keep`: (C,) bool, the names attended to (the others are as if absent: the context norm is per name);
        None: all."""
        queries, context = self.norm(self.soft_prompt), self.norm_context(names)  # (n_ctx, width), (C, text_dim)
        split = lambda t: t.view(len(t), self.heads, -1).transpose(0, 1)  # (heads, n, width / heads)
        mask = None if keep is None else keep.view(1, 1, -1)  # (1, 1, C): broadcast over heads and queries
        attended = F.scaled_dot_product_attention(split(self.query(queries)), split(self.key(context)), split(self.value(context)),
                                                  attn_mask=mask)
        x = self.out(attended.transpose(0, 1).reshape(len(queries), -1))  # (n_ctx, width): no residual
        hidden, gates = self.ff_in(self.ff_norm(x)).chunk(2, dim=-1)
        return self.ff_out(hidden * F.gelu(gates)) + x  # GEGLU feed-forward with its residual


def reference_init(n_ctx: int, width: int, text_dim: int, heads: int, seed: int) -> dict[str, Tensor]:
    """{name: value} of a PromptGenerator's weights as the original's PromptTranslator draws them under `seed`: its
    modules built in its order (prompt_net.py L130-171: the soft prompt N(0, 0.02^2); CrossAttention's
    nn.MultiheadAttention(width, heads, kdim=text_dim, vdim=text_dim), whose query, key and value are one packed
    (3 width x width) matrix under one xavier-uniform init where text_dim == width, as at ViT-B's 512, and three
    where not; its zero biases; then the feed-forward's Linears), every draw from torch's generator seeded once."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        soft_prompt = torch.empty(n_ctx, width, device="cpu")
        nn.init.normal_(soft_prompt, std=0.02)
        attention = nn.MultiheadAttention(width, heads, kdim=text_dim, vdim=text_dim, batch_first=True)
        norm, norm_context = nn.LayerNorm(width), nn.LayerNorm(text_dim)  # PreNorm's, built after its `fn`
        feed_forward = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width * 8), nn.Identity(), nn.Linear(width * 4, width))
    if attention._qkv_same_embed_dim:
        query, key, value = attention.in_proj_weight.detach().chunk(3)  # (width, width) each
    else:
        query, key, value = (getattr(attention, f"{p}_proj_weight").detach() for p in "qkv")
    biases = attention.in_proj_bias.detach().chunk(3)
    weights = {
        "soft_prompt": soft_prompt, "norm.weight": norm.weight, "norm.bias": norm.bias,
        "norm_context.weight": norm_context.weight, "norm_context.bias": norm_context.bias,
        "query.weight": query, "query.bias": biases[0], "key.weight": key, "key.bias": biases[1],
        "value.weight": value, "value.bias": biases[2],
        "out.weight": attention.out_proj.weight, "out.bias": attention.out_proj.bias,
        "ff_norm.weight": feed_forward[0].weight, "ff_norm.bias": feed_forward[0].bias,
        "ff_in.weight": feed_forward[1].weight, "ff_in.bias": feed_forward[1].bias,
        "ff_out.weight": feed_forward[3].weight, "ff_out.bias": feed_forward[3].bias,
    }
    return {name: t.detach().clone() for name, t in weights.items()}


class FedTPG(Method):
    """FedTPG: a prompt generator shared by every client writes the text context from the class names; FPL
    pseudo-labels."""

    preset = "fedtpg"
    added_settings = {**Method.added_settings, "classes": "all"}  # runs before the switch conditioned on every class

    def __init__(self, heads: PositiveInt = 4, classes: Literal["selected", "all"] = "selected", **kwargs) -> None:
        """
        Args:
            heads: Attention heads of the generator's cross-attention (4); the text width must divide by it.
            classes: The class names a client's generator is conditioned on, and classifies among, while it trains:
                the classes its pseudo-labels select ('selected', the original's client with its own classes
                [guess: a label-free client's own classes]) or every class ('all'). Pseudo-labelling and every test
                condition on every class of what is tested, as the original's tests.
        """
        super().__init__(**kwargs)
        self.heads, self.classes = int(heads), classes

    def pieces(self) -> dict[str, Piece]:
        names = [name for name, _ in generator_for(4, 8, 8, 4).named_parameters()]  # the same names at every width
        return {PREFIX + name: Piece(partial(initial_weight, name=name, heads=self.heads), shared=True, salt=4) for name in names}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """(C, D) the class features with the context the generator writes from every class name."""
        return model.text_features(generate(model, pieces, self.heads))

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """CLIP's logits against `text`; in a training step with `classes` 'selected', against the class features of
        the context generated from the client's own classes, the other classes out of the softmax (logit -inf)."""
        features = model.image_features(images, visual=pieces.get("visual"))
        own = own_classes(client, model.num_classes) if self.classes == "selected" and model.training else None
        if own is None:
            return model.logits(features, text)
        own = own.to(images.device)
        logits = model.logits(features, model.text_features(generate(model, pieces, self.heads, own)))
        return logits.masked_fill(~own, float("-inf"))  # (B, C): the client classifies among its own classes


def own_classes(client: ClientState, num_classes: int) -> Tensor | None:
    """(C,) bool on the CPU: the classes of the client's selected pseudo-labels (None: it has none yet)."""
    labels = None if client.pseudo_labels is None else client.pseudo_labels.labels
    if labels is None or not len(labels):
        return None
    return torch.bincount(labels.cpu(), minlength=num_classes) > 0


def generator_for(n_ctx: int, width: int, text_dim: int, heads: int, device: str | torch.device = "meta") -> PromptGenerator:
    """A generator of these shapes (on the meta device: its structure, to run with a client's weights)."""
    return PromptGenerator(n_ctx, width, text_dim, heads, device)


def shapes(model: PromptedCLIP) -> tuple[int, int, int]:
    n_ctx, width = model.text_context_shape
    return n_ctx, width, model.feature_dim


def initial_weight(model: PromptedCLIP, seed: int, name: str, heads: int) -> Tensor:
    """The generator's weight `name` as the original initialises a generator built under `seed` (every weight
    from the one generator: all pieces share the seed)."""
    return _initial_weights(*shapes(model), heads, seed)[name].clone()


@lru_cache(maxsize=4)
def _initial_weights(n_ctx: int, width: int, text_dim: int, heads: int, seed: int) -> dict[str, Tensor]:
    generator_for(n_ctx, width, text_dim, heads)  # the width check, before any draw
    return reference_init(n_ctx, width, text_dim, heads, seed)


def generate(model: PromptedCLIP, pieces: dict[str, Tensor], heads: int, classes: Tensor | None = None) -> Tensor:
    """(n_ctx, width) the context the generator with the client's weights writes from the class names (`classes`:
    (C,) bool, only those, as a mask of the attention: no shape read back from the device; None: all)."""
    weights = {name[len(PREFIX):]: t for name, t in pieces.items() if name.startswith(PREFIX)}
    names = model.name_features(weights["soft_prompt"].device)
    return functional_call(generator_for(*shapes(model), heads), weights, (names.to(weights["soft_prompt"].dtype), classes))
