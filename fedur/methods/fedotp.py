"""FedOTP (Li et al., CVPR 2024; "FedOPT" in the paper's tables): each client holds a global text prompt
(averaged by the server) and a local one (personal). An image's patch features are matched to the two
prompts' class features by unbalanced optimal transport, and a class's logit is the transported
similarity (spec sec. 10; the math, after the reference's trainers/GLP_OT.py, is in fedotp_math.py).
No visual prompt."""

from __future__ import annotations

import torch
from torch import Tensor

from fedur.methods.base import Method
from fedur.methods.fedotp_math import ot_logits


class FedOTP(Method):
    groupable = False  # its logits come from a transport plan over patch tokens
    name = "fedotp"
    prompts = ("text_ctx", "text_local")  # prompt 0 global, prompt 1 local
    shared = ("text_ctx",)
    default_labeller = "fpl"

    def text_side(self, model) -> Tensor:
        return torch.stack([model.text_features(), model.text_features(model.text_local)])  # (2, C, D)

    def logits(self, model, images: Tensor, text: Tensor, client) -> Tensor:
        patches = model.image_tokens(images)[:, 1:]  # (B, M, D): every token but the class token
        c = self.cfg
        with torch.autocast(patches.device.type, enabled=False):
            return ot_logits(
                patches.float(), text.float(), model.logit_scale.float(),
                eps=c.ot_eps, top_percent=c.ot_top_percent, max_iter=c.ot_max_iter, thresh=c.ot_thresh,
            )
