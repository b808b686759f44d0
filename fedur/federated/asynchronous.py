"""An asynchronous server on the virtual clock, as pure math: who trains from which global version, when each
update arrives, which arrivals a server step applies and how stale they are, and the staleness functions that weigh
them (FedBuff: Nguyen et al., "Federated learning with buffered asynchronous aggregation", AISTATS 2022; FedAsync:
Xie, Koyejo and Gupta, "Asynchronous federated optimization", 2019).

The server keeps up to `concurrency` clients training. A client starts from the global version it downloads then
and arrives `seconds` later (fedur/federated/clock.py::client_seconds: its local steps over its speed, its upload
over its bandwidth). A server step takes the next `buffer` arrivals in time (ties: the lower client id; FedAsync:
one), applies them to the current version (each one's staleness: how many versions its base is behind it) and makes
the next version, at the time of the last of them. The arrivals then wait, idle, and after the step as many idle
clients start from the new version as the concurrency has room for (drawn by the caller, uniformly from the idle
ones: fedur/federated/streams.py::starters). Nothing here draws or trains: the durations come in.

A hand-worked sequence (tests/federated/test_asynchronous.py, docs/asynchronous.md): four clients of speeds 1, 2, 4
and 0.5 steps per second, one step per job, concurrency 4, buffer 2. At 0 all start from version 0 and would arrive
at 1, 0.5, 0.25 and 2; step 1 takes clients 2 and 1 (0.25, 0.5; staleness 0, 0) at 0.5, and they start again from
version 1 (arriving at 0.75 and 1.0); step 2 takes client 2 (0.75, staleness 0) and client 0 (1.0, from version 0:
staleness 1, before client 1's 1.0 by its lower id) at 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Job:
    """One client's local training, from its start to its arrival (virtual seconds)."""

    client: int
    number: int  # the client's jobs before this one (from 0): its own round (its data order, schedule and refreshes)
    version: int  # the global version it trains from (the steps the server had applied when it started)
    start: float
    arrival: float

    def as_list(self) -> list:
        return [self.client, self.number, self.version, self.start, self.arrival]


@dataclass(frozen=True)
class Events:
    """The asynchronous server between two steps (every rank the same; checkpointed with the run)."""

    jobs: tuple[int, ...]  # (N,) each training client's jobs started so far
    version: int = 0  # the global version: the steps applied so far
    now: float = 0.0  # virtual seconds: the time of the last step (0 before the first)
    flying: tuple[Job, ...] = ()  # the jobs training, in the order they started
    evaluated: float = 0.0  # the virtual time of the last evaluation (server.evaluate_unit seconds)

    def idle(self) -> list[int]:
        """The clients not training, ascending."""
        busy = {job.client for job in self.flying}
        return [k for k in range(len(self.jobs)) if k not in busy]

    def state_dict(self) -> dict:
        """Plain numbers and lists: what global.pt holds (weights_only)."""
        return {"jobs": list(self.jobs), "version": self.version, "now": self.now,
                "flying": [job.as_list() for job in self.flying], "evaluated": self.evaluated}

    @classmethod
    def from_state(cls, state: dict) -> Events:
        return cls(tuple(int(j) for j in state["jobs"]), int(state["version"]), float(state["now"]),
                   tuple(Job(int(c), int(n), int(v), float(s), float(a)) for c, n, v, s, a in state["flying"]),
                   float(state["evaluated"]))


def begin(num_clients: int) -> Events:
    """A server before any client has started: version 0 at virtual time 0."""
    return Events(jobs=(0,) * num_clients)


def start(events: Events, clients: list[int], seconds: list[float]) -> Events:
    """`clients` (idle ones) start at the current time from the current version, client k arriving `seconds[k]`
    later; each is its own next job."""
    busy = {job.client for job in events.flying}
    if busy & set(clients) or len(set(clients)) != len(clients):
        raise ValueError(f"clients {sorted(clients)} cannot start: {sorted(busy & set(clients))} are training")  # internal: the idle start
    jobs, flying = list(events.jobs), list(events.flying)
    for client, duration in zip(clients, seconds):
        flying.append(Job(client, jobs[client], events.version, events.now, events.now + float(duration)))
        jobs[client] += 1
    return replace(events, jobs=tuple(jobs), flying=tuple(flying))


def take(events: Events, buffer: int) -> tuple[tuple[Job, ...], Events]:
    """The next server step: (the `buffer` earliest arrivals in arrival order, ties to the lower client id; the events
    after it: the next version at the last arrival's time, those jobs no longer in flight)."""
    if not 0 < buffer <= len(events.flying):
        raise ValueError(f"a step of {buffer} arrivals with {len(events.flying)} clients training")  # internal: refused
    order = sorted(events.flying, key=lambda job: (job.arrival, job.client))
    arrivals, left = tuple(order[:buffer]), set(order[buffer:])
    flying = tuple(job for job in events.flying if job in left)
    return arrivals, replace(events, version=events.version + 1, now=max(events.now, arrivals[-1].arrival), flying=flying)


def staleness(arrivals: tuple[Job, ...], version: int) -> list[int]:
    """Each arrival's staleness when applied to `version`: how many versions its base is behind."""
    return [version - job.version for job in arrivals]


def weight(tau: int, function: str, exponent: float = 0.5, hinge_a: float = 10.0, hinge_b: int = 4) -> float:
    """s(tau), an arrival's weight at staleness `tau` (Xie et al. 2019, sec. 5.2): 'constant' 1; 'polynomial'
    (1 + tau)^-a with a = `exponent` (FedBuff's 1 / sqrt(1 + tau) at a = 0.5); 'hinge' 1 for tau <= b, else
    1 / (a (tau - b) + 1) with a = `hinge_a`, b = `hinge_b`."""
    if tau < 0:
        raise ValueError(f"staleness {tau} < 0")  # internal: a base is never ahead of the server
    if function == "constant":
        return 1.0
    if function == "polynomial":
        return float((1.0 + tau) ** -exponent)
    if function == "hinge":
        return 1.0 if tau <= hinge_b else 1.0 / (hinge_a * (tau - hinge_b) + 1.0)
    raise ValueError(f"unknown staleness function {function!r}")  # internal: server.staleness's Literal refuses it


def steps(rounds: int, per_round: int, buffer: int) -> int:
    """The server steps that apply as many client updates as `rounds` rounds of `per_round` clients:
    ceil(rounds x per_round / buffer)."""
    return math.ceil(rounds * per_round / buffer)


def due(step: int, steps: int, every: float, unit: str, now: float, evaluated: float) -> bool:
    """Whether step `step` (from 0, of `steps`) evaluates: every `every` steps (unit 'steps'; the step number from 1
    a multiple of it), or the first step at or past each multiple of `every` virtual seconds since the last evaluation
    at `evaluated` (unit 'seconds'); the last step always."""
    if step == steps - 1:
        return True
    if unit == "steps":
        return (step + 1) % max(1, round(every)) == 0
    return math.floor(now / every) > math.floor(evaluated / every)
