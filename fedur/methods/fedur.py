"""FedUR and FedCoPL: a deep visual prompt averaged by the server and a text prompt each client keeps
(FedUR sec. 3.5). They differ in the pseudo-labeller: FedUR's CoDPL (class weights and negative
pseudo-labels), FedCoPL's CoPL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fedur.labels import CoDPL, CoPL, Labeller
from fedur.methods.base import GlobalModel, GlobalView, Method
from fedur.methods.pieces import Piece, text_context, visual_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class FedUR(Method):
    """FedUR: deep visual prompts averaged by the server, personal text prompts, CoDPL pseudo-labels."""


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


    def personal_means(self) -> tuple[str, ...]:
        """A personal visual prompt (share 'text' or 'none') is the clients' mean in the server's model, and so is a
        personal text context with global_text 'mean'."""
        shared = {name for name, piece in self.pieces().items() if piece.shared}
        means = () if "visual" in shared else ("visual",)
        return means + (("text_ctx",) if "text_ctx" not in shared and self.global_text == "mean" else ())


class FedCoPL(FedUR):
    """FedCoPL (FedUR's predecessor): FedUR's prompts with the CoPL labeller (no class weights, no negatives)."""

    def default_labeller(self) -> Labeller | None:
        return CoPL()
