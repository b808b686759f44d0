"""The channel: the one door through which everything a client sends passes, a round's uploads (its shared pieces and
messages) and a refresh's pseudo-label histograms, as rows {name: (K, ...)} every rank holds alike.

Its stages, each one module with one settings group (fedur/channel/stage.py says what a stage is), composed in one
order, `ORDER`:

    clock      who answers in time, who is lost, how many local steps each may take (clock.py, `clock:`)
    adversary  what an attacker sends in place of its own, or the flipped labels it trains on (adversary.py, `adversary:`)
    noise      what leaves a client's rank under privacy: its update clipped, with its own noise in local mode; at the
               server, central privacy's noised mean (noise.py, `privacy:`)
    server     when the server steps: rounds, or asynchronously as updates arrive, each weighed by its staleness
               (server.py, `server:`; docs/asynchronous.md)
    reducer    what the server makes of the accepted rows: the method's mean or a robust rule (reducer.py, `aggregator:`)

Before them the draw (who is asked: the method's draw, Method.participants, or under privacy a draw from the secret
seed), after them privacy's ledger (fedur/privacy/), which prices every release. A client's send leaves its rank
through every stage's `leave` in this order, and the gathered rows reach the method through every stage's `release`
in it; a stage that is off passes them on. The round loop (fedur/train/round.py) and the exchange
(fedur/train/server.py, fedur/train/refresh.py) ask the channel, never a stage; which stages may be composed follows
from what each refuses (`check`: one line per refusal, with its reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from fedur.channel import adversary, clock, noise, reducer, server
from fedur.channel.adversary import Adversary, AdversaryConfig
from fedur.channel.clock import Clock, ClockConfig
from fedur.channel.noise import Noise
from fedur.channel.reducer import AggregatorConfig, Reducer
from fedur.channel.server import Server, ServerConfig
from fedur.channel.stage import Building, Exchange, Stage, Stages, wanted
from fedur.errors import ConfigError
from fedur.federated.clock import Arrivals

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method
    from fedur.privacy import Privacy

__all__ = ["AdversaryConfig", "AggregatorConfig", "Channel", "ClockConfig", "Drawn", "ORDER", "ServerConfig", "Stages", "check", "wanted"]

ORDER = (clock, adversary, noise, server, reducer)  # the stages' modules, in the order a send passes them
GROUPS = {stage.GROUP: stage.CONFIG for stage in ORDER if stage.CONFIG is not None}  # their settings groups


def defaults(privacy_mode: str = "none", **groups) -> Stages:
    """Stages with every group at its defaults but those given (`groups`: {group: its settings})."""
    return Stages({name: groups.get(name, config()) for name, config in GROUPS.items()}, privacy_mode)


@dataclass(frozen=True)
class Drawn:
    """Who takes part in a round, before anyone trains (rows are client ids)."""

    joined: Tensor  # (K,) bool: drawn (asked, with over-selection)
    weights: Tensor  # (K,) the aggregation weight of each one that trains (0: sits out, or has nothing to train on)
    arrivals: Arrivals  # who will be lost, late or taken, and when (fedur/federated/clock.py)
    budgets: Tensor | None  # (K,) int64 the steps each may take (-1: all; None: no deadline cuts any)
    piece_bytes: dict[str, int]  # {name: bytes} of one client's upload
    staleness: Tensor | None = None  # (K,) int64 an asynchronous server step's: the versions each taken upload's base is
    # behind (None: a synchronous round)
    holding: Tensor | None = None  # (K,) bool the clients still training from an older version, who download nothing
    # (an asynchronous server; None: every client downloads the new pieces)

    def limit(self, client_id: int) -> int | None:
        """The most local steps client `client_id` may take this round (None: all of its own)."""
        steps = None if self.budgets is None else int(self.budgets[client_id])
        return None if steps is None or steps < 0 else steps


@dataclass
class Channel:
    """A run's stages in ORDER, built once (`build`); every rank holds the same."""

    stages: tuple[Stage, ...]

    @classmethod
    def alone(cls) -> Channel:
        """Every stage off: a client that sends nothing (a new client adapting alone, evaluation.new_clients)."""
        return cls((Clock(seed=0), Adversary(seed=0), Noise(None), Server(), Reducer()))

    def _stage(self, kind: type) -> Stage:
        return next(stage for stage in self.stages if isinstance(stage, kind))

    @property
    def clock(self) -> Clock:
        return self._stage(Clock)

    @property
    def adversary(self) -> Adversary:
        return self._stage(Adversary)

    @property
    def noise(self) -> Noise:
        return self._stage(Noise)

    @property
    def server(self) -> Server:
        return self._stage(Server)

    @property
    def reducer(self) -> Reducer:
        return self._stage(Reducer)

    @property
    def privacy(self) -> Privacy | None:
        """The mechanism and its ledger (None: privacy off): checkpointed with the run."""
        return self.noise.privacy

    @property
    def system(self) -> bool:
        """Whether a stage beside privacy acts (a run's answers are then recorded)."""
        return any(stage.active for stage in self.stages if stage is not self.noise)

    @property
    def reports_updates(self) -> bool:
        """Whether the run may report what the clients' raw updates look like (their divergence): not under privacy,
        where only what the channel released leaves the clients."""
        return not self.noise.active

    def describe(self) -> list[str]:
        """The lines a run starts with: privacy's, and what the clients do ("clients: ...")."""
        lines = [] if self.privacy is None else [self.privacy.describe()]
        parts = [part for stage in self.stages for part in stage.describe()]
        return lines + (["clients: " + "; ".join(parts)] if parts else [])

    # -- before anyone trains ----------------------------------------------------------------------------------

    def participants(self, method: Method, round_idx: int, num_clients: int, join_rate: float, seed: int) -> Tensor:
        """(N,) bool: who of the `num_clients` training clients is asked in round `round_idx`: the method's draw at the
        clock's rate (over-selection asks more), or under privacy the draw from the secret seed."""
        if self.privacy is not None:
            return self.privacy.participants(round_idx, num_clients)
        return method.participants(round_idx, num_clients, self.clock.join_rate(join_rate, num_clients), seed)

    def uploaders(self, joined: Tensor, weights: Tensor) -> Tensor:
        """(K,) bool: who of the asked clients sends: those with something to send (weight > 0), or under privacy
        every asked client (one without pseudo-labels or steps sends an update of zero)."""
        return joined.clone() if self.noise.active else weights > 0

    def draw(self, round_idx: int, joined: Tensor, weights: Tensor, selected: Tensor | None, piece_bytes: dict[str, int],
             wanted: int) -> Drawn:
        """Who of the `joined` clients (their method `weights`) will arrive, when, and with how many local steps, on the
        clock (`selected`: (K,) each one's selected pseudo-labels, None for a method that trains nothing; `wanted`: the
        uploads a round takes); a client cut short to no step trains nothing (weight 0)."""
        arrivals = self.clock.arrivals(round_idx, self.uploaders(joined, weights), selected, sum(piece_bytes.values()), wanted)
        budgets = self.clock.budgets(arrivals)
        weights = weights if budgets is None else weights * (budgets != 0)
        return Drawn(joined, weights, arrivals, budgets, piece_bytes)

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
        """What leaves client `client_id`'s rank of its upload: every stage's `leave` in order (an attacker's in place
        of its own, then clipped and noised under privacy)."""
        for stage in self.stages:
            upload = stage.leave(client_id, round_idx, upload, current)
        return upload

    def release(self, gathered: dict[str, Tensor], weights: Tensor, exchange: Exchange) -> tuple[dict[str, Tensor], Tensor, dict]:
        """The rows the method sees, {name: (K, *shape)}, their weights and the stages' metrics, from the gathered
        sends (`weights` > 0: the taken ones): every stage's `release` in order (central privacy's noised mean, a
        robust rule)."""
        rows, metrics = dict(gathered), {}
        for stage in self.stages:
            rows, weights, said = stage.release(rows, weights, exchange)
            metrics.update(said)
        return rows, weights, metrics

    @property
    def own_rows(self) -> bool:
        """Whether each row the method sees is its client's own (not under central privacy, a one-value rule, or an
        asynchronous server, whose rows are the arrivals applied to the current version)."""
        return self.reducer.own_rows and not self.noise.central and not self.server.active

    @property
    def reducer_name(self) -> str:
        if self.server.active:
            return f"server.mode {self.server.mode}"
        return "privacy.mode central" if self.noise.central else f"aggregator.rule {self.reducer.rule}"

    # -- a refresh's histograms ----------------------------------------------------------------------------------

    def histograms_arrive(self, refresh_round: int, members: Tensor) -> tuple[Tensor, Tensor | None]:
        """((K,) bool the `members` whose histograms arrive at the refresh that begins round `refresh_round`, (K,) bool
        those lost on the way or None where none can be)."""
        lost = self.clock.histograms_lost(refresh_round, len(members))
        return (members if lost is None else members & ~lost), lost

    def histograms_per_refresh(self, labeller: Labeller | None) -> int:
        """How many histograms a client sends at a refresh: under privacy those it releases (the cooperative
        estimates, the selected counts where the loss weighs classes), else the estimates and the selected counts of
        a cooperative labeller, the selected counts of another."""
        if self.privacy is not None:
            return self.privacy.releases.histograms_per_refresh
        return 2 if labeller is not None and labeller.cooperative else 1

    # -- the ledger --------------------------------------------------------------------------------------------------

    def round_record(self) -> dict | None:
        """What metrics.jsonl says of privacy after a round (None: privacy off)."""
        return None if self.privacy is None else self.privacy.round_record()

    def record(self, joined: Tensor, refreshed: bool) -> None:
        """A round's releases into privacy's ledger (nothing without privacy)."""
        if self.privacy is not None:
            self.privacy.record(joined, refreshed)

    def stop_before(self, round_idx: int, rounds: int, refreshes: bool) -> str | None:
        """The line that stops the run before round `round_idx` (from 0; `refreshes`: it begins with a refresh) because
        its releases would take epsilon past privacy.target_epsilon (None: it goes on)."""
        return None if self.privacy is None else self.privacy.stop_before(round_idx, rounds, refreshes)

    def summary(self, rounds: list[dict]) -> dict:
        """summary.json's entries of the stages: "privacy" (privacy on) and "system" (the clock, the adversary, the
        server or the reducer on: the attackers, and over the run's rounds, its metrics.jsonl lines, how many uploads were
        asked for, lost, late and taken, the rounds that kept the global state, the virtual clock, and an asynchronous
        server's steps)."""
        total = lambda key: sum(len(r.get(key) or []) for r in rounds)  # noqa: E731
        system = {"attackers": list(self.adversary.attackers), "attack": self.adversary.attack, "aggregator": self.reducer.rule,
                  **{f"{key}_uploads": total(key) for key in ("asked", "answered", "dropped", "late", "surplus", "accepted")},
                  "kept_global_rounds": [r["round"] for r in rounds if r.get("kept_global")],
                  "virtual_seconds": rounds[-1].get("virtual_clock") if rounds else 0.0,
                  **({"server": self.server.summary(rounds)} if self.server.active else {})}
        return {**({} if self.privacy is None else {"privacy": self.privacy.summary()}), **({"system": system} if self.system else {})}

    def state_dict(self) -> dict:
        """global.pt's entries of the stages: privacy's ledger, clip and secret seed (privacy on)."""
        return {} if self.privacy is None else {"privacy": self.privacy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])


def check(stages: Stages, method: Method, labeller: Labeller | None, num_clients: int, join_rate: float) -> None:
    """Every refusal of a run's stages, before anything is loaded: each stage's own (its settings alone, with the
    federation's `num_clients` training clients and its join rate), then what their composition cannot hold, each a
    ConfigError in one line with its reason. Privacy's own settings are checked by fedur/privacy/releases.py::build."""
    stages.clock.check(num_clients, join_rate)
    stages.adversary.count(num_clients)
    stages.server.check(num_clients, join_rate)
    for refusal in composition(stages, method, labeller):
        raise ConfigError(refusal)


def composition(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """What the stages, the method and its labeller cannot do together, each as the line that refuses it (the first is
    raised): every stage's `refusals`, in ORDER."""
    return [line for stage in ORDER for line in stage.refusals(stages, method, labeller)]


def build(stages: Stages, privacy: Privacy | None, num_clients: int, seed: int, batch_size: int, local_epochs: int,
          join_rate: float = 1.0) -> Channel:
    """The run's Channel for `num_clients` training clients (checked: `check`): every stage of ORDER from its settings;
    `privacy`: the run's mechanism and ledger (fedur/privacy/releases.py::build; None: off)."""
    building = Building(stages, num_clients, seed, batch_size, local_epochs, privacy, join_rate)
    return Channel(tuple(stage.build(getattr(stages, stage.GROUP, None), building) for stage in ORDER))


