"""A round on a virtual clock (system heterogeneity as FLGo and PFLlib simulate it), as pure math: how long each asked
client takes to train and send, who arrives by the deadline, who is cut short, who is taken.

A client's time is its local steps over its speed (steps per virtual second) plus its upload's bytes over its
bandwidth (bytes per virtual second; none: sending takes no time). A deadline, in virtual seconds or in units of
the round's median asked-client time, leaves out the uploads that would arrive after it ('drop'), or takes what a
late client finished by then ('partial': the steps it can take before the deadline leaves time to send).
Over-selection (Bonawitz et al. 2019, "Towards federated learning at scale", sec. 2.2) asks more clients than it needs
and takes the first `wanted` that arrive. Nothing here draws: who is lost, the speeds and the bandwidths come in
(fedur/federated/streams.py draws them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Deadline:
    """A round's deadline: `value` in virtual seconds or in units of the round's median asked-client time (`unit`
    'seconds' | 'median'); a late upload left out or its partial work taken (`late` 'drop' | 'partial')."""

    value: float
    unit: str = "median"
    late: str = "drop"


@dataclass(frozen=True)
class Arrivals:
    """Who of a round's asked clients the server takes, and when (rows are client ids; every rank the same)."""

    asked: Tensor  # (K,) bool: drawn to take part
    lost: Tensor  # (K,) bool: trained and sent, and the upload never arrived (clock.drop_rate)
    late: Tensor  # (K,) bool: would arrive after the deadline ('drop': left out; 'partial': cut short, see `budget`)
    surplus: Tensor  # (K,) bool: arrived in time, after the first `wanted` (over-selection): not taken
    accepted: Tensor  # (K,) bool: whose upload the server aggregates
    seconds: Tensor  # (K,) float64: each asked client's arrival time with all its steps (0: not asked)
    arrival: Tensor  # (K,) float64: when what the server took arrived (a partial client's, earlier; 0: not taken)
    budget: Tensor  # (K,) int64: the local steps each asked client takes (its planned steps, or fewer: partial)
    round_seconds: float  # the round's virtual duration: until the server stopped waiting
    deadline_seconds: float | None  # the round's deadline in virtual seconds (None: none)

    @property
    def answered(self) -> Tensor:
        """(K,) bool: asked, and the upload arrived (in time or late)."""
        return self.asked & ~self.lost


def client_seconds(steps: Tensor, speeds: Tensor, upload_bytes: float, bandwidths: Tensor | None) -> Tensor:
    """(K,) float64 virtual seconds to train `steps` local steps at `speeds` (steps per second) and send `upload_bytes`
    at `bandwidths` (bytes per second; None: sending is instant)."""
    seconds = steps.double() / speeds.double()
    return seconds if bandwidths is None else seconds + upload_bytes / bandwidths.double()


def median(values: Tensor) -> float:
    """The median of a 1-d tensor as NumPy takes it (the mean of the two middle values of an even count)."""
    return float(np.median(values.double().numpy()))


def deadline_seconds(deadline: float | None, unit: str, seconds: Tensor, asked: Tensor) -> float | None:
    """The round's deadline in virtual seconds: `deadline` as given ('seconds'), or times the median of the asked
    clients' times ('median': 0.8 leaves out the slower ones); None: no deadline."""
    if deadline is None:
        return None
    if unit == "seconds":
        return float(deadline)
    return float(deadline) * median(seconds[asked]) if bool(asked.any()) else 0.0


def arrivals(asked: Tensor, steps: Tensor, speeds: Tensor, upload_bytes: float, bandwidths: Tensor | None, lost: Tensor,
             deadline: Deadline | None = None, wanted: int | None = None) -> Arrivals:
    """Who arrives and who is taken in a round. `asked`, `lost`: (K,) bool; `steps`: (K,) int64 each client's planned
    local steps; `speeds`, `bandwidths`: (K,) as in `client_seconds`; `deadline`: None, none; `wanted`: take at most
    this many, the first to arrive (ties: the lower client id).

    The server waits until every asked client's upload is in (a lost one: until it would have been, when its loss
    shows), until the deadline, or until the `wanted`-th arrival, whichever comes first."""
    steps = steps.long()
    none = torch.zeros((), dtype=torch.float64, device="cpu")
    seconds = torch.where(asked, client_seconds(steps, speeds, upload_bytes, bandwidths), none)
    limit = None if deadline is None else deadline_seconds(deadline.value, deadline.unit, seconds, asked)
    sending = seconds - steps.double() / speeds.double()  # the upload's share of each one's time
    over = asked & ~lost & (seconds > limit) if limit is not None else torch.zeros_like(asked)
    budget = torch.where(asked, steps, torch.zeros_like(steps))
    arrival = seconds.clone()
    if limit is not None and deadline.late == "partial":  # the whole steps that end in time to send by the deadline
        can = torch.floor(((limit - sending) * speeds.double()).clamp_min(0)).long()
        budget = torch.where(over, torch.minimum(can, steps), budget)
        arrival = torch.where(over, budget.double() / speeds.double() + sending, arrival)
        taken = asked & ~lost & (~over | (budget > 0))  # a client that could take no step in time sends nothing useful
    else:
        taken = asked & ~lost & ~over
    surplus = torch.zeros_like(asked)
    if wanted is not None and int(taken.sum()) > wanted:
        order = sorted(torch.nonzero(taken).flatten().tolist(), key=lambda k: (float(arrival[k]), k))
        surplus[order[wanted:]] = True
        taken = taken & ~surplus
    arrival = torch.where(taken, arrival, torch.zeros((), dtype=torch.float64, device="cpu"))
    if wanted is not None and int(taken.sum()) == wanted and bool(surplus.any()):
        duration = float(arrival[taken].max())  # the wanted-th arrival: the server stops waiting
    else:
        duration = float(seconds[asked].max()) if bool(asked.any()) else 0.0
        duration = duration if limit is None else min(duration, limit)
    return Arrivals(asked=asked, lost=asked & lost, late=over, surplus=surplus, accepted=taken, seconds=seconds,
                    arrival=arrival, budget=budget, round_seconds=duration, deadline_seconds=limit)


def planned_steps(selected: Tensor, batch_size: int, local_epochs: int) -> Tensor:
    """(K,) int64 each client's local steps in a round: its epochs over its `selected` pseudo-labels in batches."""
    return torch.tensor([local_epochs * math.ceil(int(n) / batch_size) for n in selected.tolist()], dtype=torch.long, device="cpu")


def publicly(found: Arrivals, steps: Tensor, speeds: Tensor, upload_bytes: float, bandwidths: Tensor | None,
             deadline: float | None) -> Arrivals:
    """`found` as a clock that may read public quantities only decides it (privacy on): every asked client that is
    not lost is taken; a deadline (in virtual seconds) caps each one's local steps at those its speed finishes in time
    to send, floor((deadline - bytes / bandwidth) x speed), whatever its own number of steps (a client with no step in
    time sends its update of zero steps). `late` marks the clients the cap cut short (the run's own record, not a
    decision); the round lasts until the last arrival or the deadline. `steps`: (K,) each client's planned steps."""
    asked, lost = found.asked, found.lost
    sending = torch.zeros_like(found.seconds) if bandwidths is None else upload_bytes / bandwidths.double()
    planned = torch.where(asked, steps.long(), torch.zeros_like(steps.long()))
    budget = planned
    if deadline is not None:
        cap = torch.floor(((deadline - sending) * speeds.double()).clamp_min(0)).long()
        budget = torch.where(asked, torch.minimum(cap, planned), planned)
    taken = asked & ~lost
    arrival = torch.where(taken, budget.double() / speeds.double() + sending, torch.zeros((), dtype=torch.float64, device="cpu"))
    duration = float(arrival[taken].max()) if bool(taken.any()) else 0.0
    duration = max(duration, float(found.seconds[asked & lost].max()) if bool((asked & lost).any()) else 0.0)
    duration = duration if deadline is None else min(duration, float(deadline))
    return Arrivals(asked=asked, lost=lost, late=taken & (budget < planned), surplus=torch.zeros_like(asked), accepted=taken,
                    seconds=found.seconds, arrival=arrival, budget=budget, round_seconds=duration,
                    deadline_seconds=None if deadline is None else float(deadline))
