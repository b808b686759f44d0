"""What every rank knows between rounds, for all clients, each part by its concern: the server's (the global pieces
and the method's state, fedur/train/server.py), the pseudo-labels' last refresh (its counts and class weights,
fedur/train/refresh.py), the momentum carried from client to client (optim.optimizer_state=shared), the channel's
stages' (privacy's ledger and clip, fedur/channel/), an asynchronous server's events (who trains from which version,
when each arrives), and the run's wall and virtual clocks. A checkpoint's global.pt holds it (`state_dict`); each
client's own state is in its own file."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from fedur.channel import Channel
from fedur.federated.asynchronous import Events
from fedur.federated.client import momentum_only, to_cpu
from fedur.train.refresh import Refresh
from fedur.train.server import ServerState


@dataclass
class Flights:
    """An asynchronous server between steps (server.mode fedbuff | fedasync): its events, and what each job in flight
    trains with beside its client's own state (which nothing changes while it is in flight: it downloads and refreshes
    nothing), the class weights of its start. With the clients' files, what makes each update in flight."""

    events: Events
    class_weights: dict[int, Tensor | None] = field(default_factory=dict)  # {client in flight: (C,) or None}

    def landed(self, events: Events, clients: set[int]) -> Flights:
        """After a step: its `events`, without the class weights of the jobs of `clients`, which it applied."""
        return Flights(events, {k: w for k, w in self.class_weights.items() if k not in clients})

    def state_dict(self) -> dict:
        return {"events": self.events.state_dict(), "class_weights": {str(k): w for k, w in self.class_weights.items()}}

    @classmethod
    def from_state(cls, state: dict) -> Flights:
        return cls(Events.from_state(state["events"]), {int(k): w for k, w in state["class_weights"].items()})


@dataclass
class RunState:
    server: ServerState
    refresh: Refresh | None = None  # the last pseudo-label refresh (None before the first, or without a labeller)
    carried_optimizer: dict | None = None  # optim.optimizer_state=shared: the momentum handed to the next client
    wall_seconds: float = 0.0  # over every session of the run, up to the last commit
    channel: Channel = field(default_factory=Channel.alone)  # its stages' state (privacy: the ledger, the clip)
    virtual_seconds: float = 0.0  # the virtual clock (clock.speeds ...): the rounds' virtual durations so far
    secret_seed: int | None = None  # the seed of the run's secret noise (privacy, DP-FPL's local noise; None: none)
    flights: Flights | None = None  # an asynchronous server's events and jobs in flight (None: rounds, or before its start)

    @property
    def class_weights(self):
        """(C,) the cross-entropy's class weights until the next refresh (None: unweighted, or no refresh yet)."""
        return None if self.refresh is None else self.refresh.class_weights

    def state_dict(self) -> dict:
        """global.pt (its keys as every checkpoint format has them)."""
        return {
            "shared": {name: t.cpu() for name, t in self.server.shared.items()},
            "refresh": None if self.refresh is None else vars(self.refresh),
            "carried_optimizer": to_cpu(self.carried_optimizer),
            "wall_seconds": self.wall_seconds,
            "virtual_seconds": self.virtual_seconds,
            "method": {name: t.cpu() for name, t in self.server.method.items()},
            **self.channel.state_dict(),
            **({} if self.secret_seed is None else {"secret_seed": self.secret_seed}),
            **({} if self.flights is None else {"flights": self.flights.state_dict()}),
        }

    def load_state_dict(self, state: dict) -> None:
        server = self.server
        server.shared = {**server.shared, **{name: t for name, t in state["shared"].items() if name in server.shared}}
        server.method = dict(state.get("method", {}))  # checkpoints before fedur 0.3 have none
        self.refresh = None if state["refresh"] is None else Refresh(**state["refresh"])
        self.carried_optimizer = momentum_only(state["carried_optimizer"])
        self.wall_seconds = state["wall_seconds"]
        self.virtual_seconds = state.get("virtual_seconds", 0.0)  # checkpoints before the virtual clock: from 0
        self.channel.load_state_dict(state)
        self.flights = Flights.from_state(state["flights"]) if "flights" in state else None
        if self.secret_seed is not None:  # checkpoints from before it was kept apart: privacy's
            self.secret_seed = int(state.get("secret_seed", state.get("privacy", {}).get("seed", self.secret_seed)))
