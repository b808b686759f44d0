"""The federated methods (fedur.methods.base.Method names the places where they differ): each one class
whose constructor arguments are its settings; a class of your own joins them by its import path
(docs/extending.md)."""

from __future__ import annotations

from fedur.methods.base import ClientData, Method
from fedur.methods.fedotp import FedOTP
from fedur.methods.fedur import FedCoPL, FedUR
from fedur.methods.gdau import GDAU
from fedur.methods.pfedprompt import PFedPrompt
from fedur.methods.promptfl import PromptFL, PromptProx
from fedur.methods.zeroshot import ZeroShot

__all__ = ["GDAU", "ClientData", "FedCoPL", "FedOTP", "FedUR", "Method", "PFedPrompt", "PromptFL", "PromptProx", "ZeroShot"]
