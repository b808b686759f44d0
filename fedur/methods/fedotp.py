"""FedOTP (Li et al., CVPR 2024; "FedOPT" in the paper's tables): each client holds a global text prompt
(averaged by the server) and a local one (personal). An image's patch features are matched to the two
prompts' class features by unbalanced optimal transport, and a class's logit is the transported
similarity (FedUR implementation spec, sec. 10; the math, after the reference's trainers/GLP_OT.py, is in fedotp_math.py).
No visual prompt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, Method
from fedur.methods.fedotp_math import ot_logits
from fedur.methods.pieces import Piece, local_text_context, text_context
from fedur.model.precision import full_precision
from fedur.ranges import Fraction

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class FedOTP(Method):
    """FedOTP: a global text prompt (averaged) and a local one (personal), matched to an image's patch
    features by unbalanced optimal transport; FPL pseudo-labels."""

    preset = "fedotp"
    needs = frozenset({"patch tokens"})  # the image's projected patch features (fedur/model/towers.py)
    old_keys = {"method.ot_": "--method FedOTP --method.eps / top_percent / max_iter / thresh"}

    def pieces(self) -> dict[str, Piece]:  # prompt 0 global, prompt 1 local
        return {"text_ctx": text_context(shared=True), "text_local": local_text_context()}

    def __init__(
        self, eps: PositiveFloat = 0.1, top_percent: Fraction = 0.8, max_iter: PositiveInt = 100,
        thresh: PositiveFloat = 1e-3, **kwargs,
    ) -> None:
        """
        Args:
            eps: Entropic regularisation of the Sinkhorn iterations.
            top_percent: Mass the unbalanced transport plan moves (the share of patches matched).
            max_iter: Sinkhorn iterations at most.
            thresh: Sinkhorn stops when the mean change of the scaling falls below this.
        """
        super().__init__(**kwargs)
        self.eps, self.top_percent, self.max_iter, self.thresh = float(eps), float(top_percent), int(max_iter), float(thresh)

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The global prompt in both of the transport's places [guess: FedOTP reports personal accuracy only]."""
        return GlobalModel({**view.shared, "text_local": view.shared["text_ctx"]})

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        return torch.stack([model.text_features(pieces["text_ctx"]), model.text_features(pieces["text_local"])])  # (2, C, D)

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        patches = model.image_tokens(images, visual=pieces.get("visual"))[:, 1:]  # (B, M, D): every token but the class token
        with full_precision(patches.device):
            return model.biased(ot_logits(
                patches.float(), text.float(), model.logit_scale.float(),
                eps=self.eps, top_percent=self.top_percent, max_iter=self.max_iter, thresh=self.thresh,
            ))
