import numpy as np
import pytest
import torch

from fedur.federated.placement import clients_on_rank, placement_lines, placement_table
from fedur.federated.streams import client_generator, participants


def test_contiguous_balanced_blocks():
    assert [clients_on_rank(10, 4, r) for r in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert clients_on_rank(4, 1, 0) == [0, 1, 2, 3]


def test_groups_of_clients_stay_whole_on_a_rank():
    """run.clients_per_step = 3: groups {0,1,2} {3,4,5} {6,7,8} {9} are placed whole, in balanced blocks."""
    assert [clients_on_rank(10, 2, r, group=3) for r in range(2)] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert [clients_on_rank(10, 4, r, group=3) for r in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [clients_on_rank(4, 3, r, group=2) for r in range(3)] == [[0, 1], [2, 3], []]
    assert [clients_on_rank(10, 4, r, group=1) for r in range(4)] == [clients_on_rank(10, 4, r) for r in range(4)]
    for world in (1, 2, 3, 5, 8):
        hosted = [clients_on_rank(10, world, r, group=3) for r in range(world)]
        assert sorted(k for ids in hosted for k in ids) == list(range(10))
        assert all(len({k // 3 for k in ids} & {k // 3 for k in other}) == 0
                   for i, ids in enumerate(hosted) for other in hosted[i + 1:])  # no group split across ranks
    assert placement_table(4, [(0, 0), (0, 1)], None, group=3)["ranks"][1]["clients"] == [3]


def test_more_ranks_than_clients_leaves_spare_ranks():
    """CUB's 5 clients on 8 GPUs: ranks 0-4 host one client each, ranks 5-7 none."""
    assert [clients_on_rank(5, 8, r) for r in range(8)] == [[0], [1], [2], [3], [4], [], [], []]
    table = placement_table(5, [(r // 4, r % 4) for r in range(8)], "SLURMEnvironment")  # 2 nodes x 4
    assert table["num_nodes"] == 2 and table["world_size"] == 8
    assert table["ranks"][4] == {"rank": 4, "node": 1, "local_rank": 0, "clients": [4]}
    assert placement_lines(table) == [
        *(f"rank {r} (node {r // 4}, local rank {r % 4}) hosts clients [{r}]" for r in range(5)),
        "ranks 5, 6, 7 host no client (5 clients on 8 ranks) and take part in every exchange",
    ]
    every = sorted(k for r in range(8) for k in clients_on_rank(5, 8, r))
    assert every == list(range(5))


def test_client_streams_are_pure_functions_of_ids():
    a = torch.randperm(100, generator=client_generator(1, 3, 7))
    assert torch.equal(a, torch.randperm(100, generator=client_generator(1, 3, 7)))
    assert not torch.equal(a, torch.randperm(100, generator=client_generator(1, 4, 7)))
    assert not torch.equal(a, torch.randperm(100, generator=client_generator(1, 3, 8)))


def test_participants():
    assert participants(5, 1.0, 1, 0).all()
    chosen = participants(10, 0.3, 1, 2)
    assert chosen.sum() == 3
    assert np.array_equal(chosen, participants(10, 0.3, 1, 2))
    rounds = {tuple(np.flatnonzero(participants(10, 0.3, 1, r))) for r in range(10)}
    assert len(rounds) > 1
    with pytest.raises(ValueError):
        participants(10, 0.0, 1, 0)
