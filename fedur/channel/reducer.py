"""The reducer stage: how the server combines a round's accepted rows into what it releases (the `aggregator:`
settings; docs/system.md). The method's own average (mean), or a robust rule in Flower 1.42.0's definition: the
coordinate-wise median, the trimmed mean, Krum and multi-Krum, or the updates clipped to an L2 norm. Central
privacy's noised mean is the other reducer (fedur/channel/noise.py, `Noise.rows`): the two are never composed.

What a rule hands the method (ServerRound, fedur/methods/base.py): every accepted client's row of each shared piece,
either its own (mean, Krum's and multi-Krum's kept rows with the others' weights 0, each update clipped) or, for the
rules that release one value (median, trimmed mean), that value in every accepted row; the method's average of
them is `ServerRound.mean`. Messages (what a client sends beside its pieces) pass as they are.

The arithmetic is fedur/federated/robust.py's, tested against Flower's own functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat
from torch import Tensor

from fedur.channel.stage import Building, Exchange, Stage, Stages
from fedur.federated import robust
from fedur.methods.base import shared_names
from fedur.ranges import TrimShare

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method

GROUP = "aggregator"
ONE_VALUE = ("median", "trimmed_mean")  # the rules that release one value, not each client's row


@dataclass
class AggregatorConfig:
    """How the server combines the clients' uploads of the shared pieces, each rule in Flower's definition
    (docs/system.md). The method's own (mean) by default."""

    rule: Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "norm_clip"] = "mean"
    """The method's own average (mean: FedAvg's weighted average), the coordinate-wise median, the trimmed mean
    (aggregator.trim), Krum or multi-Krum (aggregator.krum_malicious, krum_keep), or the weighted average of updates
    clipped to an L2 norm (aggregator.norm_bound)."""
    trim: TrimShare = 0.2
    """trimmed_mean: the share of the uploads cut at each end of every coordinate (Flower's beta, 0.2)."""
    krum_malicious: NonNegativeInt | None = None
    """krum, multi_krum: the attackers Krum assumes (f); null: the run's number of attackers."""
    krum_keep: NonNegativeInt | None = None
    """multi_krum: the uploads kept and averaged (m); null: the uploads taken less krum_malicious."""
    norm_bound: PositiveFloat | None = None
    """norm_clip: the L2 bound of each update (all shared pieces together); null: the median of the round's update
    norms. (Not privacy.clip, which bounds what a client releases under privacy.)"""


CONFIG = AggregatorConfig


def refusals(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """A robust rule needs each client's row of the shared pieces (not a sum of statistics, not central privacy's one
    noised mean); a rule that releases one value cannot feed a method that keeps each client's own row."""
    rule, name, out = stages.aggregator.rule, type(method).__name__, []
    if rule == "mean":
        return out
    if method.summed or not shared_names(method):
        what = "sums its clients' statistics (Method.summed)" if method.summed else "shares no piece"
        out.append(f"aggregator.rule={rule} combines the clients' uploads of the shared pieces, and {name} {what}; use "
                   "aggregator.rule=mean")
    if stages.privacy_mode == "central":
        out.append(f"privacy.mode=central releases the noised mean of the clipped updates, a reducer of its own: "
                   f"aggregator.rule={rule} over the rows is not in its accounting; use aggregator.rule=mean, or "
                   "privacy.mode=local (a rule over rows noised on their ranks is post-processing)")
    if rule in ONE_VALUE and method.reads_rows == "own":
        out.append(f"{name} keeps each client's own upload (its aggregate reads ServerRound.rows), and aggregator.rule={rule} "
                   "releases one value for all of them; use aggregator.rule mean, krum, multi_krum or norm_clip")
    return out


@dataclass(frozen=True)
class Reducer(Stage):
    """The run's rule (plain values, fixed for the run; every rank the same)."""

    rule: str = "mean"
    trim: float = 0.2
    krum_malicious: int = 0
    krum_keep: int | None = None
    norm_bound: float | None = None

    @property
    def active(self) -> bool:
        return self.rule != "mean"

    @property
    def own_rows(self) -> bool:
        """Whether each accepted row the method sees is its client's own (else the one released value)."""
        return self.rule not in ONE_VALUE

    def describe(self) -> list[str]:
        return [f"aggregator {self.rule}"] if self.active else []

    def reduce(self, rows: dict[str, Tensor], weights: Tensor, current: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor, dict]:
        """The rows the method aggregates, with their weights and what the rule did (metrics, named "<rule>/<key>"):
        `rows` {name: (K, *shape)}, the accepted ones with weight > 0; `current` the shared pieces' values before the
        round (only they are combined: messages pass as they are). median and trimmed_mean give every accepted row
        of each shared piece the robust value (so that any average of them is it); krum and multi_krum zero the weight
        of the rows they do not keep; norm_clip clips each accepted row's update (all shared pieces together)."""
        if self.rule == "mean" or not bool((weights > 0).any()):
            return rows, weights, {}
        taken = torch.nonzero(weights > 0).flatten()
        names = list(current)
        flat = torch.cat([rows[n][taken].reshape(len(taken), -1).double() for n in names], dim=1)  # (n, d)
        base = torch.cat([current[n].reshape(-1).double() for n in names])
        metrics: dict = {}
        if self.rule in ("krum", "multi_krum"):
            keep = 0 if self.rule == "krum" else (self.krum_keep or max(1, len(taken) - self.krum_malicious))
            kept = taken[robust.krum_select(flat, self.krum_malicious, keep)]
            weights = torch.where(torch.isin(torch.arange(len(weights), device="cpu"), kept), weights, torch.zeros_like(weights))
            return rows, weights, self.named({"kept": len(kept)})
        if self.rule == "median":
            value = robust.coordinate_median(flat)[None].expand_as(flat)
        elif self.rule == "trimmed_mean":
            value = robust.trimmed_mean(flat, self.trim)[None].expand_as(flat)
        else:  # norm_clip
            updates = flat - base
            bound = self.norm_bound if self.norm_bound is not None else robust.median_norm(updates)
            value = base + robust.clip_to_norm(updates, bound)
            metrics = {"clip_norm": bound, "clipped": int((updates.norm(dim=1) > bound).sum())}
        out, start = dict(rows), 0
        for name in names:
            size = current[name].numel()
            piece = out[name].clone()
            piece[taken] = value[:, start:start + size].reshape(len(taken), *current[name].shape).to(piece.dtype)
            out[name], start = piece, start + size
        return out, weights, self.named(metrics)

    def named(self, metrics: dict) -> dict:
        return {f"{self.rule}/{key}": value for key, value in metrics.items()}

    def release(self, rows: dict[str, Tensor], weights: Tensor, exchange: Exchange) -> tuple[dict[str, Tensor], Tensor, dict]:
        return self.reduce(rows, weights, {name: value for name, value in exchange.current.items() if name in rows})


def build(cfg: AggregatorConfig, building: Building) -> Reducer:
    """The run's Reducer from its settings; Krum's f is the run's number of attackers unless aggregator.krum_malicious."""
    attackers = building.stages.adversary.count(building.num_clients)
    return Reducer(rule=cfg.rule, trim=float(cfg.trim), krum_malicious=cfg.krum_malicious if cfg.krum_malicious is not None else attackers,
                   krum_keep=cfg.krum_keep, norm_bound=cfg.norm_bound)
