"""The pseudo-labellers (fedur.labels.base.Labeller) and their registry: FPL, CPL, CoPL, CoDPL."""

from __future__ import annotations

from fedur.config import LabelsConfig
from fedur.labels.base import Labeller, PseudoLabels
from fedur.labels.copl import CoDPL, CoPL
from fedur.labels.cpl import CPL
from fedur.labels.fpl import FPL

LABELLERS: dict[str, type[Labeller]] = {cls.name: cls for cls in (FPL, CPL, CoPL, CoDPL)}


def build_labeller(name: str, cfg: LabelsConfig, dataset: str | None = None) -> Labeller:
    return LABELLERS[name](cfg, dataset)


__all__ = ["LABELLERS", "Labeller", "PseudoLabels", "build_labeller"]
