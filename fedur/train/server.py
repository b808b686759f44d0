"""The server, on every rank: its state between rounds, and the exchange of a round (each client's upload,
gathered in client-id order; the method's aggregate; every client's download). There is no server process:
every rank computes the same aggregate from the same gathered uploads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from fedur.federated.client import check_tensors, momentum_only, to_cpu
from fedur.train.refresh import Refresh

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class ServerState:
    """What every rank knows between rounds, for all clients; checkpointed as global.pt."""

    shared: dict[str, Tensor]  # the global value of each shared piece (Method.init_shared / aggregate)
    refresh: Refresh | None = None  # the last pseudo-label refresh (None before the first, or without a labeller)
    carried_optimizer: dict | None = None  # optim.optimizer_state=shared: the momentum handed to the next client
    wall_seconds: float = 0.0  # over every session of the run, up to the last commit
    method: dict[str, Tensor] = field(default_factory=dict)  # the method's own server state (Method.aggregate)

    def state_dict(self) -> dict:
        return {
            "shared": {name: t.cpu() for name, t in self.shared.items()},
            "refresh": None if self.refresh is None else vars(self.refresh),
            "carried_optimizer": to_cpu(self.carried_optimizer),
            "wall_seconds": self.wall_seconds,
            "method": {name: t.cpu() for name, t in self.method.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.shared = {**self.shared, **state["shared"]}
        self.refresh = None if state["refresh"] is None else Refresh(**state["refresh"])
        self.carried_optimizer = momentum_only(state["carried_optimizer"])
        self.wall_seconds = state["wall_seconds"]
        self.method = dict(state.get("method", {}))  # checkpoints before fedur 0.3 have none

    def upload_bytes(self) -> int:
        """Bytes one client sends in a round it takes part in: one of each shared piece."""
        return sum(t.numel() * t.element_size() for t in self.shared.values())


def exchange(rank: Rank, server: ServerState, weights: Tensor) -> None:
    """The clients with weight > 0 upload (Method.upload), every rank gathers the uploads in client-id order (or,
    for the pieces in Method.summed, their sum, in client-id order and in chunks of clients), the method
    aggregates them into the new global pieces (and its server state), and every client, also one that sat the
    round out, downloads them. Every rank calls this."""
    method = rank.method
    local = {c.client_id: method.upload(c, rank) for c in rank.clients if weights[c.client_id] > 0}
    uploads = {}  # {name: (K, *shape)}, or the (*shape) sum over the clients that took part for method.summed
    for name, current in server.shared.items():
        pieces, what = {k: upload[name] for k, upload in local.items()}, f"{name} uploads"
        if name in method.summed:
            uploads[name] = rank.collectives.sum_clients(pieces, rank.num_clients, current, weights > 0, what)
        else:
            uploads[name] = rank.gather(pieces, like=current, what=what)
    server.shared = method.aggregate(uploads, weights, server.shared, server.method)
    check_tensors(server.method, f"{type(method).__name__}.aggregate's server state")
    for client in rank.clients:
        method.download(client, server.shared, server.method)
        check_tensors(client.extra, f"{type(method).__name__}.download's client.extra")

