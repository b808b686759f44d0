"""Collectives on a real 2-process gloo group: exact gathers, and errors (not hangs) when ranks disagree."""

import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fedur.federated.collectives import CollectiveError, Collectives


class GlooComm:
    """The part of Fabric that Collectives uses, over a plain torch.distributed group."""

    device = torch.device("cpu")

    def __init__(self, rank: int, world_size: int) -> None:
        self.global_rank, self.world_size = rank, world_size

    def all_reduce(self, data, group=None, reduce_op="mean"):
        assert reduce_op == "sum"
        dist.all_reduce(data)
        return data

    def all_gather(self, data, group=None, sync_grads=False):
        out = [torch.zeros_like(data) for _ in range(self.world_size)]
        dist.all_gather(out, data)
        return torch.stack(out)

    def barrier(self, name=None):
        dist.barrier()


def scenario(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=4))
    collectives = Collectives(GlooComm(rank, 2))
    outcome = {}
    try:
        # clients 0, 1 on rank 0 and 2 on rank 1: every rank receives every row, exactly
        mine = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([3.0, 4.0])} if rank == 0 else {2: torch.tensor([5.0, 6.0])}
        outcome["rows"] = collectives.gather_clients(mine, 3, like=torch.zeros(2), what="values").tolist()
        outcome["max"] = collectives.max_over_ranks(5 if rank == 1 else 2, what="flag")
        try:  # rank 1 sends another shape
            collectives.gather_clients({}, 3, like=torch.zeros(2 + rank), what="prompts")
        except CollectiveError as err:
            outcome["shape"] = str(err)
        try:  # rank 1 calls a different collective
            collectives.gather_clients({}, 3, like=torch.zeros(2), what="accuracy" if rank == 0 else "losses")
        except CollectiveError as err:
            outcome["what"] = str(err)
        if rank == 0:  # rank 1 never calls: a missing participant
            try:
                collectives.gather_clients({}, 3, like=torch.zeros(2), what="histograms")
            except CollectiveError as err:
                outcome["missing"] = str(err)
    except Exception:
        outcome["crash"] = traceback.format_exc()
    results[rank] = outcome


@pytest.fixture(scope="module")
def outcomes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(scenario, args=(port, results), nprocs=2, join=True)
    return dict(results)


@pytest.mark.slow
def test_gather_is_exact_and_in_client_order(outcomes):
    for rank in (0, 1):
        assert "crash" not in outcomes[rank], outcomes[rank].get("crash")
        assert outcomes[rank]["rows"] == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
        assert outcomes[rank]["max"] == 5


def test_a_shape_mismatch_raises_on_every_rank(outcomes):
    for rank in (0, 1):
        assert "ranks disagree" in outcomes[rank]["shape"] and "shape (3, 2)" in outcomes[rank]["shape"]
        assert "shape (3, 3)" in outcomes[rank]["shape"]


def test_different_collectives_raise_on_every_rank(outcomes):
    assert "this rank: accuracy" in outcomes[0]["what"] and "this rank: losses" in outcomes[1]["what"]


def test_a_missing_participant_raises_after_the_timeout(outcomes):
    assert "histograms failed on rank 0: a peer died, or did not arrive within run.wait_timeout" in outcomes[0]["missing"]


def lose_a_peer(rank: int, port: int) -> None:
    """Rank 1 dies while rank 0's main thread is busy (not in any collective): the heartbeat notices."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    Collectives(GlooComm(rank, 2), peer_timeout=20)
    if rank == 1:
        os._exit(0)
    time.sleep(120)  # "training": the heartbeat thread must end this process long before


@pytest.mark.slow
def test_the_heartbeat_ends_a_rank_whose_peer_died_even_outside_collectives():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(lose_a_peer, args=(port,), nprocs=2, join=False, start_method="spawn")
    start = time.monotonic()
    survivor = context.processes[0]
    survivor.join(timeout=100)
    seconds = time.monotonic() - start
    assert survivor.exitcode == 1, "rank 0 should have stopped with an error"
    print(f"heartbeat: rank 0 stopped {seconds:.1f} s after its peer died (peer_timeout 20 s)")
    assert seconds < 60


class OneRank:
    """A communicator of one rank: gathers are the local rows."""

    device, world_size, global_rank = torch.device("cpu"), 1, 0


def test_sums_in_chunks_of_clients_are_the_sums_in_client_order_bit_for_bit():
    """GDA-U's statistics are summed, not gathered whole: in chunks of clients (bounded memory per rank), each
    client added in client-id order as one gather would give them."""
    generator = torch.Generator().manual_seed(0)
    values = {k: torch.randn(3, 3, dtype=torch.float64, generator=generator) * 10 ** (k % 5) for k in range(7)}
    include = torch.tensor([True, False, True, True, False, True, True])
    collectives = Collectives(OneRank())
    rows = collectives.gather_clients(values, 7, like=torch.zeros(3, 3, dtype=torch.float64), what="statistics")
    expected = None
    for k in range(7):
        if include[k]:
            expected = rows[k].clone() if expected is None else expected + rows[k]
    for max_bytes in (72, 72 * 2, 72 * 3, 10**9):  # one client per chunk, two, three, all in one
        total = collectives.sum_clients(values, 7, torch.zeros(3, 3, dtype=torch.float64), include, "statistics", max_bytes)
        assert torch.equal(total.view(torch.int64), expected.view(torch.int64))
    nobody = collectives.sum_clients({}, 7, torch.zeros(2), torch.zeros(7, dtype=torch.bool), "statistics")
    assert torch.equal(nobody, torch.zeros(2))
