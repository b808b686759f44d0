"""FedPGP (Cui et al., ICML 2024, "Harmonizing generalization and personalization in federated prompt
learning"): a global text prompt sigma, averaged by the server, plus a personal low-rank term U V each client
keeps; a client classifies with the personalised prompt sigma + U V. Its loss adds to cross-entropy a
contrastive term over the classes that pulls the global prompt's class features towards CLIP's own
(the placeholder prompt "X X ... X {class}." with CLIP's frozen word embeddings) and pushes them away from the
personalised ones:

    L = CE + mu * mean_c -log( exp(cos(f0_c, fs_c) / tau) / (exp(cos(f0_c, fs_c) / tau) + exp(cos(fs_c, fp_c) / tau)) )

Read from TianyuCuiOvO/FedPGP @ d43045b33f42beb192e8ac7b2da0222bf6cec3e6: trainers/fedpgp.py, `PromptLearner`
L65-242 (sigma (N, n_ctx, d), U (N, n_ctx, b), V (N, b, d), each N(0, 0.02^2); ctx = sigma + U V), `CustomCLIP`
L255-282, `forward_backward` L343-367 (the loss, tau 0.5); federated_main.py L328-422 and fed_utils.py L9-32 (only
sigma averaged, by local data size); scripts/plot_basetonew_base.sh (mu 0.5, rank 8, N 2); with Yuqin-G/PMFLT @
7c433a2 (model/FedPGP.py) as a cross-check; docs/sources/2025-baselines.md. Where fedur differs, deliberately: one
prompt copy (N = 1, the code's argparse default) [guess: the script's second copy is never a class's target, so it
only adds distractor classes to the cross-entropy]; each client has its own SGD (the released code steps one
optimizer through every client in turn, so momentum passes between them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, LocalBatch, Method
from fedur.methods.pieces import Piece, text_context
from fedur.model.precision import full_precision
from fedur.model.prompts import init_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class FedPGP(Method):
    """FedPGP: a global text prompt (averaged) plus a personal low-rank term, with a contrastive loss between
    CLIP's, the global and the personalised class features; FPL pseudo-labels."""

    preset = "fedpgp"

    def __init__(self, rank: PositiveInt = 8, mu: NonNegativeFloat = 0.5, temperature: PositiveFloat = 0.5, **kwargs) -> None:
        """
        Args:
            rank: Rank b of the personal term U V (U: n_ctx x b, V: b x width; the released script's 8).
            mu: Weight of the contrastive term (the released script's 0.5; its code's default 1).
            temperature: tau of the contrastive term (0.5).
        """
        super().__init__(**kwargs)
        self.rank, self.mu, self.temperature = int(rank), float(mu), float(temperature)

    def pieces(self) -> dict[str, Piece]:
        rank = self.rank
        return {
            "text_ctx": text_context(shared=True),  # sigma
            "lowrank_u": Piece(lambda model, seed: init_prompt((model.text_context_shape[0], rank), model.init_std, seed)),
            "lowrank_v": Piece(lambda model, seed: init_prompt((rank, model.text_context_shape[1]), model.init_std, seed)),
        }

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """sigma alone: the personal term U V at zero (U = 0) [guess: FedPGP's global prompt without a client's]."""
        return GlobalModel({**view.start, **view.shared, "lowrank_u": torch.zeros_like(view.start["lowrank_u"])})

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """(C, D) the personalised prompt's class features: sigma + U V."""
        return model.text_features(personalised(pieces))

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch | None = None) -> Tensor | None:
        """mu x the contrastive term, over the classes (rows), from this step's personalised features `text`."""
        if self.mu == 0:
            return None
        global_features = model.text_features(pieces["text_ctx"])  # fs: (C, D), unit norm
        with torch.no_grad():
            anchor = model.text_features(placeholder_context(model))  # f0: "X X ... X {class}." as CLIP embeds it
        with full_precision(global_features.device):
            positive = (anchor.float() * global_features.float()).sum(dim=-1)  # cos(f0, fs), (C,)
            negative = (global_features.float() * text.float()).sum(dim=-1)  # cos(fs, fp), (C,)
            logits = torch.stack([positive, negative], dim=1) / self.temperature  # (C, 2)
            target = torch.zeros(len(logits), dtype=torch.long, device=logits.device)
            return self.mu * F.cross_entropy(logits, target)


def personalised(pieces: dict[str, Tensor]) -> Tensor:
    """(n_ctx, width) sigma + U V."""
    return pieces["text_ctx"] + pieces["lowrank_u"] @ pieces["lowrank_v"]


def placeholder_context(model: PromptedCLIP) -> Tensor:
    """(n_ctx, width) CLIP's frozen word embeddings of the class prompts' placeholder words "X ... X": with them as
    the context, the class features are CLIP's own of "X X ... X {class}." (FedPGP's anchor)."""
    n_ctx = model.text_context_shape[0]
    return model.token_embedding(model.text_prompt.tokens[0, model.ctx_start:model.ctx_start + n_ctx])
