"""The server stage: when the server steps and how it weighs what arrives (the `server:` settings;
docs/asynchronous.md). Synchronous rounds by default (the stage passes everything on); or asynchronous steps on the
virtual clock: FedBuff (Nguyen et al. 2022) applies the staleness-weighted mean change of every `buffer` arrivals
with a server learning rate, FedAsync (Xie et al. 2019) mixes each arrival in alone.

On a client's rank (`leave`, after the adversary) a FedBuff upload becomes its change from the version it downloaded;
at the server (`release`, before the reducer) each arrival's row becomes that change applied to the current version,
x + lr s(tau) delta_k (FedAsync: x + alpha s(tau) (x_k - x)), so that the method's mean of the rows is the new version:
x + lr sum_k w_k s(tau_k) delta_k / sum_k w_k, w_k the method's weight of the client (FedBuff's 1/K where the method
weighs its clients alike). Messages pass as they are. The events (who trains from which version, who arrives when)
are fedur/federated/asynchronous.py's; the step loop is fedur/train/asynchronous.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.channel.stage import Building, Exchange, Stage, Stages, wanted
from fedur.errors import ConfigError
from fedur.federated import asynchronous
from fedur.methods.base import ServerSide
from fedur.ranges import Fraction

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method

GROUP = "server"
ASYNCHRONOUS = ("fedbuff", "fedasync")
NAMES = {"fedbuff": "FedBuff", "fedasync": "FedAsync"}


@dataclass
class ServerConfig:
    """When the server steps (docs/asynchronous.md): after every round (sync, the default), or as updates arrive on
    the virtual clock (the clock's speeds and bandwidths), each arrival weighed by its staleness."""

    mode: Literal["sync", "fedbuff", "fedasync"] = "sync"
    """sync: rounds, the server waiting for the asked clients (or the clock's deadline). fedbuff: at most
    server.concurrency clients train at once, each from the global version it downloaded; every server.buffer
    arrivals the server applies the mean of their changes, each weighed by its staleness, with server.server_lr
    (FedBuff). fedasync: every arrival is mixed in alone, x <- (1 - a) x + a x_k, a = server.mixing x s(staleness)
    (FedAsync)."""
    concurrency: PositiveInt | None = None
    """Clients training at once (an asynchronous server); null: as many as a round asks, ceil(federation.join_rate x N)."""
    buffer: PositiveInt | None = None
    """fedbuff: arrivals per server step (FedBuff's K), at most server.concurrency (an arrival waits for the step before
    it starts again); null: half the concurrency, rounded up."""
    server_lr: PositiveFloat = 1.0
    """fedbuff: the server learning rate on the buffered mean change (FedBuff's eta_g)."""
    mixing: Fraction = 0.6
    """fedasync: alpha, the weight of an arrival of staleness 0 in x <- (1 - a) x + a x_k."""
    staleness: Literal["constant", "polynomial", "hinge"] = "polynomial"
    """How an arrival's weight s falls with its staleness tau (the versions its base is behind the one it is applied
    to): constant 1; polynomial (1 + tau)^-a (server.exponent: FedBuff's 1 / sqrt(1 + tau) at 0.5); hinge 1 for
    tau <= b, else 1 / (a (tau - b) + 1) (server.hinge_a, server.hinge_b; Xie et al.)."""
    exponent: NonNegativeFloat = 0.5
    """staleness polynomial: a."""
    hinge_a: PositiveFloat = 10.0
    """staleness hinge: a, the slope past b."""
    hinge_b: NonNegativeInt = 4
    """staleness hinge: b, the staleness weighed fully."""
    steps: PositiveInt | None = None
    """An asynchronous run's server steps; null: as many client updates as federation.rounds rounds take,
    ceil(rounds x concurrency / buffer) (FedAsync's buffer: 1)."""
    evaluate_every: PositiveFloat = 1
    """An asynchronous run evaluates every this many server steps (a whole number), or virtual seconds
    (server.evaluate_unit); the last step always."""
    evaluate_unit: Literal["steps", "seconds"] = "steps"
    """server.evaluate_every in server steps, or in virtual seconds (the first step at or past each multiple)."""

    def check(self, num_clients: int, join_rate: float) -> None:
        """The refusals of these settings alone (with the federation's `num_clients` training clients and its join
        rate), each a ConfigError in one line."""
        if self.mode == "sync":
            changed = [f"server.{f.name}" for f in fields(self) if f.name != "mode" and getattr(self, f.name) != f.default]
            if changed:
                raise ConfigError(f"{', '.join(changed)}: an asynchronous server's settings, which server.mode=sync does not "
                                  "read; set server.mode fedbuff or fedasync, or remove them")
            return
        concurrency = self.concurrency_of(num_clients, join_rate)
        if concurrency > num_clients:
            raise ConfigError(f"server.concurrency={concurrency} is more than the {num_clients} training clients; at most "
                              f"{num_clients} can train at once")
        if self.mode == "fedasync":
            for name, default in (("buffer", None), ("server_lr", 1.0)):
                if getattr(self, name) != default:
                    raise ConfigError(f"server.{name} is FedBuff's: FedAsync mixes each arrival in alone (server.mixing); "
                                      f"remove it, or use server.mode fedbuff")
        elif self.mixing != 0.6:
            raise ConfigError("server.mixing is FedAsync's: FedBuff steps with server.server_lr; remove it, or use "
                              "server.mode fedasync")
        if self.mode == "fedbuff" and self.buffer_of(concurrency) > concurrency:
            raise ConfigError(f"server.buffer={self.buffer} is more than server.concurrency={concurrency}: the arrivals "
                              "wait for the server's step before they start again, so no more than the concurrency can "
                              "fill a buffer; a buffer of at most the clients training at once")
        if self.evaluate_unit == "steps" and self.evaluate_every != int(self.evaluate_every):
            raise ConfigError(f"server.evaluate_every={self.evaluate_every:g} steps: a whole number of steps (or "
                              "server.evaluate_unit seconds)")

    def concurrency_of(self, num_clients: int, join_rate: float) -> int:
        """The clients training at once: server.concurrency, or as many as a round asks."""
        return self.concurrency if self.concurrency is not None else wanted(join_rate, num_clients)

    def run_steps(self, rounds: int, num_clients: int, join_rate: float) -> int:
        """The run's units of `rounds` synchronous rounds (`Server.run_steps`), before the stage is built."""
        return build(self, Building(None, num_clients, 0, 1, 1, None, join_rate)).run_steps(rounds)

    def buffer_of(self, concurrency: int) -> int:
        """The arrivals per step: FedAsync's 1, server.buffer, or half the concurrency rounded up."""
        if self.mode == "fedasync":
            return 1
        return self.buffer if self.buffer is not None else (concurrency + 1) // 2


CONFIG = ServerConfig


def refusals(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """An asynchronous server runs a method whose shared pieces are averaged (its aggregate the mean, or one that says
    what it does with stale arrivals: Method.stale_inputs), without privacy (its accounting prices rounds), a robust
    rule (not stated over a step's few stale arrivals) or the clock's waiting rules of a round."""
    mode = stages.server.mode
    if mode == "sync":
        return []
    out, name, what = [], type(method).__name__, f"server.mode={mode}"
    said = method_refusal(method)
    if said:
        out.append(f"{what}: {name} {said}")
    if stages.privacy_mode != "none":
        out.append(f"privacy.mode={stages.privacy_mode} with {what}: privacy's accounting prices a round's sample of "
                   "clients, not an asynchronous server's steps of stale arrivals; use server.mode sync")
    if stages.aggregator.rule != "mean":
        out.append(f"aggregator.rule={stages.aggregator.rule} with {what}: a robust rule over a step's few stale arrivals "
                   "is not stated here; use aggregator.rule mean, or server.mode sync")
    clock = stages.clock
    rounds = [key for key, on in (("clock.drop_rate", clock.drop_rate > 0), ("clock.deadline", clock.deadline is not None),
                                  ("clock.over_select", clock.over_select > 0), ("clock.min_uploads", clock.min_uploads > 1))
              if on]
    if rounds:
        out.append(f"{', '.join(rounds)} with {what}: a synchronous round's (who arrives by its deadline, whose upload is "
                   "lost, how many it waits for); an asynchronous server steps as updates arrive, and a late one counts "
                   "stale; keep clock.speeds and clock.bandwidth, or use server.mode sync")
    return out


def method_refusal(method: Method) -> str | None:
    """Why `method` cannot run under an asynchronous server (None: it can), in words that follow its name."""
    if not method.trains:
        return ("trains nothing: its clients take no time on the virtual clock, so an asynchronous server has nothing to "
                "wait for; use server.mode sync")
    if method.asynchronous_refusal:
        return method.asynchronous_refusal
    if method.reads_rows == "own":
        return ("keeps each client's own upload (its aggregate reads ServerRound.rows), and an asynchronous step's rows "
                "are the arrivals applied to the current version; use server.mode sync")
    if type(method).aggregate is not ServerSide.aggregate and method.stale_inputs is None:
        return ("has an aggregate of its own and does not say what it does with an asynchronous step's stale arrivals; a "
                "method that can declares Method.stale_inputs (fedur/methods/base.py)")
    return None


@dataclass(frozen=True)
class Server(Stage):
    """The run's server (plain values, fixed for the run; every rank the same)."""

    mode: str = "sync"
    concurrency: int = 1
    buffer: int = 1
    server_lr: float = 1.0
    mixing: float = 0.6
    staleness: str = "polynomial"
    exponent: float = 0.5
    hinge_a: float = 10.0
    hinge_b: int = 4
    steps: int | None = None  # server.steps (None: from the rounds)
    evaluate_every: float = 1
    evaluate_unit: str = "steps"

    @property
    def active(self) -> bool:
        return self.mode != "sync"

    @property
    def synchronous(self) -> bool:
        return self.mode == "sync"

    def describe(self) -> list[str]:
        if not self.active:
            return []
        weighing = {"constant": "constant", "polynomial": f"(1 + s)^-{self.exponent:g}",
                    "hinge": f"hinge a {self.hinge_a:g} b {self.hinge_b}"}[self.staleness]
        step = f"a step every {self.buffer} arrival(s), server lr {self.server_lr:g}" if self.mode == "fedbuff" else \
            f"each arrival mixed in at {self.mixing:g} x s"
        return [f"{NAMES[self.mode]}: {self.concurrency} training at once, {step}, staleness weight {weighing}"]

    def run_steps(self, rounds: int) -> int:
        """The run's units: `rounds` (a synchronous run's rounds), or its server steps (server.steps, or as many client
        updates as those rounds take at the concurrency)."""
        if self.synchronous:
            return rounds
        return self.steps if self.steps is not None else asynchronous.steps(rounds, self.concurrency, self.buffer)

    def summary(self, rows: list[dict]) -> dict:
        """summary.json's system.server of an asynchronous run's metrics.jsonl lines: its steps, arrivals and their
        staleness."""
        stale = [tau for row in rows for tau in row.get("staleness") or []]
        return {"mode": self.mode, "concurrency": self.concurrency, "buffer": self.buffer, "steps": len(rows),
                "arrivals": len(stale), "staleness_mean": sum(stale) / len(stale) if stale else None,
                "staleness_max": max(stale, default=None)}

    def factor(self, tau: int) -> float:
        """An arrival's step size at staleness `tau`: server_lr x s(tau) (FedBuff) or mixing x s(tau) (FedAsync)."""
        size = self.server_lr if self.mode == "fedbuff" else self.mixing
        return size * asynchronous.weight(tau, self.staleness, self.exponent, self.hinge_a, self.hinge_b)

    def leave(self, client_id: int, round_idx: int, upload: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
        """FedBuff: the client sends the change of its shared pieces from what it downloaded (`current`); messages as
        they are."""
        if self.mode != "fedbuff":
            return upload
        return {name: upload[name] - current[name] if name in current else value for name, value in upload.items()}

    def release(self, rows: dict[str, Tensor], weights: Tensor, exchange: Exchange) -> tuple[dict[str, Tensor], Tensor, dict]:
        """Each taken row of a shared piece as its arrival applied to the current version x: x + factor_k delta_k
        (FedBuff) or x + factor_k (x_k - x) (FedAsync), factor_k the arrival's step size at its staleness."""
        if not self.active or exchange.staleness is None:
            return rows, weights, {}
        taken = weights > 0
        factors = torch.tensor([self.factor(int(t)) if bool(on) else 0.0 for t, on in zip(exchange.staleness, taken)],
                               dtype=torch.float64, device="cpu")  # (K,)
        out = dict(rows)
        for name, current in exchange.current.items():
            row = rows[name]  # (K, *shape)
            shape = (-1,) + (1,) * current.dim()
            change = row if self.mode == "fedbuff" else row - current
            moved = current + factors.to(row.dtype).view(shape) * change
            out[name] = torch.where(taken.view(shape), moved, row)
        return out, weights, {}


def build(cfg: ServerConfig, building: Building) -> Server:
    """The run's Server from its settings (checked: ServerConfig.check)."""
    concurrency = cfg.concurrency_of(building.num_clients, building.join_rate)
    return Server(mode=cfg.mode, concurrency=concurrency, buffer=cfg.buffer_of(concurrency), server_lr=cfg.server_lr,
                  mixing=cfg.mixing, staleness=cfg.staleness, exponent=cfg.exponent, hinge_a=cfg.hinge_a,
                  hinge_b=cfg.hinge_b, steps=cfg.steps, evaluate_every=cfg.evaluate_every,
                  evaluate_unit=cfg.evaluate_unit)
