"""FedUR and FedCoPL: a deep visual prompt averaged by the server and a text prompt each client keeps
(FedUR sec. 3.5). They differ in the pseudo-labeller: FedUR's CoDPL (class weights and negative
pseudo-labels), FedCoPL's CoPL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.labels import CoDPL, CoPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, Method
from fedur.methods.pieces import Piece, text_context, visual_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


def fused_group_logits(method: Method, model: PromptedCLIP, images: list[Tensor], pieces: list[dict[str, Tensor]],
                       texts: list[Tensor], clients: list[ClientState], rows: list[Tensor | None] | None = None) -> list[Tensor]:
    """The default logits of several clients in one forward: image b with the visual prompt of its client
    (one per image), against its client's class features. Equal to one `logits` call per client up to
    rounding; the group's images go through the image tower together, which keeps a large GPU busy."""
    if len(images) == 1:  # a client alone: exactly its own logits
        return [method.logits(model, images[0], pieces[0], texts[0], clients[0], None if rows is None else rows[0])]
    sizes = [len(x) for x in images]
    device = images[0].device
    # (B,) client of each image, filled on the device from plain numbers: no copy from the host, no sync
    owners = torch.cat([torch.full((n,), k, dtype=torch.long, device=device) for k, n in enumerate(sizes)])
    visual = None
    if pieces[0].get("visual") is not None and pieces[0]["visual"].numel():
        visual = torch.stack([p["visual"] for p in pieces])[owners]  # (B, depth, n_tok, width)
    features = model.image_features(torch.cat(images), visual=visual)  # (B, D)
    return list(model.logits(features, torch.stack(texts), owners).split(sizes))  # texts: G x (C, D)


def fused_group_text_side(method: Method, model: PromptedCLIP, pieces: list[dict[str, Tensor]]) -> list[Tensor]:
    """Every client's (C, D) class features from one pass of the text tower over the group's contexts; a
    client alone gets exactly its own `text_side`."""
    if len(pieces) == 1 or pieces[0].get("text_ctx") is None:
        return [method.text_side(model, p) for p in pieces]
    return list(model.text_features(torch.stack([p["text_ctx"] for p in pieces])).unbind(0))  # G x (C, D)


class FedUR(Method):
    """FedUR: deep visual prompts averaged by the server, personal text prompts, CoDPL pseudo-labels."""

    group_forward = "fused"

    added_settings = {**Method.added_settings, "global_text": "template"}

    def __init__(self, share: Literal["visual", "text", "both", "none"] = "visual",
                 global_text: Literal["template", "mean"] = "template", **kwargs) -> None:
        """
        Args:
            share: Prompts the server averages: the visual prompt (the paper's protocol; text prompts stay
                personal), or as ablations of the aggregation protocol 'text', 'both' or 'none'.
            global_text: The server's model where the text prompt is personal (the global protocols,
                docs/protocols.md): the shared visual prompt with CLIP's zero-shot template ('template') or
                with the plain mean of the training clients' text contexts ('mean') [guess: the paper reports
                no global model]. A personal visual prompt (share 'text' or 'none') is the clients' mean.
        """
        super().__init__(**kwargs)
        self.share, self.global_text = share, global_text

    def pieces(self) -> dict[str, Piece]:
        return {"visual": visual_prompt(shared=self.share in ("visual", "both")),
                "text_ctx": text_context(shared=self.share in ("text", "both"))}

    def default_labeller(self) -> Labeller | None:
        return CoDPL()

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        pieces = {**view.start, **view.shared}  # a subclass's own pieces: shared, or at their initial values
        if "visual" not in view.shared:
            pieces["visual"] = view.client_mean("visual")
        if "text_ctx" in view.shared:  # shared: the global one
            return GlobalModel(pieces)
        if self.global_text == "mean":
            return GlobalModel({**pieces, "text_ctx": view.client_mean("text_ctx")})
        return GlobalModel(pieces, text=model.zero_shot_text)  # the template's class features, CLIP's own

    def group_text_side(self, model: PromptedCLIP, pieces: list[dict[str, Tensor]]) -> list[Any]:
        return fused_group_text_side(self, model, pieces)

    def group_logits(self, model: PromptedCLIP, images: list[Tensor], pieces: list[dict[str, Tensor]],
                     texts: list[Any], clients: list[ClientState], rows: list[Tensor | None] | None = None) -> list[Tensor]:
        return fused_group_logits(self, model, images, pieces, texts, clients, rows)


class FedCoPL(FedUR):
    """FedCoPL (FedUR's predecessor): FedUR's prompts with the CoPL labeller (no class weights, no negatives)."""

    def default_labeller(self) -> Labeller | None:
        return CoPL()
