"""PromptFL (Guo et al., TMC 2023) and PromptProx (FedProx on prompts): one CoOp text prompt, averaged by
the server and used by every client; PromptProx adds (mu / 2) ||prompt - global prompt||^2 to the local
loss (spec sec. 10; FedOTP's re-implementation, mu = 0.5)."""

from __future__ import annotations

from torch import Tensor

from fedur.methods.base import Method
from fedur.methods.proximal import proximal_term


class PromptFL(Method):
    name = "promptfl"
    prompts = ("text_ctx",)
    shared = ("text_ctx",)
    default_labeller = "fpl"


class PromptProx(PromptFL):
    name = "promptprox"

    def penalty(self, model, start: dict[str, Tensor], prompts: dict[str, Tensor] | None = None) -> Tensor | None:
        slots = model.slots() if prompts is None else prompts
        names = [name for name in self.shared if name in start]
        return proximal_term([slots[n] for n in names], [start[n] for n in names], self.cfg.prox_mu)
