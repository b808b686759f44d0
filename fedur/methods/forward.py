"""A method's forward for several clients at once (run.clients_per_step), decided from the method's class.

Where a class keeps the base's `text_side` (the class features of the client's text context, with its deep text
prompts where it has them), the group's contexts go through the text tower in one pass; where it keeps the base's
`logits` (CLIP's scale x cos(image features with the client's visual prompt, the client's class features)), the
group's images go through the image tower in one pass, each with its own client's visual prompt, whatever its
`text_side`. Anything a class writes of its own is called once per client. Both are equal to the per-client calls up
to rounding, a client alone exactly; nothing is declared: a method with its own `logits` is right in a group because
it is never fused.

The same reading of the class tells the evaluation when two models score the same image features (`image_side`): the
base's logits read the images only through the visual prompt. And what a method's image tower computes, from its pieces
(`frozen_reads`): where it carries no prompt, every pass reads the frozen-feature cache instead of images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.methods.base import ClientSide
from fedur.model.frozen import Reads, cat_images, probe

if TYPE_CHECKING:
    from fedur.model.classifier import PromptedCLIP


def default_text_side(method: ClientSide) -> bool:
    """The method's class keeps the base's `text_side`: its text side is `model.text_features(text_ctx)`."""
    return type(method).text_side is ClientSide.text_side


def default_logits(method: ClientSide) -> bool:
    """The method's class keeps the base's `logits`: CLIP's scale x cos(image features, its text side)."""
    return type(method).logits is ClientSide.logits


def text_sides(method: ClientSide, model: PromptedCLIP, pieces: list[dict[str, Tensor]]) -> list[Any]:
    """Every client's `text_side`: from one pass of the text tower over the group's contexts where the class keeps
    the base's; a client alone (or a model without a text context) gets exactly its own."""
    if len(pieces) == 1 or not default_text_side(method) or pieces[0].get("text_ctx") is None:
        return [method.text_side(model, p) for p in pieces]
    deep = None if pieces[0].get("deep_text") is None else torch.stack([p["deep_text"] for p in pieces])  # (G, J - 1, n, w)
    return list(model.text_features(torch.stack([p["text_ctx"] for p in pieces]), deep=deep).unbind(0))  # G x (C, D)


def group_logits(method: ClientSide, model: PromptedCLIP, images: list[Tensor], pieces: list[dict[str, Tensor]],
                 texts: list[Any], clients: list[ClientState], rows: list[Tensor | None] | None = None) -> list[Tensor]:
    """Each client's (B_k, C) logits of its batch `images[k]` with `pieces[k]` and its text side `texts[k]`;
    `rows[k]` as `logits`'s (None: no rows for any). One pass of the image tower for the group where the class
    keeps the base's `logits`, else `logits` once per client."""
    rows = [None] * len(images) if rows is None else rows
    if len(images) == 1 or not default_logits(method):
        return [method.logits(model, x, p, t, c, r) for x, p, t, c, r in zip(images, pieces, texts, clients, rows)]
    return scores(model, group_features(model, images, pieces), texts, [len(x) for x in images])


def group_features(model: PromptedCLIP, images: list[Tensor], pieces: list[dict[str, Tensor]]) -> Tensor:
    """(B, D) the image features the base's `logits` score: each client's batch with its own visual prompt, in one
    pass of the image tower for the group (a client alone: exactly its own)."""
    if len(images) == 1:
        return model.image_features(images[0], visual=pieces[0].get("visual"))
    sizes = [len(x) for x in images]
    return model.image_features(cat_images(images), visual=per_image_visual(pieces, owners_of(sizes, images[0].device)))


def scores(model: PromptedCLIP, features: Tensor, texts: list[Tensor], sizes: list[int]) -> list[Tensor]:
    """Each client's (B_k, C) logits of its rows of `features` against its own class features `texts[k]`."""
    if len(sizes) == 1:
        return [model.logits(features, texts[0])]
    owners = owners_of(sizes, features.device)
    return list(model.logits(features, torch.stack(texts), owners).split(sizes))  # texts: G x (C, D)


def owners_of(sizes: list[int], device: torch.device) -> Tensor:
    """(B,) the group's client of each image, filled on the device from plain numbers: no copy from the host."""
    return torch.cat([torch.full((n,), k, dtype=torch.long, device=device) for k, n in enumerate(sizes)])


def per_image_visual(pieces: list[dict[str, Tensor]], owners: Tensor) -> Tensor | None:
    """(B, depth, n_tok, width): each image's own client's visual prompt; None without one."""
    if pieces[0].get("visual") is None or not pieces[0]["visual"].numel():
        return None
    return torch.stack([p["visual"] for p in pieces])[owners]


def image_side(method: ClientSide, pieces: dict[str, Tensor]) -> Tensor | None:
    """What a model's image features depend on, where the class keeps the base's `logits`: its visual prompt (an
    empty tensor without one); None where the class has logits of its own (they may read anything)."""
    if not default_logits(method):
        return None
    visual = pieces.get("visual")
    return torch.zeros(0, device="cpu") if visual is None else visual


@torch.no_grad()
def frozen_reads(method: ClientSide, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Reads | None:
    """What the method's logits read of the image tower with `pieces` (a client's, on the model's device), where the
    tower carries no prompt: its features ("features") or its output tokens ("tokens", FedOTP's patches); None where a
    piece reaches the tower (a visual prompt, MaPLe's projected text prompts) or the logits read nothing of it.

    Decided from the class and the pieces, nothing declared: where the class keeps the base's `logits`, from its visual
    prompt (`image_side`); otherwise the logits are called once, in evaluation mode, on a `TowerProbe` (a batch of one
    image that records what the tower is asked and answers with zeros) with no text side. They stop at their first
    use of what the text tower gives (a probe is not a pass), and what the tower was asked until then decides; a
    method whose logits stop before they ask the tower anything reads images (the safe answer)."""
    if default_logits(method):
        visual = image_side(method, pieces)
        return "features" if not visual.numel() else None
    images = probe(model.feature_dim, model.logit_scale.device)
    empty = np.zeros(0, dtype=np.int64)
    training = model.training
    model.eval()
    try:
        method.logits(model, images, pieces, None, ClientState(-1, empty, empty, dict(pieces)), None)
    except Exception:  # noqa: BLE001  the logits reached the text side the probe does not give (or failed): asked so far
        pass
    finally:
        model.train(training)
    if not images.asked or any(prompted for _, prompted in images.asked):
        return None
    return "tokens" if any(what == "tokens" for what, _ in images.asked) else "features"
