"""Every cross-rank communication of fedur goes through here (in place of a federated server).

`gather_clients` puts each client's tensor in its row of a (num_clients, ...) tensor that is zero
elsewhere and sums it over ranks. A sum of one value and zeros is exact, so every rank receives
bit-identical per-client rows in client-id order, whatever the placement of clients on ranks; any
reduction over clients is then done locally in client-id order.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class Communicator(Protocol):
    """What fedur needs from Lightning Fabric (or a fake in unit tests)."""

    device: torch.device
    world_size: int

    def all_reduce(self, data: Tensor, group=None, reduce_op: str = "mean") -> Tensor: ...

    def barrier(self, name: str | None = None) -> None: ...


class Collectives:
    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def gather_clients(self, values: dict[int, Tensor], num_clients: int, like: Tensor | None = None) -> Tensor:
        """(num_clients, *shape) with row k = values[k] from whichever rank hosts client k.

        Every rank must call this, also with no local values (then pass `like` for shape and dtype).
        """
        template = like if like is not None else next(iter(values.values()))
        out = torch.zeros((num_clients, *template.shape), dtype=template.dtype, device=self.comm.device)
        for client_id, value in values.items():
            out[client_id] = value.to(self.comm.device)
        if self.comm.world_size > 1:
            out = self.comm.all_reduce(out, reduce_op="sum")
        return out.cpu()

    def barrier(self) -> None:
        self.comm.barrier()
