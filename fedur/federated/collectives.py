"""Every cross-rank communication of fedur goes through here (in place of a federated server).

`gather_clients` puts each client's tensor in its row of a (num_clients, ...) tensor that is zero
elsewhere and sums it over ranks. A sum of one value and zeros is exact, so every rank receives
bit-identical per-client rows in client-id order, whatever the placement of clients on ranks; any
reduction over clients is then done locally in client-id order.

Before each exchange the ranks compare a small signature (call number, what is exchanged, shape,
dtype): a rank that calls a different collective, or one with another shape, becomes a
CollectiveError on every rank instead of a hang or silently wrong sums.

Two timeouts, because a rank may legitimately wait long for a live peer (its clients are larger, it
builds the image cache) but should not wait long for a dead one:
- a heartbeat: a background thread on every rank joins a tiny all_reduce every few seconds on its own
  gloo group; when a peer process or node dies, the others stop with an error within
  `run.peer_timeout` (at once when the connection drops), whatever their main thread is waiting in;
- the process-group timeout (`run.wait_timeout`, hours) ends a wait on a peer that is alive but stuck.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import zlib
from datetime import timedelta
from typing import Protocol

import torch
from torch import Tensor

# Lightning's all_gather calls torch's deprecated differentiable all_gather and warns on every rank; fedur
# gathers without gradients, so the warning says nothing to a user.
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_gather is deprecated")

MAX_DIMS = 6
SUM_CHUNK_BYTES = 256 * 2**20  # per rank and exchange of sum_clients
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8]


class CollectiveError(RuntimeError):
    """Ranks disagree on a collective, or a peer died or timed out; the message says which."""


class DeviceMemoryError(CollectiveError):
    """A collective ran out of device memory on this rank (its peers are not at fault)."""


def first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


class Communicator(Protocol):
    """What fedur needs from Lightning Fabric (or a fake in unit tests)."""

    device: torch.device
    world_size: int
    global_rank: int

    def all_reduce(self, data: Tensor, group=None, reduce_op: str = "mean") -> Tensor: ...

    def all_gather(self, data: Tensor, group=None, sync_grads: bool = False) -> Tensor: ...

    def barrier(self, name: str | None = None) -> None: ...


class Collectives:
    def __init__(self, comm: Communicator, peer_timeout: float | None = None) -> None:
        """`peer_timeout`: start the heartbeat (every rank must construct its Collectives at the same point)."""
        self.comm = comm
        self.calls = 0
        self.heartbeat = None
        if peer_timeout is not None and comm.world_size > 1 and torch.distributed.is_initialized():
            self.heartbeat = Heartbeat(comm.global_rank, peer_timeout)

    def close(self) -> None:
        """Stop the heartbeat together with the other ranks (call at the same point on every rank)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def end_of_run(self) -> None:
        """The last exchange of a run, on every rank: a barrier, so that no rank leaves while a peer still writes its
        files. The process groups are destroyed when the process exits (a process may run several runs, as
        tests/run_many.py does), by this process rather than by the interpreter's teardown, which can abort a rank
        whose peers have just left."""
        if self.comm.world_size > 1 and torch.distributed.is_initialized():
            self.barrier("end of run")
            _destroy_at_exit()

    def gather_clients(self, values: dict[int, Tensor], num_clients: int, like: Tensor, what: str) -> Tensor:
        """(num_clients, *shape) with row k = values[k] from whichever rank hosts client k.

        Every rank must call this, also with no local values (`like` gives shape and dtype; every value
        must match it). `what` names the exchange in error messages.
        """
        if like.dtype not in DTYPES:
            # machine: ranks out of step
            raise CollectiveError(f"{what}: dtype {like.dtype} cannot be exchanged (NCCL takes {', '.join(map(str, DTYPES))})")
        out = torch.zeros((num_clients, *like.shape), dtype=like.dtype, device=self.comm.device)  # contiguous
        for client_id, value in values.items():
            if value.shape != like.shape or value.dtype != like.dtype:
                # machine: ranks out of step
                raise CollectiveError(f"{what}: client {client_id} sends {tuple(value.shape)} {value.dtype}, expected "
                                      f"{tuple(like.shape)} {like.dtype}")
            out[client_id] = value.to(self.comm.device)
        if self.comm.world_size == 1:
            return out.cpu()
        self._agree(what, out)
        # The copy to the host is where an asynchronous NCCL failure surfaces: inside the error handling too.
        return self._call(what, lambda: self.comm.all_reduce(out, reduce_op="sum").cpu())

    def sum_clients(self, values: dict[int, Tensor], num_clients: int, like: Tensor, include: Tensor, what: str,
                    max_bytes: int = SUM_CHUNK_BYTES) -> Tensor:
        """The sum of values[k] over the clients k with include[k], added one client at a time in client-id order
        (so the same bits on every rank and for every placement): like gather_clients(...)[include] summed in
        order, but exchanged in chunks of clients of at most `max_bytes` per rank (a (K, D, D) float64 exchange
        at K = 1,000 and D = 768 would be 4.7 GB). Every rank must call this; nothing included gives zeros."""
        per_client = max(like.numel() * like.element_size(), 1)
        chunk = max(1, max_bytes // per_client)
        total = None
        for start in range(0, num_clients, chunk):
            stop = min(start + chunk, num_clients)
            part = {k - start: v for k, v in values.items() if start <= k < stop}
            rows = self.gather_clients(part, stop - start, like=like, what=f"{what} (clients {start}-{stop - 1})")
            for k in range(start, stop):
                if include[k]:
                    total = rows[k - start].clone() if total is None else total + rows[k - start]
        return torch.zeros_like(like, device="cpu") if total is None else total

    def gather_ranks(self, value: Tensor, what: str) -> Tensor:
        """(world_size, *shape): row r is rank r's `value` (the same shape and dtype on every rank)."""
        return self.gather_clients({self.comm.global_rank: value}, self.comm.world_size, like=value, what=what)

    def max_over_ranks(self, value: int, what: str) -> int:
        """The largest of every rank's `value`, on every rank."""
        if self.comm.world_size == 1:
            return value
        return int(self.gather_ranks(torch.tensor(value, device="cpu"), what).max())

    def barrier(self, what: str = "barrier") -> None:
        if self.comm.world_size > 1:
            self._call(what, self.comm.barrier)

    def _agree(self, what: str, tensor: Tensor) -> None:
        self.calls += 1
        mine = signature(self.calls, what, tensor).to(self.comm.device)
        every = self._call(what, lambda: self.comm.all_gather(mine).cpu())  # (world_size, len)
        if not bool((every == every[0]).all()):
            rows = "; ".join(f"rank {r}: {describe(row)}" for r, row in enumerate(every.tolist()))
            raise CollectiveError(  # machine: a peer or the network
                f"ranks disagree on collective #{self.calls} (this rank: {what}); {rows}. "
                "Every rank must make the same collective calls in the same order with the same shapes."
            )

    def _call(self, what: str, fn):
        try:
            return fn()
        except CollectiveError:
            raise
        except torch.OutOfMemoryError as err:  # before the RuntimeError it is: not a peer's failure
            raise DeviceMemoryError(  # machine: device memory
                f"{what} ran out of device memory on rank {self.comm.global_rank} ({first_line(err)}); fewer "
                "clients per rank, a smaller run.clients_per_step or optim.eval_batch_size leave more room"
            ) from err
        except RuntimeError as err:  # gloo/NCCL: a peer closed the connection, or the timeout passed
            raise CollectiveError(  # machine: a peer or the network
                f"{what} failed on rank {self.comm.global_rank}: a peer died, or did not arrive within "
                f"run.wait_timeout ({type(err).__name__}: {first_line(err)})"
            ) from err


class Heartbeat:
    """Every `interval` seconds, all ranks' heartbeat threads all_reduce [stop flag] on a private gloo group.

    A dead peer makes that all_reduce fail (connection closed, or `timeout`), and the rank exits with an
    error at once. Ranks stop together: `stop()` raises this rank's flag, and every thread leaves after
    the first beat in which any flag is up.
    """

    def __init__(self, rank: int, timeout: float, interval: float = 2.0) -> None:
        import torch.distributed as dist

        self.rank, self.timeout, self.interval = rank, timeout, min(interval, timeout / 4)
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="fedur-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        import torch.distributed as dist

        while True:
            flag = torch.tensor([1.0 if self.stopping.is_set() else 0.0], device="cpu")
            try:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            except Exception as err:  # a peer died: the main thread may be blocked in a collective for hours
                print(
                    f"fedur: error: rank {self.rank} lost its peers: no heartbeat within run.peer_timeout="
                    f"{self.timeout:g}s or the connection dropped (a rank died or its node failed): "
                    f"{str(err).splitlines()[0] if str(err) else type(err).__name__}",
                    file=sys.stderr, flush=True,
                )
                os._exit(1)
            if flag.item() > 0:
                return
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


def signature(call: int, what: str, tensor: Tensor) -> Tensor:
    """(4 + MAX_DIMS,) int64: call number, crc32 of `what`, dtype code, ndim, shape (zero-padded)."""
    if tensor.dim() > MAX_DIMS:
        raise CollectiveError(f"{what}: tensors of more than {MAX_DIMS} dims are not supported")  # machine: a peer or the network
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    code = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else len(DTYPES)
    return torch.tensor([call, zlib.crc32(what.encode()), code, tensor.dim(), *shape], dtype=torch.int64, device="cpu")


def describe(row: list[int]) -> str:
    call, _, code, ndim, *shape = row
    dtype = DTYPES[code] if code < len(DTYPES) else "other"
    return f"call #{call}, shape {tuple(shape[:ndim])}, {dtype}"


_DESTROY_REGISTERED = False


def _destroy_at_exit() -> None:
    global _DESTROY_REGISTERED
    if not _DESTROY_REGISTERED:
        atexit.register(lambda: torch.distributed.is_initialized() and torch.distributed.destroy_process_group())
        _DESTROY_REGISTERED = True
