"""Zero-shot CLIP: the frozen model with the dataset's template, no training. The run records its accuracy
on every client's test set (the per-client mean) and on the whole test set (the paper's protocol)."""

from __future__ import annotations

from fedur.methods.base import Method


class ZeroShot(Method):
    name = "zeroshot"
    prompts = ()
    shared = ()
    default_labeller = "fpl"  # unused: nothing is trained
    trains = False
