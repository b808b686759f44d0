"""Derived random streams. Each is a pure function of (seed, ids), so no RNG state has to move between
ranks: a client's data order in a round is the same whichever rank hosts it."""

from __future__ import annotations

import numpy as np
import torch

_DATA_ORDER, _PARTICIPATION, _NOISE = 1, 2, 3
_VALIDATION = 6  # a client's label-free validation split (data.validation_fraction)
NOISE_PIECES, NOISE_ESTIMATES, NOISE_SELECTED, NOISE_CLIP_COUNT = 1, 2, 3, 4  # what a privacy noise stream noises
SERVER = -1  # the stream of the server's own noise (central privacy), in place of a client id
_LOCAL_STEP = 4  # a method's own randomness in a client's local step (DP-FPL's test matrix and noise)


def _seed(*words: int) -> int:
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1, dtype=np.uint64)[0] >> 1)


def client_generator(seed: int, client_id: int, round_idx: int) -> torch.Generator:
    """The stream that shuffles client `client_id`'s local data in round `round_idx`."""
    return torch.Generator().manual_seed(_seed(seed, _DATA_ORDER, client_id, round_idx))


def step_generator(seed: int, client_id: int, round_idx: int, step: int) -> torch.Generator:
    """The stream of a method's own draws in client `client_id`'s local step `step` (its optimizer steps before it in
    the round, from 0) of round `round_idx`: DP-FPL's test matrix and its noise on the local prompt's factors."""
    return torch.Generator().manual_seed(_seed(seed, _LOCAL_STEP, client_id, round_idx, step))


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


def noise_generator(seed: int, what: int, round_idx: int, client_id: int = SERVER) -> torch.Generator:
    """The stream of the privacy noise `what` (NOISE_PIECES, NOISE_ESTIMATES, NOISE_SELECTED, NOISE_CLIP_COUNT) in round
    `round_idx`: client `client_id`'s own (local privacy), or the server's (SERVER, central privacy); the same on
    every rank, whichever hosts the client."""
    return torch.Generator().manual_seed(_seed(seed, _NOISE, what, round_idx, client_id + 1))


def poisson_participants(num_clients: int, rate: float, seed: int, round_idx: int) -> np.ndarray:
    """(num_clients,) bool: each client takes part on its own with probability `rate` (privacy.sampling poisson)."""
    rng = np.random.default_rng(_seed(seed, _PARTICIPATION, round_idx, 1))
    return rng.random(num_clients) < rate


_SYSTEM = 5  # who answers, how fast, who attacks (clock.drop_rate, speeds, attackers)
LOST_UPLOAD, LOST_HISTOGRAM, SPEED, BANDWIDTH, ATTACKERS, ATTACK_NOISE = 1, 2, 3, 4, 5, 6


def lost(num_clients: int, rate: float, seed: int, round_idx: int, what: int = LOST_UPLOAD) -> np.ndarray:
    """(num_clients,) bool: whose upload `what` (LOST_UPLOAD: the round's update; LOST_HISTOGRAM: a refresh's
    histograms) is lost in round `round_idx`, each client on its own with probability `rate`, from a stream of its
    own (the same on every rank, and for client k whatever the number of clients)."""
    if rate == 0:
        return np.zeros(num_clients, dtype=bool)
    draws = [np.random.default_rng(_seed(seed, _SYSTEM, what, round_idx, k)).random() for k in range(num_clients)]
    return np.asarray(draws) < rate


def client_factors(num_clients: int, spread: float, seed: int, what: int) -> np.ndarray:
    """(num_clients,) float64 exp(spread * z_k), z_k ~ N(0, 1) from client k's own stream: a client's lognormal
    speed (`what` SPEED) or bandwidth (BANDWIDTH) factor, fixed for the run."""
    return np.exp([spread * np.random.default_rng(_seed(seed, _SYSTEM, what, k)).standard_normal() for k in range(num_clients)])


def chosen(num_clients: int, count: int, seed: int, what: int = ATTACKERS) -> list[int]:
    """`count` distinct client ids of `num_clients`, drawn once for the run (the attackers), ascending."""
    rng = np.random.default_rng(_seed(seed, _SYSTEM, what))
    return sorted(int(k) for k in rng.choice(num_clients, size=count, replace=False))


def attack_generator(seed: int, client_id: int, round_idx: int) -> torch.Generator:
    """The stream of an attacker's garbage (adversary.attack gaussian) in round `round_idx`."""
    return torch.Generator().manual_seed(_seed(seed, _SYSTEM, ATTACK_NOISE, round_idx, client_id))


def validation_count(num_train: int, fraction: float) -> int:
    """How many of a client's `num_train` train images data.validation_fraction sets aside: round(fraction x n), at
    least one when the fraction is above 0 (0 when it is 0)."""
    return 0 if fraction == 0 or num_train == 0 else max(1, int(fraction * num_train + 0.5))


def validation_positions(seed: int, client_id: int, num_train: int, count: int) -> np.ndarray:
    """(count,) int64 sorted positions among client `client_id`'s `num_train` train images that form its label-free
    validation split: drawn without replacement from the client's own stream, the same whichever rank hosts it and
    whatever the other clients hold."""
    rng = np.random.default_rng(_seed(seed, _VALIDATION, client_id))
    return np.sort(rng.permutation(num_train)[:count]).astype(np.int64)


_SERVER_STARTS = 7  # an asynchronous server's draws of who starts (server.mode fedbuff | fedasync)


def starters(idle: list[int], count: int, seed: int, step: int) -> list[int]:
    """`count` of the `idle` client ids, drawn uniformly without replacement to start after asynchronous server step
    `step` (from 0; -1: at time 0, before the first), ascending; all of them where `count` is as many."""
    if count >= len(idle):
        return sorted(idle)
    rng = np.random.default_rng(_seed(seed, _SERVER_STARTS, step + 1))
    return sorted(int(k) for k in rng.choice(np.asarray(idle), size=count, replace=False))
