"""SCAFFOLD (Karimireddy et al., ICML 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", Algorithm 1) on FedUR's pieces: a control variate c on the server and c_k on each client, one per
shared piece; every local step's gradient of a shared piece is corrected by c - c_k, so that a client's
update drifts less towards its own data.

Per round, client k starts from the global x and takes K steps y <- y - lr (g(y) - c_k + c); then (option II)
c_k+ = c_k - c + (x - y) / (K lr), and it sends y and dc_k = c_k+ - c_k. The server averages the y's
(uniformly over the sampled clients, as Algorithm 1: `--method.weighting uniform`, SCAFFOLD's default),
x <- x + server_lr (average - x), and c <- c + (1/N) sum_k dc_k over the clients that took part, N the
federation's clients (the new clients of evaluation.new_clients, held out of every round, are not among them).

Exact with plain SGD (optim.momentum 0, optim.weight_decay 0, optim.schedule constant: the demo preset,
configs/presets/demo/scaffold.yaml). With momentum, weight decay or the cosine schedule the correction is
added to the gradient before SGD applies them, and "K lr" is read as the sum of the learning rates of the
client's steps in the round [guess: the paper assumes plain SGD at one learning rate]. The text context stays
personal and uncorrected, as in FedUR. A new client that adapts alone after the last round
(evaluation.new_clients) holds c and c_k = 0, as Algorithm 1's client at its first participation, and corrects
its steps by c (`--method.new_clients control`) [guess: the paper has no client that adapts without sending
anything back]; `none`: it adapts with plain local steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.methods.base import Aggregated, ClientData, LocalRound, LocalStep, ServerRound, shared_names
from fedur.methods.fedur import FedUR

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

MEMBERS = "federation"  # the server state's (K,) bool: the federation's clients (the others: new clients)


class SCAFFOLD(FedUR):
    """SCAFFOLD: FedUR whose clients correct each step's gradient of a shared piece by control variates."""

    key = "scaffold"
    added_settings = {**FedUR.added_settings, "new_clients": "control"}
    asynchronous_refusal = ("corrects each client's steps by the server's control variate c of its round, and a stale "
                            "arrival's correction and its c delta were made against an older c: Algorithm 1 (Karimireddy et "
                            "al. 2020) defines no asynchronous update of c; use server.mode sync")

    def __init__(self, server_lr: float = 1.0, new_clients: Literal["control", "none"] = "control",
                 weighting: Literal["selected", "data", "uniform"] = "uniform", **kwargs) -> None:
        """
        Args:
            server_lr: The server's step along the averaged update (1: the average itself).
            new_clients: What a new client (evaluation.new_clients) that adapts alone after the last round corrects
                its steps by: c - c_k with its c_k = 0, as Algorithm 1's client at its first participation ('control'),
                or nothing ('none': plain local steps) [guess].
            weighting: The server's weight of each client in the average of the y's: the same for every client
                ('uniform', Algorithm 1's mean over the sampled clients), its selected pseudo-labels ('selected', FedUR's)
                or its train images ('data').
        """
        super().__init__(weighting=weighting, **kwargs)  # share: FedUR's
        self.server_lr, self.new_clients = float(server_lr), new_clients

    def messages(self, model: PromptedCLIP, start: dict[str, Tensor]) -> dict[str, Tensor]:
        return {f"dc_{name}": torch.zeros_like(start[name]) for name in shared_names(self)}

    def before_step(self, step: LocalStep) -> None:
        extra = step.client.extra  # on the step's device
        for name in shared_names(self):
            if name in step.trained and f"c_{name}" in extra:  # no correction before the first aggregation (c = c_k = 0)
                step.pieces[name].grad.add_(extra[f"c_{name}"] - extra[f"c_local_{name}"])

    def upload(self, client: ClientState, data: ClientData, local: LocalRound | None) -> dict[str, Tensor]:
        out = super().upload(client, data, local)  # y: the shared pieces after the local steps
        extra = dict(client.extra)
        for name in shared_names(self):
            start = local.start[name]
            control = extra.get(f"c_{name}", torch.zeros_like(start))
            own = extra.get(f"c_local_{name}", torch.zeros_like(start))
            updated = own - control + (start - client.pieces[name]) / local.lr_sum if local.steps else own  # option II
            out[f"dc_{name}"] = updated - own
            extra[f"c_local_{name}"] = updated
        client.extra = extra  # c_k, the client's own, checkpointed with it
        return out

    def aggregate(self, round: ServerRound) -> Aggregated:
        average = super().aggregate(round).shared  # the weighted average of the y's
        shared, state, metrics = {}, dict(round.state), {}
        for name, current in round.current.items():
            shared[name] = current + self.server_lr * (average[name] - current)
            control = state.get(f"c_{name}", torch.zeros_like(current))
            state[f"c_{name}"] = control + round.total(f"dc_{name}") / round.federation  # rows: 0 for absentees
            metrics[f"control_norm_{name}"] = float(state[f"c_{name}"].norm())
        if round.training is not None:
            state[MEMBERS] = round.training.clone()
        return Aggregated(shared, state, metrics)

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        super().download(client, shared, state)
        members = state.get(MEMBERS)
        if self.new_clients == "none" and members is not None and not bool(members[client.client_id]):
            return  # a new client: no control variates, so its adaptation takes plain steps
        controls = {f"c_{name}": state[f"c_{name}"] for name in shared_names(self) if f"c_{name}" in state}
        if controls:
            own = {f"c_local_{name}": client.extra.get(f"c_local_{name}", torch.zeros_like(state[f"c_{name}"]))
                   for name in shared_names(self) if f"c_{name}" in state}
            client.extra = {**client.extra, **own, **controls}
