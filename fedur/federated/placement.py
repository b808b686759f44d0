"""Which clients live on which rank. One of the two places (with collectives.py) that speaks of ranks."""

from __future__ import annotations


class PlacementError(ValueError):
    """The clients cannot be placed on the ranks as configured."""


def clients_on_rank(num_clients: int, world_size: int, rank: int) -> list[int]:
    """Contiguous, balanced blocks: 10 clients on 4 ranks -> [0,1,2], [3,4,5], [6,7], [8,9].

    Results do not depend on this choice: every client has its own state and RNG streams, and
    cross-client reductions run in client-id order on every rank.
    """
    if num_clients < world_size:
        raise PlacementError(
            f"federation.num_clients={num_clients} is smaller than the number of ranks ({world_size}); "
            "every rank must host at least one client: raise num_clients or launch fewer devices/nodes"
        )
    base, extra = divmod(num_clients, world_size)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (rank < extra)))
