"""FedKgCoOp: KgCoOp (Yao et al., CVPR 2023, "Visual-language prompt tuning with knowledge-guided context
optimization") federated as FLiP and PMFLT federate it. A CoOp text context, averaged by the server and used by every
client, whose class features are pulled towards CLIP's hand-crafted ones:

    L = CE + w * (1 - mean_c cos(t_c, t0_c))

t_c the learned class features, t0_c CLIP's features of the hand-crafted prompt, both unit-norm; for unit vectors
1 - cos = |t - t0|^2 / 2. At test time the logits are CoOp's.

Read from htyao89/KgCoOp @ c43ccc32c8739f64b165cfa205fcc6c0f5bb5b17: KgCoOp/trainers/kgcoop.py, `PromptLearner`
L82-193 (ctx from "a photo of a" or N(0, 0.02^2); the hand-crafted features of one template per dataset,
`CUSTOM_TEMPLATES` L37-54, encoded once and normalised, L131-146), `CustomCLIP.forward` L223-243 (the score),
`forward_backward` L297-322 (CE + W * score; W 8.0 in every run: scripts/run.sh L2-11 passes it to
scripts/base2new_train.sh, which reads W as $2 at L8, and scripts/xd_train.sh L8 sets it; its code's default is 1.0,
train.py L97); the federated form from 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f:
flcore/models/clip/KgCoOp.py L25-61 (the same score as an added loss), flcore/utils.py L347-377 and
flcore/servers/server_base.py L202-237 (the context averaged by local data size), and Yuqin-G/PMFLT @
7c433a25012132ee66e10ad2993c823ae61aff6c (model/custom_coop.py L130-233, its "coop" with W 8;
federated/server_fedtpg.py L74-122, the context averaged by local data size). docs/sources/cocoop-kgcoop.md is the
reading. Where fedur differs: float32 pieces and SGD, the towers bf16-mixed on GPUs with bf16 units under
fabric.precision auto (the original's CLIP is fp16); the hand-crafted prompt is the run's zero-shot template unless
`template` names one (KgCoOp keys one per dataset, CUSTOM_TEMPLATES) [guess]; the context starts random unless
`ctx_init` names words (FLiP's and PMFLT's default; KgCoOp's published run: "a photo of a", the preset) [guess].
docs/reference-parity.md lists every difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from jsonargparse.typing import NonNegativeFloat
from torch import Tensor

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.methods.base import LocalBatch
from fedur.methods.pieces import Piece, text_context
from fedur.methods.promptfl import PromptFL
from fedur.model.precision import full_precision

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class FedKgCoOp(PromptFL):
    """FedKgCoOp: PromptFL whose class features are kept near CLIP's hand-crafted ones; FPL pseudo-labels."""

    label = "FedKgCoOp"
    preset = "fedkgcoop"

    def __init__(self, w: NonNegativeFloat = 8.0, ctx_init: str | None = None, template: str | None = None, **kwargs) -> None:
        """
        Args:
            w: Weight of the knowledge term w * (1 - mean_c cos(t_c, t0_c)) (KgCoOp's scripts and PMFLT: 8.0; its code's
                default and FLiP: 1.0; 0: PromptFL).
            ctx_init: Words whose CLIP embeddings start the context (its first model.n_ctx tokens: KgCoOp's published
                "a photo of a" with model.n_ctx 4); null: N(0, model.ctx_init_std^2), FLiP's and PMFLT's [guess].
            template: The hand-crafted prompt t0 is made from, with one `{}` for the class name (KgCoOp's per dataset:
                "a photo of a {}, a type of texture." for DTD, "a photo of a person doing {}." for UCF101, "a photo of
                a {}." for most); null: the run's zero-shot template (data.template or the dataset's) [guess].
        """
        super().__init__(**kwargs)
        if template is not None and template.count("{}") != 1:
            raise ConfigError(f"FedKgCoOp: --method.template {template!r} must hold one {{}} for the class name")
        self.w, self.ctx_init, self.template = float(w), ctx_init, template

    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True, words=self.ctx_init)}

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch | None = None) -> Tensor | None:
        """w x (1 - the mean over the classes of cos(t_c, t0_c)), from this step's class features `text`."""
        if self.w == 0:
            return None
        with full_precision(text.device):
            cos = (text.float() * self.anchor(model, text.device)).sum(dim=-1)  # (C,): both unit-norm
            return self.w * (1.0 - cos.mean())

    def anchor(self, model: PromptedCLIP, device: torch.device) -> Tensor:
        """(C, D) t0: CLIP's unit-norm class features of the hand-crafted prompt, float32 on `device`."""
        if self.template is None:
            return model.zero_shot_text.to(device).float()
        return model.template_features((self.template,), device, average="unit")
