"""FedUR and FedCoPL: a deep visual prompt averaged by the server and a text prompt each client keeps
(FedUR sec. 3.5). They differ in the pseudo-labeller: FedUR's CoDPL (class weights and negative
pseudo-labels), FedCoPL's CoPL."""

from __future__ import annotations

from fedur.methods.base import Method


class FedUR(Method):
    name = "fedur"
    prompts = ("visual", "text_ctx")
    shared = ("visual",)
    default_labeller = "codpl"


class FedCoPL(FedUR):
    name = "fedcopl"
    default_labeller = "copl"
