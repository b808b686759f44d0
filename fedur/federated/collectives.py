"""Every cross-rank communication of fedur goes through here (in place of a federated server).

`gather_clients` puts each client's tensor in its row of a (num_clients, ...) tensor that is zero
elsewhere and sums it over ranks. A sum of one value and zeros is exact, so every rank receives
bit-identical per-client rows in client-id order, whatever the placement of clients on ranks; any
reduction over clients is then done locally in client-id order.

Before each exchange the ranks compare a small signature (call number, what is exchanged, shape,
dtype): a rank that calls a different collective, or one with another shape, becomes a
CollectiveError on every rank instead of a hang or silently wrong sums. A rank that never calls
(dead, or stuck) makes the others fail after the process-group timeout (`run.collective_timeout`).
"""

from __future__ import annotations

import zlib
from typing import Protocol

import torch
from torch import Tensor

MAX_DIMS = 6
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8]


class CollectiveError(RuntimeError):
    """Ranks disagree on a collective, or a peer died or timed out; the message says which."""


class Communicator(Protocol):
    """What fedur needs from Lightning Fabric (or a fake in unit tests)."""

    device: torch.device
    world_size: int
    global_rank: int

    def all_reduce(self, data: Tensor, group=None, reduce_op: str = "mean") -> Tensor: ...

    def all_gather(self, data: Tensor, group=None, sync_grads: bool = False) -> Tensor: ...

    def barrier(self, name: str | None = None) -> None: ...


class Collectives:
    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.calls = 0

    def gather_clients(self, values: dict[int, Tensor], num_clients: int, like: Tensor, what: str) -> Tensor:
        """(num_clients, *shape) with row k = values[k] from whichever rank hosts client k.

        Every rank must call this, also with no local values (`like` gives shape and dtype; every value
        must match it). `what` names the exchange in error messages.
        """
        out = torch.zeros((num_clients, *like.shape), dtype=like.dtype, device=self.comm.device)
        for client_id, value in values.items():
            if value.shape != like.shape:
                raise CollectiveError(f"{what}: client {client_id} sends shape {tuple(value.shape)}, expected {tuple(like.shape)}")
            out[client_id] = value.to(self.comm.device)
        if self.comm.world_size > 1:
            self._agree(what, out)
            out = self._call(what, lambda: self.comm.all_reduce(out, reduce_op="sum"))
        return out.cpu()

    def any(self, flag: bool, what: str) -> bool:
        """True on every rank when `flag` is true on any rank."""
        if self.comm.world_size == 1:
            return flag
        total = self.gather_clients({self.comm.global_rank: torch.tensor(int(flag))}, self.comm.world_size, torch.tensor(0), what)
        return bool(total.sum() > 0)

    def barrier(self, what: str = "barrier") -> None:
        if self.comm.world_size > 1:
            self._call(what, self.comm.barrier)

    def _agree(self, what: str, tensor: Tensor) -> None:
        self.calls += 1
        mine = signature(self.calls, what, tensor).to(self.comm.device)
        every = self._call(what, lambda: self.comm.all_gather(mine)).cpu()  # (world_size, len)
        if not bool((every == every[0]).all()):
            rows = "; ".join(f"rank {r}: {describe(row)}" for r, row in enumerate(every.tolist()))
            raise CollectiveError(
                f"ranks disagree on collective #{self.calls} (this rank: {what}); {rows}. "
                "Every rank must make the same collective calls in the same order with the same shapes."
            )

    def _call(self, what: str, fn):
        try:
            return fn()
        except CollectiveError:
            raise
        except RuntimeError as err:  # gloo/NCCL: a peer closed the connection, or the timeout passed
            raise CollectiveError(
                f"{what} failed on rank {self.comm.global_rank}: a peer died or did not answer within "
                f"run.collective_timeout ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
            ) from err


def signature(call: int, what: str, tensor: Tensor) -> Tensor:
    """(4 + MAX_DIMS,) int64: call number, crc32 of `what`, dtype code, ndim, shape (zero-padded)."""
    if tensor.dim() > MAX_DIMS:
        raise CollectiveError(f"{what}: tensors of more than {MAX_DIMS} dims are not supported")
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    code = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else len(DTYPES)
    return torch.tensor([call, zlib.crc32(what.encode()), code, tensor.dim(), *shape], dtype=torch.int64)


def describe(row: list[int]) -> str:
    call, _, code, ndim, *shape = row
    dtype = DTYPES[code] if code < len(DTYPES) else "other"
    return f"call #{call}, shape {tuple(shape[:ndim])}, {dtype}"
