"""Which methods run on which backbone: what a method needs of the towers (fedur/model/towers.py FEATURES) against
what the model takes, checked before any compute, and refused in one line naming the methods that do run on it.

A method needs a text context in the class prompts when it trains (every prompt-learning method; ZeroShot and GDAU
run on any backbone), deep visual prompts when it has a non-empty "visual" piece (FedUR, FedCoPL, SCAFFOLD,
FedPromptSRC with model.visual_tokens > 0), deep text prompts when it has "deep_text" (FedMaPLe, FedPromptSRC), and
what its class says beyond its pieces (`Method.needs`: FedMaPLe's projected vision prompts, FedOTP's patch features).
"""

from __future__ import annotations

from fedur.errors import ConfigError
from fedur.model.towers import TEXT_PROMPTS, VISUAL_PROMPTS

DEEP_TEXT, VISUAL = "deep_text", "visual"


def method_needs(method, visual_tokens: int) -> frozenset[str]:
    """What `method` (an instance) needs of the backbone with `visual_tokens` deep visual prompt tokens per block."""
    pieces = method.pieces()
    needs = set(type(method).needs)
    if method.trains:
        needs.add(TEXT_PROMPTS)
    if VISUAL in pieces and visual_tokens > 0:
        needs.add(VISUAL_PROMPTS)
    if DEEP_TEXT in pieces:
        needs.add("deep text prompts")
    return frozenset(needs)


def runs_on(features: frozenset[str], visual_tokens: int) -> list[str]:
    """fedur's own methods (at their default settings) that run on a backbone taking `features`."""
    from fedur import plugins

    return [cls.__name__ for cls in plugins.builtin("method") if method_needs(cls(), visual_tokens) <= features]


def check_backbone(method, name: str, visual_tokens: int) -> None:
    """Refuse `method` on the open_clip model `name` (its config registered) when the model lacks what the method
    needs: one ConfigError naming what is missing, the towers, and the methods that run on it."""
    if not method_needs(method, visual_tokens):
        return
    from fedur.model.clip import backbone_features

    line = refusal(method, name, *backbone_features(name), visual_tokens)
    if line is not None:
        raise ConfigError(line)


def refusal(method, name: str, family: str, features: frozenset[str], visual_tokens: int) -> str | None:
    """Why `method` cannot run on the model `name` whose towers (`family`, in words) take `features`, in one line
    naming the methods that do run on it; None when it runs."""
    missing = sorted(method_needs(method, visual_tokens) - features)
    if not missing:
        return None
    hint = ""
    if missing == [VISUAL_PROMPTS] and VISUAL in method.pieces() and VISUAL_PROMPTS not in type(method).needs:
        hint = f"; or set model.visual_tokens 0 ({type(method).__name__} then trains its text prompts only)"
    return (f"{type(method).__name__} cannot run on {name}: it needs {' and '.join(missing)}, which {name}'s towers ({family}) "
            f"do not take. Methods that run on {name}: {', '.join(runs_on(features, visual_tokens))}{hint}")
