"""The server, on every rank: its state between rounds, and the exchange of a round (each client's upload,
gathered in client-id order; the method's aggregate; every client's download). There is no server process:
every rank computes the same aggregate from the same gathered uploads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.channel.stage import Exchange
from fedur.errors import PluginError
from fedur.federated.client import check_tensors
from fedur.methods.base import Aggregated, LocalRound, Method, ServerRound, shared_names

if TYPE_CHECKING:
    from fedur.channel import Channel, Drawn
    from fedur.model.classifier import PromptedCLIP
    from fedur.train.host import Host


@dataclass
class ServerState:
    """What the server holds between rounds, the same on every rank: the global pieces and the method's own state."""

    shared: dict[str, Tensor]  # the global value of each shared piece (its declared initial value, then Method.aggregate)
    messages: dict[str, Tensor] = field(default_factory=dict)  # Method.messages: the shape of each, not checkpointed
    method: dict[str, Tensor] = field(default_factory=dict)  # the method's own server state (Method.aggregate)

    @classmethod
    def start(cls, method: Method, model: PromptedCLIP, start: dict[str, Tensor]) -> ServerState:
        """Before the first round: every shared piece at its declared initial value (`start`, on the CPU)."""
        shared = {name: start[name] for name in shared_names(method)}
        return cls(shared, {name: t.cpu() for name, t in method.messages(model, start).items()})  # uploads gather on CPU

    def upload_bytes(self) -> dict[str, int]:
        """{name: bytes} one client sends in a round it takes part in: each shared piece and each message."""
        return {name: t.numel() * t.element_size() for name, t in {**self.shared, **self.messages}.items()}


def exchange(host: Host, server: ServerState, channel: Channel, drawn: Drawn, local: dict[int, LocalRound],
             round_of: tuple[int, int]) -> dict:
    """The round's exchange, the one path whatever is on (fedur/channel/): the clients whose upload the server takes
    (Channel.taken) upload (Method.upload; `local`: their training this round; one that trained nothing sends its
    pieces as downloaded and zero messages), each send leaves its rank through the channel (an attacker's in place of
    its own, clipped and noised under privacy), every rank gathers the sends of each shared piece and message in
    client-id order (or, for those in Method.summed, their sum, in client-id order and in chunks of clients), the
    channel releases the rows the method aggregates into the new global pieces, its server state and the round's
    metrics (returned), and every client, also one that sat the round out, downloads them. A round with fewer uploads
    than clock.min_uploads keeps the global state. Every rank calls this. `round_of`: (the round from 1, rounds)."""
    method, data = host.method, host.client_data
    (number, rounds), expected = round_of, {**server.shared, **server.messages}
    if channel.kept_global(drawn.arrivals):
        return keep_global(host, server)
    weights = channel.taken(drawn.weights, drawn.joined, drawn.arrivals)
    sends = {}
    for client in (c for c in host.clients if weights[c.client_id] > 0):
        k = client.client_id
        upload = method.upload(client, data, local.get(k)) if k in local or not method.trains else \
            {name: server.shared[name] if name in server.shared else torch.zeros_like(like) for name, like in expected.items()}
        if set(upload) != set(expected):
            raise PluginError(f"{type(method).__name__}.upload of client {k} sent {sorted(upload)}; it must send one "
                              f"tensor per shared piece and message: {sorted(expected)}")
        check_tensors(client.extra, f"{type(method).__name__}.upload's client.extra")
        downloaded = {name: local[k].start[name] for name in server.shared} if k in local else server.shared  # its base
        sends[k] = channel.leave(k, number - 1, upload, downloaded)
    gathered = {}  # {name: (K, *shape)}, or the (*shape) sum over the taken clients for method.summed
    for name, like in channel.wire(expected).items():
        pieces, what = {k: send[name] for k, send in sends.items()}, f"{name} uploads"
        if name in method.summed:
            gathered[name] = host.collectives.sum_clients(pieces, host.num_clients, like, weights > 0, what)
        else:
            gathered[name] = host.gather(pieces, like=like, what=what)
    exchanged = Exchange(dict(server.shared), expected, int(drawn.joined.sum()), number - 1, drawn.staleness)
    rows, weights, metrics = channel.release(gathered, weights, exchanged)
    released = ServerRound(number, rounds, rows, weights, dict(server.shared), dict(server.method), host.training,
                           own_rows=channel.own_rows, rows_readable=channel.own_rows or method.reads_rows == "released",
                           reducer=channel.reducer_name, summed=tuple(method.summed))
    return {**aggregate(host, server, released, drawn.holding), **metrics}


def aggregate(host: Host, server: ServerState, released: ServerRound, holding: Tensor | None = None) -> dict:
    """The method's aggregate of what a round released; the new global pieces and server state; every client's
    download (but those `holding` an older version while they train: an asynchronous server's); the round's metrics."""
    method = host.method
    result = method.aggregate(released)
    if not isinstance(result, Aggregated):
        raise PluginError(f"{type(method).__name__}.aggregate must return fedur.methods.Aggregated(shared, state, metrics), "
                        f"not {type(result).__name__}")
    if set(result.shared) != set(server.shared):
        raise PluginError(f"{type(method).__name__}.aggregate returned pieces {sorted(result.shared)}; the shared pieces "
                         f"are {sorted(server.shared)}")
    server.shared = dict(result.shared)
    if result.state is not None:
        check_tensors(result.state, f"{type(method).__name__}.aggregate's server state")
        server.method = dict(result.state)
    for client in host.clients:
        if holding is None or not bool(holding[client.client_id]):
            method.download(client, server.shared, server.method)
            check_tensors(client.extra, f"{type(method).__name__}.download's client.extra")
    return metric_values(result.metrics, type(method).__name__)


def keep_global(host: Host, server: ServerState) -> dict:
    """A round that aggregates nothing (fewer uploads than clock.min_uploads): the global pieces and the server's state
    stay, and every client downloads them again."""
    for client in host.clients:
        host.method.download(client, server.shared, server.method)
    return {}


def metric_values(metrics: dict, who: str) -> dict[str, float]:
    """A method's round metrics as plain numbers (a 0-dim tensor is read once, here)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise PluginError(f"{who}.aggregate's metric {name!r} must be one number, not a tensor of shape {tuple(value.shape)}")
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise PluginError(f"{who}.aggregate's metric {name!r} must be a number, not {type(value).__name__}")
        out[str(name)] = float(value)
    return out
