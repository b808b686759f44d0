"""The federated methods (fedur.methods.base.Method names the places where they differ): each one class
whose constructor arguments are its settings; a class of your own joins them by its import path
(docs/extending.md)."""

from __future__ import annotations

from fedur.methods.base import (
    Aggregated,
    ClientData,
    ClientSide,
    GlobalModel,
    GlobalView,
    LocalBatch,
    LocalRound,
    LocalStep,
    Method,
    ServerRound,
    ServerSide,
)
from fedur.methods.cocoop import FedCoCoOp
from fedur.methods.dpfpl import DPFPL
from fedur.methods.fedotp import FedOTP
from fedur.methods.fedpgp import FedPGP
from fedur.methods.fedpha import FedPHA
from fedur.methods.fedtpg import FedTPG
from fedur.methods.fedur import FedCoPL, FedUR
from fedur.methods.gdau import GDAU
from fedur.methods.kgcoop import FedKgCoOp
from fedur.methods.maple import FedMaPLe
from fedur.methods.pfedmoap import PFedMoAP
from fedur.methods.pfedprompt import PFedPrompt
from fedur.methods.pieces import Piece, local_text_context, text_context, visual_prompt
from fedur.methods.promptfl import PromptFL, PromptProx
from fedur.methods.promptfolio import PromptFolio
from fedur.methods.promptsrc import FedPromptSRC
from fedur.methods.scaffold import SCAFFOLD
from fedur.methods.zeroshot import ZeroShot

__all__ = [
    "Aggregated", "ClientData", "ClientSide", "DPFPL", "FedCoCoOp", "FedCoPL", "FedKgCoOp", "FedMaPLe", "FedOTP", "FedPGP", "FedPHA",
    "FedPromptSRC", "FedTPG", "FedUR", "GDAU", "GlobalModel",
    "GlobalView", "LocalBatch", "LocalRound", "LocalStep", "Method", "PFedMoAP", "PFedPrompt", "Piece", "PromptFL", "PromptFolio",
    "PromptProx",
    "SCAFFOLD", "ServerRound", "ServerSide", "ZeroShot", "local_text_context", "text_context", "visual_prompt",
]
