"""The federated methods (fedur.methods.base.Method names the places where they differ) and their registry."""

from __future__ import annotations

from fedur.config import MethodConfig
from fedur.methods.base import Method
from fedur.methods.fedotp import FedOTP
from fedur.methods.fedur import FedCoPL, FedUR
from fedur.methods.pfedprompt import PFedPrompt
from fedur.methods.promptfl import PromptFL, PromptProx
from fedur.methods.zeroshot import ZeroShot

METHODS: dict[str, type[Method]] = {
    m.name: m for m in (FedUR, FedCoPL, PromptFL, PromptProx, PFedPrompt, FedOTP, ZeroShot)
}


def build_method(cfg: MethodConfig) -> Method:
    return METHODS[cfg.name](cfg)


__all__ = ["METHODS", "Method", "build_method"]
