"""The server, on every rank: its state between rounds, and the exchange of a round (each client's upload,
gathered in client-id order; the method's aggregate; every client's download). There is no server process:
every rank computes the same aggregate from the same gathered uploads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from fedur.federated.client import check_tensors, momentum_only, to_cpu
from fedur.methods.base import Aggregated, LocalRound, ServerRound
from fedur.train.refresh import Refresh

if TYPE_CHECKING:
    from fedur.train.rank import Rank


@dataclass
class ServerState:
    """What every rank knows between rounds, for all clients; checkpointed as global.pt."""

    shared: dict[str, Tensor]  # the global value of each shared piece (its declared initial value, then Method.aggregate)
    messages: dict[str, Tensor] = field(default_factory=dict)  # Method.messages: the shape of each, not checkpointed
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
        self.shared = {**self.shared, **{name: t for name, t in state["shared"].items() if name in self.shared}}
        self.refresh = None if state["refresh"] is None else Refresh(**state["refresh"])
        self.carried_optimizer = momentum_only(state["carried_optimizer"])
        self.wall_seconds = state["wall_seconds"]
        self.method = dict(state.get("method", {}))  # checkpoints before fedur 0.3 have none

    def upload_bytes(self) -> dict[str, int]:
        """{name: bytes} one client sends in a round it takes part in: each shared piece and each message."""
        return {name: t.numel() * t.element_size() for name, t in {**self.shared, **self.messages}.items()}


def exchange(rank: Rank, server: ServerState, weights: Tensor, local: dict[int, LocalRound], number: int, rounds: int) -> dict:
    """The clients with weight > 0 upload (Method.upload; `local`: their training this round), every rank gathers
    the uploads of each shared piece and message in client-id order (or, for those in Method.summed, their sum, in
    client-id order and in chunks of clients), the method aggregates them into the new global pieces, its server
    state and the round's metrics (returned), and every client, also one that sat the round out, downloads them.
    Every rank calls this. `number`: the round, from 1, of `rounds`."""
    method = rank.method
    expected = {**server.shared, **server.messages}
    local_uploads = {}
    for client in (c for c in rank.clients if weights[c.client_id] > 0):
        upload = local_uploads[client.client_id] = method.upload(client, rank, local.get(client.client_id))
        if set(upload) != set(expected):
            raise ValueError(f"{type(method).__name__}.upload of client {client.client_id} sent {sorted(upload)}; it must "
                             f"send one tensor per shared piece and message: {sorted(expected)}")
        check_tensors(client.extra, f"{type(method).__name__}.upload's client.extra")
    uploads = {}  # {name: (K, *shape)}, or the (*shape) sum over the clients that took part for method.summed
    for name, like in expected.items():
        pieces, what = {k: upload[name] for k, upload in local_uploads.items()}, f"{name} uploads"
        if name in method.summed:
            uploads[name] = rank.collectives.sum_clients(pieces, rank.num_clients, like, weights > 0, what)
        else:
            uploads[name] = rank.gather(pieces, like=like, what=what)
    result = method.aggregate(ServerRound(number, rounds, uploads, weights, dict(server.shared), dict(server.method)))
    if not isinstance(result, Aggregated):
        raise TypeError(f"{type(method).__name__}.aggregate must return fedur.methods.Aggregated(shared, state, metrics), "
                        f"not {type(result).__name__}")
    if set(result.shared) != set(server.shared):
        raise ValueError(f"{type(method).__name__}.aggregate returned pieces {sorted(result.shared)}; the shared pieces "
                         f"are {sorted(server.shared)}")
    server.shared = dict(result.shared)
    if result.state is not None:
        check_tensors(result.state, f"{type(method).__name__}.aggregate's server state")
        server.method = dict(result.state)
    for client in rank.clients:
        method.download(client, server.shared, server.method)
        check_tensors(client.extra, f"{type(method).__name__}.download's client.extra")
    return metric_values(result.metrics, type(method).__name__)


def metric_values(metrics: dict, who: str) -> dict[str, float]:
    """A method's round metrics as plain numbers (a 0-dim tensor is read once, here)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(f"{who}.aggregate's metric {name!r} must be one number, not a tensor of shape {tuple(value.shape)}")
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{who}.aggregate's metric {name!r} must be a number, not {type(value).__name__}")
        out[str(name)] = float(value)
    return out
