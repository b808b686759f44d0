"""FedProx's proximal term on prompts (PromptProx, FedUR implementation spec, sec. 10)."""

from __future__ import annotations

import torch
from torch import Tensor


def proximal_term(params: list[Tensor], anchors: list[Tensor], mu: float) -> Tensor:
    """Scalar (mu / 2) * sum_i ||params[i] - anchors[i]||^2 over tensors of any matching shapes.

    The anchors (the prompts the client started the round with, i.e. the global ones) are detached, so the
    gradient is mu * (p - a) on each parameter. FedOTP (`trainers/promptfl.py::forward_backward`) adds
    `(mu / 2) * torch.norm(ctx - global_ctx) ** 2` with mu = 0.5, the same value; but it reads ctx from
    `self.model.state_dict()`, which detaches it, so there the term changes the reported loss and not the
    gradient. Here it acts, as FedProx (Li et al., MLSys 2020) intends. An empty list gives 0.
    """
    if len(params) != len(anchors):
        raise ValueError(f"{len(params)} parameters but {len(anchors)} anchors")  # internal: the method passes pairs
    if not params:
        return torch.zeros((), device="cpu")
    total = sum(((p - a.detach().to(device=p.device, dtype=p.dtype)) ** 2).sum() for p, a in zip(params, anchors))
    return (mu / 2) * total
