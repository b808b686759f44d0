"""What every stage of the channel is (fedur/channel/__init__.py composes them in one order).

A stage is a module of fedur/channel/ holding
- `GROUP`, the name of its settings group, and `CONFIG`, that group's dataclass (its fields with a docstring each: the
  `--<group>.<key>` of the command line; fedur/config.py holds one field of it), or None where the group is another's;
- `refusals(stages, method, labeller)`: each line that refuses what it cannot do with the other stages (`stages`: every
  stage's settings, fedur/channel/__init__.py::Stages), the method or its labeller, with the reason;
- `build(settings, building)`: the stage (a `Stage`, whose hooks pass what they are given on unless the stage acts on
  it) from its settings and what every stage is built from (`Building`).
A stage acts on a client's send before it leaves its rank (`leave`, in the channel's order) or on the gathered rows at
the server (`release`, in the same order), and says what it does in the run's first lines (`describe`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from fedur.privacy import Privacy


@dataclass(frozen=True)
class Stages:
    """A run's stage settings, each its own group (fedur/config.py holds them; fedur/channel/__init__.py::GROUPS): what
    the stages' `refusals` and `build` read."""

    groups: dict  # {group: its settings}, one per stage of the channel's ORDER that has a group of its own
    privacy_mode: str = "none"  # privacy.mode: none | central | local

    def __getattr__(self, group: str):  # stages.clock, stages.adversary, ...
        try:
            return self.__dict__["groups"][group]
        except KeyError:
            raise AttributeError(group) from None  # internal: attribute lookup (getattr with a default reads it)


@dataclass(frozen=True)
class Exchange:
    """What the server side of a round's exchange knows beside the rows (every rank the same)."""

    current: dict[str, Tensor]  # each shared piece as the clients downloaded it
    expected: dict[str, Tensor]  # every name a client sends (its shared pieces and messages), its shape and dtype
    drawn: int  # the clients asked (privacy's denominator, m)
    round_idx: int  # from 0
    staleness: Tensor | None = None  # (K,) int64 an asynchronous server step's: how many versions each taken upload's
    # base is behind the current one (None: a synchronous round)


@dataclass(frozen=True)
class Building:
    """What a stage is built from beside its settings (every rank the same)."""

    stages: Stages  # every stage's settings (a stage may read another's: Krum's f is the adversary's count)
    num_clients: int  # the federation's training clients
    seed: int  # run.seed: the draws every rank makes alike
    batch_size: int  # optim.batch_size: a client's local steps are its epochs over its pseudo-labels in these batches
    local_epochs: int  # federation.local_epochs
    privacy: Privacy | None  # the run's mechanism and its ledger (None: privacy off)
    join_rate: float = 1.0  # federation.join_rate (how many a round asks: an asynchronous server's concurrency)


class Stage:
    """A stage of the channel: every hook passes what it is given on; a stage overrides the hooks where it acts."""

    @property
    def active(self) -> bool:
        """Whether the stage does anything in this run."""
        return False

    def describe(self) -> list[str]:
        """Its pieces of the run's "clients: ..." line."""
        return []

    def leave(self, client_id: int, round_idx: int, upload: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
        """What client `client_id` sends in round `round_idx` (from 0) of `upload`, on its rank (`current`: the shared
        pieces it downloaded)."""
        return upload

    def release(self, rows: dict[str, Tensor], weights: Tensor, exchange: Exchange) -> tuple[dict[str, Tensor], Tensor, dict]:
        """(the rows, {name: (K, *shape)}, their (K,) weights, the stage's metrics of the round) from what the stage
        before it handed on."""
        return rows, weights, {}


def wanted(join_rate: float, num_clients: int) -> int:
    """How many uploads a round takes: ceil(join_rate x N) (over-selection asks more and takes these first)."""
    return math.ceil(join_rate * num_clients) if join_rate < 1 else num_clients
