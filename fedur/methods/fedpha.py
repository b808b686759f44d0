"""FedPHA (Fang, Huang, Wan, Yang, Ye, ICML 2025, "FedPHA: Federated prompt learning for heterogeneous client
adaptation"), its homogeneous form (GL_SVDMSE, the authors' few-shot runs): a global text prompt, averaged by the
server, and a local one each client keeps. A client classifies with its local prompt alone; while it trains, the local
prompt is also projected onto the global prompt's right-singular directions but its top int(n_ctx (1 - ratio)) ones,
P = V2 V2^T (the SVD of the global prompt, the gradient flowing through it), and

    L = CE(local logits) + CE(global logits) + pull_weight mse(T_local, T_projected)
        + push_weight mean_c relu(alpha - |T_local,c - T_global,c|)

over the unit-norm class features T of the local, the global and the projected local prompt (the global logits:
CLIP's scale x cos(image, T_global)). Both CEs are the labeller's loss here.

Read from CYFang6/FedPHA @ 1ab33df395204efd811218b6d135f3469654db6e: trainers/GL_SVDMSE.py, `PromptLearner` L60-244
(ctx_global and ctx_local N(0, 0.02^2), independent draws, L91-105; `compute_null_space` L129-147: torch.svd, V[:,
cutoff:] with cutoff = int(L (1 - ratio)); the three prompt sets L149-196), `CustomCLIP.forward` L259-281 (the local
logits in every mode; the global logits and the features in training), `forward_backward` L335-371 (the loss; pull and
push weights hard-coded 1; `lambda_orthogonal` read, never used); federated_main.py L304-339 (ctx_global averaged by
local data size, utils/fed_utils.py L29-52; ctx_local personal); configs/datasets/*.yaml and federated_main.py L466-515
(the preset); with Yuqin-G/PMFLT @ 7c433a25012132ee66e10ad2993c823ae61aff6c (model/FedPHA.py) as a cross-check: its
server model (`forward_global`: the global prompt alone) is the global protocols' here. docs/sources/pfedmoap-fedpha.md
is the reading. FLiP has no FedPHA.

Where fedur differs, deliberately: heterogeneous local prompt lengths (GL_SVDMSE_HE) are not implemented (one
model.n_ctx for every context; the released HE code reads its EOT feature past the real one); each client has its own
SGD (the released code's is shared but zeroes its momentum after every client: the same as fedur's reset); float32
pieces and SGD, the towers bf16-mixed on GPUs with bf16 units under fabric.precision auto (fp16 there).
docs/reference-parity.md lists every difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, LocalBatch, Method
from fedur.methods.pieces import Piece, local_text_context, text_context
from fedur.model.precision import full_precision
from fedur.ranges import Fraction

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

@dataclass
class PHAText:
    """FedPHA's text side: the local prompt's class features; in a training step also the global and the projected
    local prompt's, and the step's image features (`logits` leaves them for `penalty`)."""

    local: Tensor  # (C, D) unit-norm
    global_: Tensor | None = None
    projected: Tensor | None = None
    image: Tensor | None = None  # (B, D)


class FedPHA(Method):
    """FedPHA: a global prompt (averaged) and a local one (personal), the local pulled towards its projection onto the
    global prompt's weaker directions and pushed from the global prompt; FPL pseudo-labels."""

    label = "FedPHA"
    preset = "fedpha"

    def __init__(self, alpha: NonNegativeFloat = 1.0, ratio: Fraction = 0.8, pull_weight: NonNegativeFloat = 1.0,
                 push_weight: NonNegativeFloat = 1.0, global_weight: NonNegativeFloat = 1.0, detach_basis: bool = False,
                 **kwargs) -> None:
        """
        Args:
            alpha: The push term's margin on |T_local,c - T_global,c| (1.0: unit vectors pushed to cos <= 0.5).
            ratio: The share of the global prompt's singular directions the projection keeps, from the weakest: it
                drops the top int(n_ctx (1 - ratio)) (0.8).
            pull_weight: Weight of mse(T_local, T_projected) (the released 1.0).
            push_weight: Weight of the push term (the released 1.0).
            global_weight: Weight of the labeller's loss of the global prompt's logits (the released 1.0).
            detach_basis: Stop the gradient through the SVD into the global prompt (the released code keeps it) [guess:
                a switch for near-equal singular values].
        """
        super().__init__(**kwargs)
        self.alpha, self.ratio = float(alpha), float(ratio)
        self.pull_weight, self.push_weight, self.global_weight = float(pull_weight), float(push_weight), float(global_weight)
        self.detach_basis = detach_basis

    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True), "text_local": local_text_context()}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """The local prompt's class features; in a training step the global and the projected local prompt's too, the
        three in one pass of the text tower."""
        local = pieces["text_local"]
        if not model.training:
            return PHAText(model.text_features(local))
        projected = local @ projector(pieces["text_ctx"], self.ratio, self.detach_basis).to(local.dtype)  # (n_ctx, width)
        features = model.text_features(torch.stack([local, pieces["text_ctx"], projected]))  # (3, C, D)
        return PHAText(features[0], features[1], features[2])

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """CLIP's logits with the local prompt (in every mode, as the original's)."""
        features = model.image_features(images)
        if model.training:
            text.image = features
        return model.logits(features, text.local)

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch | None = None) -> Tensor | None:
        """The loss on the global prompt's logits, the pull and the push (GL_SVDMSE.forward_backward L348-361)."""
        with full_precision(text.local.device):
            local, global_, projected = text.local.float(), text.global_.float(), text.projected.float()
            pull = F.mse_loss(local, projected)
            push = F.relu(self.alpha - torch.norm(local - global_, dim=-1)).mean()
            on_global = batch.loss(model.logits(text.image, text.global_))
            return self.global_weight * on_global + self.pull_weight * pull + self.push_weight * push

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The global prompt alone (PMFLT's `forward_global`; the authors test no global model)."""
        return GlobalModel({**view.shared, "text_local": view.shared["text_ctx"]})


def projector(global_ctx: Tensor, ratio: float, detach: bool = False) -> Tensor:
    """(width, width) P = V2 V2^T: V2 the global prompt's right-singular vectors but its top int(L (1 - ratio)), L its
    vectors (the released `compute_null_space`, reduced SVD), in float32."""
    matrix = global_ctx.float()
    if detach:
        matrix = matrix.detach()
    _, singular, vh = torch.linalg.svd(matrix, full_matrices=False)  # vh: (L, width)
    basis = vh[int(len(singular) * (1 - ratio)):].t()  # (width, L - cutoff)
    return basis @ basis.t()
