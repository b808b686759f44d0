"""Which clients live on which rank. One of the two places (with collectives.py) that speaks of ranks."""

from __future__ import annotations


def clients_on_rank(num_clients: int, world_size: int, rank: int, group: int = 1) -> list[int]:
    """Contiguous, balanced blocks: 10 clients on 4 ranks -> [0,1,2], [3,4,5], [6,7], [8,9].

    With more ranks than clients, ranks num_clients.. host none (5 clients on 8 ranks: ranks 5, 6, 7);
    they still take part in every exchange, contributing nothing. Results do not depend on this choice:
    every client has its own state and RNG streams, and cross-client reductions run in client-id order
    on every rank.

    `group` > 1 (run.clients_per_step): the blocks are made of whole groups of `group` consecutive client ids
    (the last one shorter), so that a group trains together on one rank whatever the number of ranks.
    """
    n_groups = -(-num_clients // group)
    base, extra = divmod(n_groups, world_size)
    start = rank * base + min(rank, extra)
    return list(range(start * group, min((start + base + (rank < extra)) * group, num_clients)))


def placement_table(num_clients: int, hosts: list[tuple[int, int]], cluster_environment: str | None, group: int = 1) -> dict:
    """placement.json: every rank's node, local rank and clients; `hosts[r]` = (node, local rank) of rank r."""
    world_size = len(hosts)
    return {
        "cluster_environment": cluster_environment,
        "world_size": world_size,
        "num_nodes": max(node for node, _ in hosts) + 1,
        "ranks": [
            {"rank": r, "node": node, "local_rank": local, "clients": clients_on_rank(num_clients, world_size, r, group)}
            for r, (node, local) in enumerate(hosts)
        ],
    }


def placement_lines(table: dict) -> list[str]:
    """One line per rank that hosts clients, and one for all the spare ranks."""
    lines, spare = [], []
    for r in table["ranks"]:
        if r["clients"]:
            lines.append(f"rank {r['rank']} (node {r['node']}, local rank {r['local_rank']}) hosts clients {r['clients']}")
        else:
            spare.append(str(r["rank"]))
    if spare:
        clients = sum(len(r["clients"]) for r in table["ranks"])
        several = len(spare) > 1
        lines.append(
            f"rank{'s' * several} {', '.join(spare)} host{'' if several else 's'} no client ({clients} "
            f"client{'s' * (clients != 1)} on {table['world_size']} ranks) and take{'' if several else 's'} part in every exchange"
        )
    return lines
