"""Zero-shot CLIP: the frozen model with the dataset's template, no training. The run records its accuracy
on every client's test set (the per-client mean) and on the whole test set (the paper's protocol)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedur.federated.client import ClientState
from fedur.methods.base import Method
from fedur.methods.pieces import Piece

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class ZeroShot(Method):
    """Zero-shot CLIP: no prompts, no rounds; the run's result is the frozen model's accuracy."""

    label = "CLIP (zero-shot)"

    trains = False

    def __init__(self) -> None:  # nothing to set: no pieces, nothing aggregated
        super().__init__()

    def pieces(self) -> dict[str, Piece]:
        return {}

    def rounds(self, configured: int) -> int:
        return 0  # nothing changes from round to round: the zero-shot evaluation is the result

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        return model.zero_shot_text

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        return model.logits(model.image_features(images, prompted=False), text)
