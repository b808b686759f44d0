import numpy as np
import pytest
import torch

from fedur.federated.placement import PlacementError, clients_on_rank
from fedur.federated.streams import client_generator, participants


def test_contiguous_balanced_blocks():
    assert [clients_on_rank(10, 4, r) for r in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert clients_on_rank(4, 1, 0) == [0, 1, 2, 3]


def test_fewer_clients_than_ranks_is_refused():
    with pytest.raises(PlacementError, match="num_clients=2"):
        clients_on_rank(2, 4, 0)


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
