"""Derived random streams. Each is a pure function of (seed, ids), so no RNG state has to move between
ranks: a client's data order in a round is the same whichever rank hosts it."""

from __future__ import annotations

import numpy as np
import torch

_DATA_ORDER, _PARTICIPATION = 1, 2


def _seed(*words: int) -> int:
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, dtype=np.uint64)[0] >> 1)


def client_generator(seed: int, client_id: int, round_idx: int) -> torch.Generator:
    """The stream that shuffles client `client_id`'s local data in round `round_idx`."""
    return torch.Generator().manual_seed(_seed(seed, _DATA_ORDER, client_id, round_idx))


def participants(num_clients: int, join_rate: float, seed: int, round_idx: int) -> np.ndarray:
    """(num_clients,) bool: the ceil(join_rate * K) clients that train in this round, drawn uniformly."""
    if not 0 < join_rate <= 1:
        # internal: federation.join_rate's range checks it first
        raise ValueError(f"federation.join_rate must be in (0, 1], got {join_rate}")
    chosen = np.zeros(num_clients, dtype=bool)
    if join_rate == 1:
        chosen[:] = True
        return chosen
    rng = np.random.default_rng(_seed(seed, _PARTICIPATION, round_idx))
    count = int(np.ceil(join_rate * num_clients))
    chosen[rng.choice(num_clients, size=count, replace=False)] = True
    return chosen
