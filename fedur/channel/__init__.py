"""The channel: the one door through which everything a client sends passes, a round's uploads (its shared pieces and
messages) and a refresh's pseudo-label histograms, as rows {name: (K, ...)} every rank holds alike.

Its stages, each one file with one settings group, always composed in this order:

    draw       who is asked: the method's draw (Method.participants), or under privacy a draw from the secret seed
    clock      who answers in time, who is lost, how many local steps each may take (clock.py, `clock:`)
    adversary  what an attacker sends in place of its own, or the flipped labels it trains on (adversary.py, `adversary:`)
    noise      what leaves a client's rank under privacy: its update clipped, with its own noise in local mode
               (noise.py, `privacy:`)
    reducer    what the server makes of the accepted rows: the method's mean, a robust rule (reducer.py, `aggregator:`),
               or under central privacy the noised mean (noise.py)
    ledger     privacy's accountant prices every release (fedur/privacy/)

A stage that is off passes its input on. The round loop (fedur/train/round.py) and the exchange
(fedur/train/exchange.py) ask the channel, never a stage; which stages may be composed follows from what each needs
and gives (`check`: one line per refusal, with its reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from fedur.channel import adversary as adversaries
from fedur.channel import clock as clocks
from fedur.channel import reducer as reducers
from fedur.channel.adversary import Adversary, AdversaryConfig
from fedur.channel.clock import Clock, ClockConfig
from fedur.channel.noise import Noise
from fedur.channel.reducer import AggregatorConfig, Reducer
from fedur.errors import ConfigError
from fedur.federated.clock import Arrivals
from fedur.methods.base import shared_names

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method
    from fedur.privacy import Privacy

__all__ = ["AdversaryConfig", "AggregatorConfig", "Channel", "ClockConfig", "Drawn", "Stages", "check"]


@dataclass(frozen=True)
class Stages:
    """A run's stage settings, each its own group (fedur/config.py holds them): what `check` and `build` read."""

    clock: ClockConfig = field(default_factory=ClockConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    privacy_mode: str = "none"  # privacy.mode: none | central | local


@dataclass(frozen=True)
class Drawn:
    """Who takes part in a round, before anyone trains (rows are client ids)."""

    joined: Tensor  # (K,) bool: drawn (asked, with over-selection)
    weights: Tensor  # (K,) the aggregation weight of each one that trains (0: sits out, or has nothing to train on)
    arrivals: Arrivals  # who will be lost, late or taken, and when (fedur/federated/clock.py)
    budgets: Tensor | None  # (K,) int64 the steps each may take (-1: all; None: no deadline cuts any)
    piece_bytes: dict[str, int]  # {name: bytes} of one client's upload


@dataclass
class Channel:
    """A run's stages, built once (`build`); every rank holds the same."""

    clock: Clock
    adversary: Adversary
    noise: Noise
    reducer: Reducer

    @classmethod
    def alone(cls) -> Channel:
        """Every stage off: a client that sends nothing (a new client adapting alone, evaluation.new_clients)."""
        return cls(Clock(seed=0), Adversary(seed=0), Noise(None), Reducer())

    @property
    def privacy(self) -> Privacy | None:
        """The mechanism and its ledger (None: privacy off): checkpointed with the run."""
        return self.noise.privacy

    @property
    def system(self) -> bool:
        """Whether the clock, the adversary or the reducer is on (a run's answers are then recorded)."""
        return self.clock.active or self.adversary.active or self.reducer.active

    @property
    def reports_updates(self) -> bool:
        """Whether the run may report what the clients' raw updates look like (their divergence): not under privacy,
        where only what the channel released leaves the clients."""
        return not self.noise.active

    def describe(self) -> list[str]:
        """The lines a run starts with: privacy's, and what the clients do ("clients: ...")."""
        lines = [] if self.privacy is None else [self.privacy.describe()]
        parts = [*self.clock.describe(), *self.adversary.describe(), *self.reducer.describe()]
        return lines + (["clients: " + "; ".join(parts)] if parts else [])

    # -- before anyone trains ----------------------------------------------------------------------------------

    def draw(self, method: Method, round_idx: int, num_clients: int, join_rate: float, seed: int) -> Tensor:
        """(N,) bool: who of the `num_clients` training clients is asked in round `round_idx`: the method's draw at the
        clock's rate (over-selection asks more), or under privacy the draw from the secret seed."""
        if self.privacy is not None:
            return self.privacy.participants(round_idx, num_clients)
        return method.participants(round_idx, num_clients, self.clock.join_rate(join_rate, num_clients), seed)

    def uploaders(self, joined: Tensor, weights: Tensor) -> Tensor:
        """(K,) bool: who of the asked clients sends: those with something to send (weight > 0), or under privacy
        every asked client (one without pseudo-labels or steps sends an update of zero)."""
        return joined.clone() if self.noise.active else weights > 0

    def arrivals(self, round_idx: int, uploading: Tensor, selected: Tensor | None, upload_bytes: int, wanted: int) -> Arrivals:
        return self.clock.arrivals(round_idx, uploading, selected, upload_bytes, wanted)

    def budgets(self, arrivals: Arrivals) -> Tensor | None:
        return self.clock.budgets(arrivals)

    # -- the round's exchange ------------------------------------------------------------------------------------

    def taken(self, weights: Tensor, joined: Tensor, arrivals: Arrivals) -> Tensor:
        """(K,) the aggregation weight of each client whose upload the server takes (0: not taken): the method's
        weight, or under privacy 1 for every accepted asked client (the mechanism's mean is unweighted)."""
        if self.noise.active:
            return (joined & arrivals.accepted).to(weights.dtype)
        return weights * arrivals.accepted

    def kept_global(self, arrivals: Arrivals) -> bool:
        return self.clock.kept_global(arrivals.accepted)

    def wire(self, expected: dict[str, Tensor]) -> dict[str, Tensor]:
        """{name: like} of what one client's send looks like on its way (the gathers' shapes and dtypes)."""
        return self.noise.wire(expected)

    def leave(self, client_id: int, round_idx: int, upload: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
        """What leaves client `client_id`'s rank of its upload: an attacker's in place of its own, then clipped and
        noised under privacy."""
        return self.noise.leave(client_id, round_idx, self.adversary.poison(client_id, round_idx, upload, current), current)

    def release(self, gathered: dict[str, Tensor], weights: Tensor, current: dict[str, Tensor], expected: dict[str, Tensor],
                drawn: int, round_idx: int) -> tuple[dict[str, Tensor], Tensor, dict]:
        """The rows the method sees, {name: (K, *shape)}, their weights and the reducer's metrics, from the gathered
        sends (`weights` > 0: the taken ones; `drawn`: the clients asked, privacy's denominator)."""
        rows = self.noise.rows(gathered, current, expected, weights > 0, drawn, round_idx)
        return self.reducer.reduce(rows, weights, {name: current[name] for name in current if name in rows})

    @property
    def own_rows(self) -> bool:
        """Whether each row the method sees is its client's own (not under central privacy or a one-value rule)."""
        return self.reducer.own_rows and not self.noise.central

    @property
    def reducer_name(self) -> str:
        return "privacy.mode central" if self.noise.central else f"aggregator.rule {self.reducer.rule}"

    # -- a refresh's histograms ----------------------------------------------------------------------------------

    def histograms_lost(self, refresh_round: int, num_clients: int) -> Tensor | None:
        return self.clock.histograms_lost(refresh_round, num_clients)

    def histograms_per_refresh(self, labeller: Labeller | None) -> int:
        """How many histograms a client sends at a refresh: under privacy those it releases (the cooperative
        estimates, the selected counts where the loss weighs classes), else the estimates and the selected counts of
        a cooperative labeller, the selected counts of another."""
        if self.privacy is not None:
            return self.privacy.releases.histograms_per_refresh
        return 2 if labeller is not None and labeller.cooperative else 1

    # -- the ledger --------------------------------------------------------------------------------------------------

    def record(self, joined: Tensor, refreshed: bool) -> None:
        """A round's releases into privacy's ledger (nothing without privacy)."""
        if self.privacy is not None:
            self.privacy.record(joined, refreshed)

    def summary(self, rounds: list[dict]) -> dict:
        """summary.json's "system": the attackers, and over the run's rounds (metrics.jsonl lines) how many uploads were
        asked for, lost, late and taken, the rounds that kept the global state, and the virtual clock."""
        total = lambda key: sum(len(r.get(key) or []) for r in rounds)  # noqa: E731
        return {"attackers": list(self.adversary.attackers), "attack": self.adversary.attack, "aggregator": self.reducer.rule,
                **{f"{key}_uploads": total(key) for key in ("asked", "answered", "dropped", "late", "surplus", "accepted")},
                "kept_global_rounds": [r["round"] for r in rounds if r.get("kept_global")],
                "virtual_seconds": rounds[-1].get("virtual_clock") if rounds else 0.0}


def check(stages: Stages, method: Method, labeller: Labeller | None, num_clients: int, join_rate: float) -> None:
    """Every refusal of a run's stages, before anything is loaded: each stage's own (its settings alone, with the
    federation's `num_clients` training clients and its join rate), then what their composition cannot hold, each a
    ConfigError in one line with its reason. Privacy's own settings are checked by fedur/privacy/releases.py::build."""
    stages.clock.check(num_clients, join_rate)
    stages.adversary.count(num_clients)
    for refusal in composition(stages, method, labeller):
        raise ConfigError(refusal)


def composition(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """What the stages, the method and its labeller cannot do together, each as the line that refuses it (the first
    is raised): derived from what each stage needs and gives."""
    name, mode, rule = type(method).__name__, stages.privacy_mode, stages.aggregator.rule
    private, central, robust = mode != "none", mode == "central", rule != "mean"
    shares, sums = bool(shared_names(method)), bool(method.summed)
    out = []
    if robust and (sums or not shares):
        what = "sums its clients' statistics (Method.summed)" if sums else "shares no piece"
        out.append(f"aggregator.rule={rule} combines the clients' uploads of the shared pieces, and {name} {what}; use "
                   "aggregator.rule=mean")
    if stages.adversary.poisons_updates and not shares:
        out.append(f"adversary.attack={stages.adversary.attack} replaces a client's update of the shared pieces, and {name} "
                   "shares none; label_flip poisons its pseudo-labels instead")
    if stages.adversary.attack == "label_flip" and labeller is None:
        out.append(f"adversary.attack=label_flip flips pseudo-labels, and {name} has none")
    if central and robust:
        out.append(f"privacy.mode=central releases the noised mean of the clipped updates, a reducer of its own: "
                   f"aggregator.rule={rule} over the rows is not in its accounting; use aggregator.rule=mean, or "
                   "privacy.mode=local (a rule over rows noised on their ranks is post-processing)")
    if private and stages.clock.reads_steps:
        out.append(f"privacy.mode={mode} with {clock_reading(stages.clock)}: who counts would follow a client's own number "
                   "of local steps (its pseudo-label count: private data); under privacy a deadline is in virtual seconds "
                   "with clock.late=partial (it caps each client's steps from public speeds), and no over-selection")
    if method.reads_rows == "own" and (central or rule in reducers.ONE_VALUE):
        what = "privacy.mode=central" if central else f"aggregator.rule={rule}"
        out.append(f"{name} keeps each client's own upload (its aggregate reads ServerRound.rows), and {what} releases one "
                   "value for all of them; use aggregator.rule mean (or krum, multi_krum, norm_clip), or privacy.mode "
                   "local or none")
    if private and method.personal_means():
        out.append(f"{name}'s server model averages the clients' personal {', '.join(method.personal_means())} "
                   f"({name}.personal_means), which privacy.mode={mode} does not release; share them (method.share), "
                   "or keep the template (method.global_text template)")
    if private and labeller is not None and getattr(labeller, "weight_source", "realized") == "requested":
        out.append(f"labeller.weight_source=requested weighs classes by the clients' summed quotas, which privacy.mode="
                   f"{mode} does not release (only the noised selected counts); use labeller.weight_source=realized")
    return out


def clock_reading(clock: ClockConfig) -> str:
    """The clock settings that read each client's own steps, as the refusal names them."""
    parts = []
    if clock.deadline is not None and clock.deadline_unit == "median":
        parts.append("clock.deadline_unit=median")
    if clock.deadline is not None and clock.late == "drop":
        parts.append("clock.late=drop")
    if clock.over_select:
        parts.append("clock.over_select")
    return ", ".join(parts)


def build(stages: Stages, privacy: Privacy | None, num_clients: int, seed: int, batch_size: int, local_epochs: int) -> Channel:
    """The run's Channel for `num_clients` training clients (checked: `check`); `privacy`: the run's mechanism and
    ledger (fedur/privacy/releases.py::build; None: off)."""
    adversary = adversaries.build(stages.adversary, num_clients, seed)
    return Channel(clock=clocks.build(stages.clock, num_clients, seed, batch_size, local_epochs, public=privacy is not None),
                   adversary=adversary, noise=Noise(privacy), reducer=reducers.build(stages.aggregator, len(adversary.attackers)))


def wanted(join_rate: float, num_clients: int) -> int:
    """How many uploads a round takes: ceil(join_rate x N) (over-selection asks more and takes these first)."""
    return math.ceil(join_rate * num_clients) if join_rate < 1 else num_clients

