"""An asynchronous server's events (fedur/federated/asynchronous.py) on hand-written speeds: who arrives when, which
arrivals a step takes and how stale they are, who is idle, the staleness functions, and when a run evaluates."""

import math

import pytest

from fedur.federated import asynchronous as a
from fedur.federated.asynchronous import Events, Job
from fedur.federated.streams import starters


def hand_worked(steps: int) -> list[tuple[list[int], list[int], float, list[int]]]:
    """The sequence docs/asynchronous.md works by hand: four clients of speeds 1, 2, 4 and 0.5 steps per second, one
    step a job, concurrency 4, buffer 2; each step's (arrivals, their staleness, its time, who starts after it: the
    arrivals, every client being busy otherwise)."""
    speeds = [1.0, 2.0, 4.0, 0.5]
    events = a.start(a.begin(4), [0, 1, 2, 3], [1 / s for s in speeds])
    out = []
    for _ in range(steps):
        arrivals, events = a.take(events, 2)
        idle = events.idle()
        out.append(([j.client for j in arrivals], a.staleness(arrivals, events.version - 1), events.now, idle))
        events = a.start(events, idle, [1 / speeds[k] for k in idle])
    return out


def test_the_hand_worked_sequence_of_four_clients():
    # t 0: all start from v0, arriving at 1, 0.5, 0.25, 2.
    # step 1 at 0.5: clients 2 (0.25) and 1 (0.5) from v0 -> v1; they start again, arriving at 0.75 and 1.0.
    # step 2 at 1.0: client 2 (0.75, from v1) and client 0 (1.0, from v0: staleness 1; client 1's 1.0 ties, lower id
    #   first) -> v2; 2 and 0 start from v2, arriving at 1.25 and 2.0.
    # step 3 at 1.25: client 1 (1.0, from v1: staleness 1), client 2 (1.25, from v2) -> v3; 1 and 2 arrive at 1.75, 1.5.
    # step 4 at 1.75: client 2 (1.5), client 1 (1.75), both from v3 -> v4; they arrive at 2.0 and 2.25.
    # step 5 at 2.0: clients 0 (from v2: staleness 2), 2 (from v4) and 3 (from v0) all arrive at 2.0: 0 and 2 first
    #   -> v5; 0 and 2 start from v5, arriving at 3.0 and 2.25.
    # step 6 at 2.25: client 3 (2.0, from v0: staleness 5), client 1 (2.25, from v4: staleness 1; client 2's 2.25 ties,
    #   and waits for the next step) -> v6.
    assert hand_worked(6) == [
        ([2, 1], [0, 0], 0.5, [1, 2]),
        ([2, 0], [0, 1], 1.0, [0, 2]),
        ([1, 2], [1, 0], 1.25, [1, 2]),
        ([2, 1], [0, 0], 1.75, [1, 2]),
        ([0, 2], [2, 0], 2.0, [0, 2]),
        ([3, 1], [5, 1], 2.25, [1, 3]),
    ]


def test_a_job_is_its_clients_next_and_trains_from_the_current_version():
    events = a.start(a.begin(3), [2, 0], [1.5, 0.5])
    assert events.flying == (Job(2, 0, 0, 0.0, 1.5), Job(0, 0, 0, 0.0, 0.5)) and events.jobs == (1, 0, 1)
    assert events.idle() == [1]
    arrivals, events = a.take(events, 1)
    assert arrivals == (Job(0, 0, 0, 0.0, 0.5),) and events.version == 1 and events.now == 0.5
    events = a.start(events, [0, 1], [1.0, 0.25])
    assert events.flying[1:] == (Job(0, 1, 1, 0.5, 1.5), Job(1, 0, 1, 0.5, 0.75)) and events.jobs == (2, 1, 1)
    with pytest.raises(ValueError):
        a.start(events, [2], [1.0])  # training already
    with pytest.raises(ValueError):
        a.take(events, 4)  # more arrivals than clients training


def test_events_are_plain_values_a_checkpoint_holds():
    events = a.start(a.begin(4), [0, 3], [2.0, 0.125])
    events = Events(events.jobs, 3, 7.5, events.flying, 6.0)
    state = events.state_dict()
    assert Events.from_state(state) == events
    assert all(isinstance(v, (int, float, list)) for v in state.values())


@pytest.mark.parametrize("function, tau, want", [
    ("constant", 0, 1.0), ("constant", 9, 1.0),
    ("polynomial", 0, 1.0), ("polynomial", 3, 0.5), ("polynomial", 8, 1 / 3),  # FedBuff's 1 / sqrt(1 + tau)
    ("hinge", 4, 1.0), ("hinge", 5, 1 / 11), ("hinge", 6, 1 / 21),  # a 10, b 4: 1 / (10 (tau - 4) + 1)
])
def test_the_staleness_functions(function, tau, want):
    assert a.weight(tau, function) == pytest.approx(want)


def test_a_polynomial_exponent_and_a_hinge_of_ones_own():
    assert a.weight(3, "polynomial", exponent=1.0) == 0.25
    assert a.weight(2, "hinge", hinge_a=0.5, hinge_b=1) == pytest.approx(1 / 1.5)
    with pytest.raises(ValueError):
        a.weight(-1, "constant")


def test_the_steps_of_as_many_updates_as_the_rounds():
    assert a.steps(5, 4, 2) == 10 and a.steps(5, 4, 3) == 7 and a.steps(5, 4, 1) == 20


def test_evaluation_every_n_steps_or_every_t_virtual_seconds_and_the_last_step():
    assert [a.due(s, 7, 3, "steps", 0.0, 0.0) for s in range(7)] == [False, False, True, False, False, True, True]
    times = [0.4, 1.1, 1.6, 2.2, 4.5, 4.7]  # every 2 s: the first step past 2 (2.2), past 4 (4.5), and the last
    evaluated, chosen = 0.0, []
    for s, now in enumerate(times):
        if a.due(s, len(times), 2, "seconds", now, evaluated):
            chosen.append(s)
            evaluated = now
    assert chosen == [3, 4, 5]


def test_who_starts_is_drawn_from_the_idle_alone_and_the_same_on_every_call():
    assert starters([1, 3], 2, seed=5, step=0) == [1, 3]  # room for all of them
    drawn = [starters([0, 2, 5, 7], 2, seed=5, step=s) for s in range(20)]
    assert all(len(d) == 2 and set(d) <= {0, 2, 5, 7} and d == sorted(d) for d in drawn)
    assert len({tuple(d) for d in drawn}) > 1 and drawn == [starters([0, 2, 5, 7], 2, seed=5, step=s) for s in range(20)]
    assert math.isclose(sum(2 in d for d in (starters([0, 2, 5, 7], 2, 9, s) for s in range(400))) / 400, 0.5, abs_tol=0.1)
