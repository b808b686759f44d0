"""PromptFolio (Pan et al., NeurIPS 2024, "Federated learning from vision-language foundation models:
theoretical analysis and method"): each client holds a global text prompt, averaged by the server, and a
local one of its own; a class's text feature is the mixture (1 - theta) f_global + theta f_local of the two
prompts' unit-norm class features, not normalised again, and the logits are CLIP's scale x cos(image,
mixture). Cross-entropy only. No visual prompt.

Read from PanBikang/PromptFolio @ 8f729aab78b27ad78ad441b75deebb0e51d5b26c: trainers/PromptFolio.py,
`PromptLearner` L64-194 (two contexts, N(0, 0.02^2)), `CustomCLIP.forward` L215-235 (the mixture, `frac` = theta,
0.4), `fed_aggregate_model` / `fed_download_model` L412-423 (only the global context averaged, by local data
size), with Yuqin-G/PMFLT @ 7c433a2 (model/PromptFolio.py) as a cross-check; docs/sources/2025-baselines.md.
Where fedur differs, deliberately: the server's average pairs each client's data-size weight with its own
prompt [guess: the released `average_weights` indexes the weights by a shuffled client list, so a weight goes
with another client's prompt; PMFLT pairs them as here]; each client has its own SGD and schedule (the
released code steps one optimizer and one never-reset scheduler through every client in turn); float32 rather
than fp16 prompts.

The schedule: the released one is a warm-up epoch at 1e-5, then CosineAnnealingLR with T_max = 5 local epochs,
stepped once per local epoch and never reset, so that it falls to 0 within a round of 5 epochs and rises again
over the next; the preset (configs/presets/promptfolio.yaml) runs it per client with optim.cosine_epochs 5 and
optim.warmup_epochs 1. Without them a run has fedur's cosine over a pseudo-label period (refresh_every x
local_epochs epochs, restarting at each refresh): with refresh every 5 rounds, the fifth round trains at 9.5% of
the rate or less (0.4% by its end).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedur.labels import FPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, Method
from fedur.methods.pieces import Piece, local_text_context, text_context
from fedur.ranges import Fraction

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class PromptFolio(Method):
    """PromptFolio: a global text prompt (averaged) and a local one (personal), their class features mixed by a
    fixed theta; FPL pseudo-labels."""

    preset = "promptfolio"

    def __init__(self, theta: Fraction = 0.4, **kwargs) -> None:
        """
        Args:
            theta: The local prompt's share of a class's text feature, (1 - theta) f_global + theta f_local (the
                released code's `frac_p`, 0.4; 0: the global prompt alone, PromptFL).
        """
        super().__init__(**kwargs)
        self.theta = float(theta)

    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True), "text_local": local_text_context()}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The global prompt alone (the mixture of the global prompt with itself) [guess]."""
        return GlobalModel({**view.shared, "text_local": view.shared["text_ctx"]})

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """(C, D) (1 - theta) f_global + theta f_local, each unit-norm, their mixture not normalised again."""
        return (1.0 - self.theta) * model.text_features(pieces["text_ctx"]) + self.theta * model.text_features(pieces["text_local"])

