"""A pseudo-labeller and a method of a user's own that describe themselves to fedur as fedur's own classes do
(docs/extending.md, "What a plugin says about itself"): a table name, a preset, a setting added after runs were
made, a setting that does not change results, and a constructor that refuses a value in fedur's one line:

    python fedur/main.py --config configs/smoke.yaml --labeller tests.plugins.described.Careful --labeller.margin 0.05
    python fedur/main.py --config configs/smoke.yaml --method tests.plugins.described.Capped --method.max_rounds 3
"""

from __future__ import annotations

from torch import Tensor

from fedur.labels import FPL
from fedur.methods import PromptFL


class Careful(FPL):
    """FPL that keeps a pseudo-label only where the top-1 probability leads the runner-up by at least `margin`,
    so that near-ties between two classes train nothing.

    The second paragraph: more than --labeller.help shows as the heading.
    """

    label = "Careful FPL"
    added_settings = {**FPL.added_settings, "margin": 0.0}  # runs from before `margin` kept every FPL sample
    result_neutral = ("report",)  # it only prints

    def __init__(self, margin: float = 0.0, report: bool = False, **kwargs) -> None:
        """
        Args:
            margin: Smallest lead of the top-1 probability over the runner-up (0: every FPL sample).
            report: Print how many samples each selection keeps.
        """
        if margin < 0:
            raise ValueError(f"margin is a lead of one probability over another, so at least 0; got {margin}")
        super().__init__(**kwargs)  # per_class, class_weights, negatives, ... documented by FPL and HardLabeller
        self.margin, self.report = float(margin), report

    def choose(self, probs: Tensor, quotas: Tensor | None) -> tuple[Tensor, Tensor]:
        indices, labels = super().choose(probs, quotas)
        top = probs[indices].topk(2, dim=-1).values  # (m, 2)
        keep = top[:, 0] - top[:, 1] >= self.margin
        if self.report:
            print(f"careful: kept {int(keep.sum())} of {len(keep)} pseudo-labels")
        return indices[keep], labels[keep]


class Capped(PromptFL):
    """PromptFL that stops after `max_rounds` rounds, under a table name of its own and PromptFL's preset."""

    label = "PromptFL (capped)"
    preset = "promptfl"

    def __init__(self, max_rounds: int | None = None, **kwargs) -> None:
        """
        Args:
            max_rounds: Rounds at most (null: federation.rounds).
        """
        if max_rounds is not None and max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
        super().__init__(**kwargs)
        self.max_rounds = max_rounds

    def rounds(self, configured: int) -> int:
        return configured if self.max_rounds is None else min(configured, self.max_rounds)
