"""Test-only fault injection: crash or hang one rank at a named point of a round, so the tests can show what
a real failure there leaves behind. Set in the environment, never in the settings:

    FEDUR_FAULT="<action>:<point>:<round>:<rank>"
      action  kill (SIGKILL, no cleanup) | raise (an exception) | hang (sleep; peers must time out)
      point   train  (after the rank's first unit of clients of the round has trained)
              commit (after the rank wrote its client checkpoint files, before the commit marker)
              adapt  (after a new client of the rank adapted, evaluation.new_clients; its round: the last + 1)
      round   the round's number, counted from 1 as everywhere a user reads (kill:train:3:0: in the third round)

The round loop and the checkpoint call `point(...)` where these are; without FEDUR_FAULT it does nothing. Under
torchrun a fault strikes the first attempt only (TORCHELASTIC_RESTART_COUNT 0 or unset): the workers torchrun
restarts run on, as after a real failure.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from fedur.errors import ConfigError

ENV = "FEDUR_FAULT"
ACTIONS = ("kill", "raise", "hang")
POINTS = ("train", "commit", "adapt")


class InjectedFault(RuntimeError):
    """Raised by the `raise` action."""


@dataclass(frozen=True)
class Fault:
    action: str
    point: str
    round: int  # its number, from 1
    rank: int

    @classmethod
    def parse(cls, spec: str) -> Fault:
        parts = spec.split(":")
        if len(parts) != 4 or parts[0] not in ACTIONS or parts[1] not in POINTS or not all(p.isdigit() for p in parts[2:]):
            raise ConfigError(
                f"{ENV}={spec!r}: expected <action>:<point>:<round>:<rank> with action in {ACTIONS} "
                f"and point in {POINTS}, e.g. kill:train:1:1"
            )
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))

    def trigger(self, point: str, round_idx: int, rank: int) -> None:
        if (point, round_idx + 1, rank) != (self.point, self.round, self.rank):
            return
        print(f"fedur: injected fault: {self.action} at {point} of round {self.round} on rank {rank}", flush=True)
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "raise":
            raise InjectedFault(f"injected fault at {point} of round {self.round} on rank {rank}")  # internal: the test-only injected fault
        while True:  # hang
            time.sleep(60)


def injected() -> Fault | None:
    """The fault FEDUR_FAULT asks for (None: none, or a worker torchrun restarted); a ConfigError for a malformed one."""
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return Fault.parse(spec)


def point(name: str, round_idx: int, rank: int) -> None:
    """A place where a fault may be injected: `name` of the round with index `round_idx` (from 0) on global rank
    `rank`."""
    fault = injected()
    if fault is not None:
        fault.trigger(name, round_idx, rank)
