"""The pseudo-labellers (fedur.labels.base.Labeller): FPL, CPL, CoPL, CoDPL, each one class whose constructor
arguments are its settings; a class of your own joins them by its import path (docs/extending.md)."""

from __future__ import annotations

from fedur.labels.base import HardLabeller, Labeller, PseudoLabels
from fedur.labels.copl import CoDPL, CoPL
from fedur.labels.cpl import CPL
from fedur.labels.fpl import FPL

__all__ = ["CPL", "FPL", "CoDPL", "CoPL", "HardLabeller", "Labeller", "PseudoLabels"]
