"""What a federated method is, as the round loop asks it.

A method differs from FedUR in a few named places, and only there:

- `prompts`: the prompt slots each client holds ("visual", "text_ctx", "text_local");
- `shared`: which of them the server averages (the others stay personal);
- `text_side` / `logits`: how a client's logits are formed from an image batch;
- `penalty`: an extra term of the local loss (e.g. FedProx's proximal term);
- `after_refresh`: per-client state built at each pseudo-label refresh, kept in `client.extra` (checkpointed
  with the client);
- `default_labeller`: the pseudo-labeller it is paired with unless `method.labeller` says otherwise.

The loop, collectives, checkpoints, resume, metrics and placement are the same for every method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from fedur.config import MethodConfig

if TYPE_CHECKING:
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.client import ClientState
    from fedur.train.rank import Rank

SHARE = {"visual": ("visual",), "text": ("text_ctx",), "both": ("visual", "text_ctx"), "none": ()}


class Method:
    name = "base"
    prompts: tuple[str, ...] = ("visual", "text_ctx")
    shared: tuple[str, ...] = ("visual",)
    default_labeller = "codpl"
    trains = True  # False: zero-shot CLIP, no rounds
    groupable = True  # several clients can train in one batch (`group_logits`): logits are image x text features

    def __init__(self, cfg: MethodConfig) -> None:
        self.cfg = cfg
        if cfg.share != "auto":
            wanted = SHARE[cfg.share]
            missing = [name for name in wanted if name not in self.prompts]
            if missing:
                raise ValueError(
                    f"method.share={cfg.share} averages {', '.join(missing)}, which method.name={self.name} does not "
                    f"have (its prompts: {', '.join(self.prompts) or 'none'}); use method.share=auto"
                )
            self.shared = wanted

    @property
    def labeller(self) -> str:
        """The pseudo-labeller's name: `method.labeller`, or this method's own for 'auto'."""
        return self.default_labeller if self.cfg.labeller == "auto" else self.cfg.labeller

    def visual_tokens(self, configured: int) -> int:
        """Visual prompt tokens of the model: `model.visual_tokens`, or 0 for a method without a visual prompt."""
        return configured if "visual" in self.prompts else 0

    @property
    def local_text(self) -> bool:
        """Whether the model needs a second (local) text context."""
        return "text_local" in self.prompts

    def text_side(self, model: "PromptedCLIP") -> Tensor:
        """What the logits need from the text tower, computed once per pass (and every training step)."""
        return model.text_features()

    def logits(self, model: "PromptedCLIP", images: Tensor, text: Tensor, client: "ClientState") -> Tensor:
        """(B, C) logits of the client's model, the client's prompts loaded into `model`."""
        return model.logits(model.image_features(images), text)

    def group_logits(self, model: "PromptedCLIP", images: Tensor, owners: Tensor, prompts: list[dict[str, Tensor]]) -> Tensor:
        """(B, C) logits of several clients' images in one batch: image b with the prompts `prompts[owners[b]]`
        (run.clients_per_step). The same as each client's `logits` with its prompts loaded, up to rounding."""
        visual = None
        if "visual" in prompts[0] and prompts[0]["visual"].numel():
            visual = torch.stack([p["visual"] for p in prompts])[owners]  # (B, depth, n_tok, width)
        text = torch.stack([model.text_features(p["text_ctx"]) for p in prompts])  # (G, C, D)
        return model.logits(model.image_features(images, visual=visual), text, owners)

    def classifier(self, model: "PromptedCLIP", client: "ClientState") -> Callable[[Tensor], Tensor]:
        """images -> logits with the text side computed once (pseudo-labelling, evaluation)."""
        text = self.text_side(model)
        return lambda images: self.logits(model, images, text, client)

    def penalty(self, model: "PromptedCLIP", start: dict[str, Tensor], prompts: dict[str, Tensor] | None = None) -> Tensor | None:
        """An extra local loss term; `start`: the prompts the client began the round with; `prompts`: the ones
        being trained (default: the model's slots)."""
        return None

    def after_refresh(self, rank: "Rank", client: "ClientState") -> None:
        """Build per-client state from the client's new pseudo-labels (in `client.extra`)."""
