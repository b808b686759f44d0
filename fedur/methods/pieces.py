"""What a client trains: the pieces a method declares (`Method.pieces`), any number, any shape, each shared
(aggregated by the server) or personal (the client's own).

Everything else follows from a declaration: each client starts from the piece's initial value (the same on
every rank and for every client), the optimizer trains the pieces that have elements and `trains`, the
checkpoint saves them with the client, the server's global value of a shared piece starts from it, and the
round's divergence of the local updates is measured per piece.

FedUR's prompts are declarations like any other:

    def pieces(self):
        return {"visual": visual_prompt(shared=True), "text_ctx": text_context(shared=False)}

A piece of a method's own gives its initial value as a function of the model and a seed:

    Piece(lambda model, seed: torch.zeros(model.feature_dim, model.feature_dim), shared=False)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from fedur.errors import PluginError
from fedur.model.prompts import init_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


@dataclass(frozen=True)
class Piece:
    """A tensor every client holds and may train.

    `init(model, seed)`: its initial value (float32, on the CPU), a pure function of the model's shapes and
    `seed` (`piece_seed`: run.seed and the piece's name), so that every rank builds the same one.
    `shared`: the server aggregates it (Method.aggregate) and every client downloads the result; otherwise it
    is personal. `trains`: local SGD trains it (a piece without elements never does).
    `salt`: the seed's offset (None: from the name); fedur's own prompts keep the offsets they always had.
    `lr_scale`: its learning rate as a multiple of the client's (optim.lr under the schedule; pFedMoAP's gating
    network trains at 5x its prompt's)."""

    init: Callable[[PromptedCLIP, int], Tensor]
    shared: bool = False
    trains: bool = True
    salt: int | None = None
    lr_scale: float = 1.0


def piece_seed(run_seed: int, name: str, piece: Piece) -> int:
    """The seed of a piece's initial value: run.seed * 1000 + its salt (fedur's prompts: 1, 2, 3; any other
    piece: 100 + a hash of its name below 900, the same on every machine)."""
    salt = piece.salt if piece.salt is not None else 100 + zlib.crc32(name.encode()) % 900
    return run_seed * 1000 + salt


def initial_values(pieces: dict[str, Piece], model: PromptedCLIP, run_seed: int) -> dict[str, Tensor]:
    """{name: initial value} of every declared piece, in declaration order."""
    out = {}
    for name, piece in pieces.items():
        value = piece.init(model, piece_seed(run_seed, name, piece))
        if not isinstance(value, Tensor):
            raise PluginError(f"piece {name!r}: its init must return a tensor, not {type(value).__name__}")
        out[name] = value.detach().cpu().clone()
    return out


def text_context(shared: bool = False, words: str | None = None) -> Piece:
    """A CoOp text context (model.n_ctx, text width), N(0, model.ctx_init_std^2): the class prompts'
    learnable words (`model.text_features(ctx)`); with `words`, CLIP's own embeddings of their first model.n_ctx
    tokens (CoOp's, CoCoOp's, MaPLe's "a photo of a" init: `embedding[0, 1:1 + n_ctx]`)."""
    if words is not None:
        return Piece(lambda model, seed: model.word_context(words), shared=shared, salt=1)
    return Piece(lambda model, seed: init_prompt(model.text_context_shape, model.init_std, seed), shared=shared, salt=1)


def deep_text_prompts(depth: int, shared: bool = False) -> Piece:
    """Deep text prompts (depth - 1, model.n_ctx, text width), N(0, model.ctx_init_std^2): the context's positions
    replaced before each text block 1..depth - 1 (MaPLe's `compound_prompts_text`, PromptSRC's `VPT_shallow`); the
    base `text_side` passes a piece named "deep_text" to `model.text_features`."""
    return Piece(lambda model, seed: init_prompt((depth - 1, *model.text_context_shape), model.init_std, seed), shared=shared)


def visual_prompt(shared: bool = True) -> Piece:
    """Deep visual prompts (depth, model.visual_tokens, vision width), N(0, std^2): appended to the patch tokens
    of each prompted block (`model.image_features(images, visual=...)`); no elements with model.visual_tokens 0."""
    return Piece(lambda model, seed: init_prompt(model.visual_prompt_shape, model.init_std, seed), shared=shared, salt=2)


def local_text_context() -> Piece:
    """A second, personal text context of the text context's shape (FedOTP's local prompt)."""
    return Piece(lambda model, seed: init_prompt(model.text_context_shape, model.init_std, seed), shared=False, salt=3)
