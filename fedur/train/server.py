"""The server, on every rank: its state between rounds, and the exchange of a round (each client's upload,
gathered in client-id order; the method's aggregate; every client's download). There is no server process:
every rank computes the same aggregate from the same gathered uploads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.errors import PluginError
from fedur.federated.client import check_tensors
from fedur.methods.base import Aggregated, LocalRound, Method, ServerRound, shared_names

if TYPE_CHECKING:
    from fedur.model.classifier import PromptedCLIP
    from fedur.privacy import Privacy
    from fedur.train.host import Host
    from fedur.train.uploads import UploadRules


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


def exchange(host: Host, server: ServerState, weights: Tensor, local: dict[int, LocalRound], round_of: tuple[int, int],
             privacy: Privacy | None = None, drawn: int = 0, rules: UploadRules | None = None) -> dict:
    """The clients with weight > 0 upload (Method.upload; `local`: their training this round), every rank gathers
    the uploads of each shared piece and message in client-id order (or, for those in Method.summed, their sum, in
    client-id order and in chunks of clients), the method aggregates them into the new global pieces, its server
    state and the round's metrics (returned), and every client, also one that sat the round out, downloads them.
    Every rank calls this. `round_of`: (the round from 1, rounds). With `privacy`, what leaves a client's rank is its
    clipped (local: and noised) update, and the method aggregates the private rows (fedur/privacy/releases.py;
    `drawn`: the clients drawn to take part). `rules` (fedur/train/uploads.py): what an attacker sends in place of its
    upload, and the aggregator's rows (federation.aggregator; a method's summed uploads pass as they are)."""
    method, data = host.method, host.client_data
    (number, rounds), expected = round_of, {**server.shared, **server.messages}
    local_uploads = {}
    trained = lambda c: privacy is None or c.client_id in local or not method.trains  # noqa: E731
    for client in (c for c in host.clients if weights[c.client_id] > 0 and trained(c)):  # (privacy: a drawn client
        # that trained nothing sends a zero update, private_exchange)
        upload = method.upload(client, data, local.get(client.client_id))
        if set(upload) != set(expected):
            raise PluginError(f"{type(method).__name__}.upload of client {client.client_id} sent {sorted(upload)}; it must "
                             f"send one tensor per shared piece and message: {sorted(expected)}")
        check_tensors(client.extra, f"{type(method).__name__}.upload's client.extra")
        local_uploads[client.client_id] = upload if rules is None else rules.poison(client.client_id, number - 1, upload, server.shared)
    if privacy is not None:
        return private_exchange(host, server, weights, local_uploads, expected, round_of, privacy, drawn)
    uploads = {}  # {name: (K, *shape)}, or the (*shape) sum over the clients that took part for method.summed
    for name, like in expected.items():
        pieces, what = {k: upload[name] for k, upload in local_uploads.items()}, f"{name} uploads"
        if name in method.summed:
            uploads[name] = host.collectives.sum_clients(pieces, host.num_clients, like, weights > 0, what)
        else:
            uploads[name] = host.gather(pieces, like=like, what=what)
    robust = {}
    if rules is not None and rules.aggregator != "mean":
        current = {name: server.shared[name] for name in server.shared if name not in method.summed}
        uploads, weights, robust = rules.robust(uploads, weights, current)
    metrics = aggregate(host, server, uploads, weights, number, rounds)
    return {**metrics, **{f"{rules.aggregator}/{k}": v for k, v in robust.items()}}


def private_exchange(host: Host, server: ServerState, weights: Tensor, local_uploads: dict[int, dict[str, Tensor]],
                     expected: dict[str, Tensor], round_of: tuple[int, int], privacy: Privacy, drawn: int) -> dict:
    """`exchange` with privacy on: every drawn client's (weight > 0) update clipped (and noised, local) on its rank, a
    zero update where it trained nothing (no pseudo-labels), gathered as float64 with whether its norm was within the
    clip (adaptive clipping's count); then the rows the method aggregates. `round_of`: (the round from 1, rounds)."""
    number, rounds = round_of
    updates, within = {}, {}
    for client in (c for c in host.clients if weights[c.client_id] > 0):
        k = client.client_id
        upload = local_uploads.get(k) or {  # none: its pieces as downloaded, its messages zero (an update of zeros)
            name: server.shared[name] if name in server.shared else torch.zeros_like(like) for name, like in expected.items()}
        updates[k], inside = privacy.client_update(upload, server.shared, k, number - 1)
        within[k] = torch.tensor(int(inside), device="cpu")
    gathered = {name: host.gather({k: u[name] for k, u in updates.items()}, like=like.double(), what=f"{name} updates")
                for name, like in expected.items()}
    inside = host.gather(within, like=torch.tensor(0, device="cpu"), what="updates within the clip").bool() if privacy.adaptive else None
    uploads = privacy.server_uploads(gathered, server.shared, expected, weights > 0, drawn, inside, number - 1)
    return aggregate(host, server, uploads, weights, number, rounds)


def aggregate(host: Host, server: ServerState, uploads: dict[str, Tensor], weights: Tensor, number: int, rounds: int) -> dict:
    """The method's aggregate of a round's gathered uploads; the new global pieces and server state; every client's
    download; the round's metrics."""
    method = host.method
    result = method.aggregate(ServerRound(number, rounds, uploads, weights, dict(server.shared), dict(server.method),
                                          host.training))
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
        method.download(client, server.shared, server.method)
        check_tensors(client.extra, f"{type(method).__name__}.download's client.extra")
    return metric_values(result.metrics, type(method).__name__)


def keep_global(host: Host, server: ServerState) -> dict:
    """A round that aggregates nothing (fewer uploads than federation.min_uploads): the global pieces and the server's
    state stay, and every client downloads them again."""
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
