"""FedMaPLe: MaPLe (Khattak et al., CVPR 2023, "MaPLe: Multi-modal prompt learning") federated as FLiP and FedMGP
federate it. Deep multi-modal prompts: a text context at the first text block and deep text prompts replacing the
context's positions before text blocks 1..J-1 (no positional embedding), each coupled to a vision prompt by a linear
projection text -> vision of its own: the first one's projection appended to the patch tokens before ln_pre, the
deeper ones replacing the last tokens before vision blocks 1..J-1, the last ones' outputs kept to the end. Logits =
CLIP's scale x cos(image, class text); cross-entropy only. Every prompt and projection is averaged by the server.

Read from muzairkhattak/multimodal-prompt-learning @ 69bce21ae8eda80ad6187534b2dce09cf6c59e17: trainers/maple.py,
`MultiModalPromptLearner` L69-176 (ctx from the first n_ctx tokens of "a photo of a", L84-97; `proj` Linear(d_t, d_v),
L103-104; `compound_prompts_text` N(0, 0.02^2), L111-114; `compound_prompt_projections` the clones of one Linear,
L116-117 and `_get_clones` L207-208; the class prompts "a photo of a {name}." with the context in place of the first
n_ctx words, so that "of a" stays fixed at n_ctx 2: model.ctx_suffix), `CustomCLIP.forward` L179-204; clip/model.py
`ResidualAttentionBlock_MaPLe` L259-331 (the replacements) and `VisionTransformer_MaPLe` L425-476 (the first visual
prompt before ln_pre, the prompts' outputs never dropped); configs/trainers/MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml (the
preset). The federated form from 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f (flcore/models/clip/MaPLe.py
L12-56, flcore/models/text/prompt.py L971-1039: every prompt and projection uploaded and averaged by local data size,
flcore/servers/server_base.py L202-237) and weihao-bo/FedMGP @ 3a026970df7bf409a29c342ed4d1635882c79f99
(federated_core/trainers/fedmaple_learner.py L24-45: the same); PMFLT has no MaPLe. docs/sources/maple-promptsrc.md is
the reading. Where fedur differs: float32 pieces and SGD, the towers bf16-mixed on GPUs with bf16 units under
fabric.precision auto (the original's CLIP, context and first projection are fp16); the widths are the backbone's (the
code hard-codes ViT-B's 512 and 768); the depth defaults to MaPLe's 9 capped at the shallower tower (fedur's small CPU
models); the prompts' draws are one build under the run's seed, the context's apart. docs/reference-parity.md lists
every difference.
"""

from __future__ import annotations

import copy
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import torch
from jsonargparse.typing import PositiveInt
from torch import Tensor, nn

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import Method
from fedur.methods.pieces import Piece, text_context

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

COUPLED = ("deep_text", "proj_w", "proj_b", "deep_proj_w", "deep_proj_b")  # one build's draws (salt 6)


class FedMaPLe(Method):
    """FedMaPLe: deep text prompts coupled to vision prompts by projections, all averaged; FPL pseudo-labels."""

    label = "FedMaPLe"
    preset = "fedmaple"
    needs = frozenset({"visual prompts"})  # its vision prompts are projections of the text prompts, not a piece

    def __init__(self, depth: PositiveInt | None = None, ctx_init: str | None = None, clone_projections: bool = True,
                 **kwargs) -> None:
        """
        Args:
            depth: J, the prompted blocks of each tower (MaPLe's 9; its cross-dataset config 3; 1: shallow MaPLe, the
                first block only); null: 9, or the shallower tower's blocks where it has fewer.
            ctx_init: Words whose CLIP embeddings start the context (its first model.n_ctx tokens: MaPLe's "a photo of
                a" at model.n_ctx 2 with model.ctx_suffix "of a"); null: N(0, model.ctx_init_std^2), FLiP's.
            clone_projections: The deeper projections start as copies of one Linear (MaPLe's `_get_clones`); false:
                each its own draw.
        """
        super().__init__(**kwargs)
        self.depth, self.ctx_init, self.clone_projections = depth, ctx_init, clone_projections

    def pieces(self) -> dict[str, Piece]:
        init = partial(coupled_weight, depth=self.depth, clone=self.clone_projections)
        return {"text_ctx": text_context(shared=True, words=self.ctx_init),
                **{name: Piece(partial(init, name=name), shared=True, salt=6) for name in COUPLED}}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """CLIP's logits of the images with the vision prompts projected from the text prompts, against `text` (the
        base's text side: the class features with the context and the deep text prompts)."""
        features = model.image_features(images, visual=vision_prompts(model, pieces), persist=True)
        return model.logits(features, text)


def vision_prompts(model: PromptedCLIP, pieces: dict[str, Tensor]) -> Tensor:
    """(J, n_ctx, d_v) the vision prompts of each prompted block: the first the projection of the context through
    ln_pre (the original appends it before ln_pre, a per-token norm), the deeper ones each deep text prompt's own
    projection."""
    first = pieces["text_ctx"] @ pieces["proj_w"].t() + pieces["proj_b"]  # (n_ctx, d_v)
    deeper = torch.einsum("jnt,jvt->jnv", pieces["deep_text"], pieces["deep_proj_w"]) + pieces["deep_proj_b"].unsqueeze(1)
    return torch.cat([model.vision_pre_norm(first).unsqueeze(0), deeper])  # (J, n_ctx, d_v)


def prompt_depth(model: PromptedCLIP, depth: int | None) -> int:
    """J: `depth`, checked against both towers; None: 9 capped at the shallower tower's blocks."""
    blocks = min(model.text_depth, model.vision_depth)
    if depth is None:
        return min(9, blocks)
    if depth > blocks:
        raise ConfigError(f"FedMaPLe: --method.depth {depth} is deeper than this backbone's towers ({model.text_depth} text "
                          f"and {model.vision_depth} vision blocks)")
    return depth


def coupled_weight(model: PromptedCLIP, seed: int, name: str, depth: int | None, clone: bool) -> Tensor:
    """The deep text prompts' and the projections' initial `name` (every one from one build under `seed`)."""
    n_ctx, text_width = model.text_context_shape
    return _coupled(n_ctx, text_width, model.vision_width, prompt_depth(model, depth), clone, seed)[name].clone()


@lru_cache(maxsize=4)
def _coupled(n_ctx: int, text_width: int, vision_width: int, depth: int, clone: bool, seed: int) -> dict[str, Tensor]:
    """MaPLe's draws in its order (L103-117): `proj`, the deep text prompts N(0, 0.02^2), then one Linear whose copies
    are the deeper projections (`clone`; else each deeper projection its own Linear)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        proj = nn.Linear(text_width, vision_width, device="cpu")
        deep = torch.empty(depth - 1, n_ctx, text_width, device="cpu")
        for prompt in deep:
            nn.init.normal_(prompt, std=0.02)
        single = nn.Linear(text_width, vision_width, device="cpu")
        layers = [copy.deepcopy(single) if clone or i == 0 else nn.Linear(text_width, vision_width, device="cpu")
                  for i in range(depth - 1)]
    weights, biases = [layer.weight.detach() for layer in layers], [layer.bias.detach() for layer in layers]
    return {"deep_text": deep, "proj_w": proj.weight.detach().clone(), "proj_b": proj.bias.detach().clone(),
            "deep_proj_w": torch.stack(weights) if layers else torch.zeros(0, vision_width, text_width, device="cpu"),
            "deep_proj_b": torch.stack(biases) if layers else torch.zeros(0, vision_width, device="cpu")}
