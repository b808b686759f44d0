"""Number types with a range, shared by the settings (fedur/config.py) and the plugins' constructor arguments:
with jsonargparse the annotation is the check at parse time and shows in --help."""

from __future__ import annotations

from jsonargparse.typing import restricted_number_type

Fraction = restricted_number_type("Fraction", float, [(">", 0), ("<=", 1)], join="and", docstring="float in (0, 1]")
LossRate = restricted_number_type("LossRate", float, [(">=", 0), ("<", 1)], join="and", docstring="float in [0, 1)")
TrimShare = restricted_number_type("TrimShare", float, [(">=", 0), ("<", 0.5)], join="and", docstring="float in [0, 0.5)")
