"""PromptFL (Guo et al., TMC 2023) and PromptProx (FedProx on prompts): one CoOp text prompt, averaged by
the server and used by every client; PromptProx adds (mu / 2) ||prompt - global prompt||^2 to the local
loss (FedUR implementation spec, sec. 10; FedOTP's re-implementation, mu = 0.5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jsonargparse.typing import NonNegativeFloat
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import LocalBatch, Method, shared_names
from fedur.methods.pieces import Piece, text_context
from fedur.methods.proximal import proximal_term

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class PromptFL(Method):
    """PromptFL: one CoOp text prompt averaged by the server (FedAvg), no visual prompt; FPL pseudo-labels."""

    preset = "promptfl"


    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True)}

    def default_labeller(self) -> Labeller | None:
        return FPL()


class PromptProx(PromptFL):
    """PromptProx: PromptFL with FedProx's proximal term on the shared prompt."""

    preset = "promptprox"
    old_keys = {"method.prox_mu": "--method PromptProx --method.mu"}

    def __init__(self, mu: NonNegativeFloat = 0.5, **kwargs) -> None:
        """
        Args:
            mu: mu of the proximal term (mu / 2) * ||prompt - global prompt||^2 (FedOTP's default 0.5).
        """
        super().__init__(**kwargs)
        self.mu = float(mu)

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch) -> Tensor | None:
        names = shared_names(self)
        return proximal_term([pieces[n] for n in names], [start[n] for n in names], self.mu)
