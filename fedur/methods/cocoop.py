"""FedCoCoOp: CoCoOp (Zhou et al., CVPR 2022, "Conditional prompt learning for vision-language models") federated
as FLiP federates it. A CoOp text context plus a Meta-Net, Linear(D, D/16) -> ReLU -> Linear(D/16, width), that maps
each image's frozen, unit-norm CLIP feature to a bias added to every context vector: each image gets its own class
prompts, and its logits are CLIP's scale x cos(its feature, its own class features). Cross-entropy only (the
labeller's loss). The context and the whole Meta-Net are averaged; nothing is personal.

Read from KaiyangZhou/CoOp @ ff61507c790454bce7c5052c3ac39e60772f1f89: trainers/cocoop.py, `PromptLearner` L62-161
(ctx from words or N(0, 0.02^2); the Meta-Net L95-99; `ctx.unsqueeze(0) + bias.unsqueeze(1)` L144-161),
`CustomCLIP.forward` L174-194 (the normalised image feature into the Meta-Net; one text-tower pass per image, each
image against its own class features), configs/trainers/CoCoOp/vit_b16_c4_ep10_batch1_ctxv1.yaml (the preset); the
federated form from 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f: flcore/models/clip/CoCoOp.py L21-40,
flcore/models/text/prompt.py L184-230, flcore/utils.py L347-377 (ctx and every Meta-Net weight uploaded),
flcore/servers/server_base.py L202-237 (averaged by local data size: the preset's weighting); PMFLT has no CoCoOp.
docs/sources/cocoop-kgcoop.md is the reading. Where fedur differs: float32 pieces and SGD, the towers bf16-mixed on
GPUs with bf16 units under fabric.precision auto (the original halves the Meta-Net to fp16); the per-image text passes
run as one batched pass of the text tower per chunk of `image_chunk` images (the same features); the context starts
random unless `ctx_init` names words (FLiP's default; CoCoOp's published run starts from "a photo of a", the preset)
[guess]. docs/reference-parity.md lists every difference.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from torch import Tensor, nn

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import Method
from fedur.methods.pieces import Piece, text_context

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

META = "meta_net."  # the Meta-Net's weights, one piece each
META_NAMES = ("linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias")


class FedCoCoOp(Method):
    """FedCoCoOp: a text context shifted per image by a Meta-Net of the image's feature, both averaged; FPL
    pseudo-labels."""

    label = "FedCoCoOp"
    preset = "fedcocoop"
    result_neutral = ("image_chunk",)

    def __init__(self, ctx_init: str | None = None, image_chunk: PositiveInt = 32, **kwargs) -> None:
        """
        Args:
            ctx_init: Words whose CLIP embeddings start the context (its first model.n_ctx tokens: CoCoOp's published
                "a photo of a" with model.n_ctx 4); null: N(0, model.ctx_init_std^2), FLiP's [guess].
            image_chunk: Images whose class prompts go through the text tower together (each image has its own C
                prompts: memory grows with chunk x classes); the same logits at any value.
        """
        super().__init__(**kwargs)
        self.ctx_init, self.image_chunk = ctx_init, int(image_chunk)

    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True, words=self.ctx_init),
                **{META + name: Piece(partial(meta_net_weight, name=name), shared=True, salt=5) for name in META_NAMES}}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """Nothing before the images: every image has its own class prompts (`logits`)."""
        return None

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """(B, C): each image's CLIP logits against the class features of the context shifted by the Meta-Net's bias
        for it."""
        features = model.image_features(images)  # (B, D) unit norm: the frozen tower, no prompt
        out = []
        for part in features.split(self.image_chunk):
            ctx = pieces["text_ctx"].unsqueeze(0) + meta_bias(part, pieces).unsqueeze(1)  # (b, n_ctx, width)
            out.append(model.paired_logits(part, model.text_features(ctx)))  # text: (b, C, D), one pass
        return torch.cat(out)


def meta_bias(features: Tensor, pieces: dict[str, Tensor]) -> Tensor:
    """(B, width) the Meta-Net's output for (B, D) image features: linear2(relu(linear1(f)))."""
    hidden = F.relu(F.linear(features.to(pieces[META + "linear1.weight"].dtype), pieces[META + "linear1.weight"],
                             pieces[META + "linear1.bias"]))  # (B, D / 16)
    return F.linear(hidden, pieces[META + "linear2.weight"], pieces[META + "linear2.bias"])


def meta_net_weight(model: PromptedCLIP, seed: int, name: str) -> Tensor:
    """The Meta-Net's weight `name` as PyTorch initialises CoCoOp's `Sequential(linear1, relu, linear2)` built under
    `seed` (every weight from the one build)."""
    return _meta_net(model.feature_dim, model.text_context_shape[1], seed)[name].clone()


@lru_cache(maxsize=4)
def _meta_net(feature_dim: int, width: int, seed: int) -> dict[str, Tensor]:
    if feature_dim < 16:
        raise ConfigError(f"FedCoCoOp: the Meta-Net's hidden width is D / 16, and this backbone's D is {feature_dim}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(OrderedDict([("linear1", nn.Linear(feature_dim, feature_dim // 16, device="cpu")),
                                         ("relu", nn.ReLU(inplace=True)),
                                         ("linear2", nn.Linear(feature_dim // 16, width, device="cpu"))]))
    return {name: t.detach().clone() for name, t in net.state_dict().items()}
