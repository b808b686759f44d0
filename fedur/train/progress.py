"""What rank 0 shows while a run works: nested progress bars with the time left on a terminal; on a log
file (SLURM, `> log`), a status line at most every `interval` seconds instead of bars, which would
fill the file with carriage returns. The other ranks show nothing (the round loop builds their
Progress disabled).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def eta_seconds(elapsed: float, done: int, remaining: int) -> float | None:
    """Time left at the mean pace of the `done` items so far; None before the first item."""
    return elapsed / done * remaining if done > 0 else None


def format_duration(seconds: float | None) -> str:
    """45s, 12m05s, 3h07m; '?' when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Task:
    """One open loop: `done` counts `initial` items finished before it started (e.g. before a resume)."""

    desc: str
    total: int | None
    done: int
    initial: int
    started: float
    last_done: float  # when the latest item finished

    def status(self, now: float) -> str:
        if self.total is None:
            return f"{self.desc} {self.done}"
        left = eta_seconds(self.last_done - self.started, self.done - self.initial, self.total - self.done)
        if left is not None:  # the item under way has already used part of its share
            left = max(left - (now - self.last_done), 0.0)
        return f"{self.desc} {self.done}/{self.total}" + (f" ({format_duration(left)} left)" if left is not None else "")


class Progress:
    def __init__(
        self,
        enabled: bool,
        stream: TextIO | None = None,
        interval: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.bars = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval, self.clock = interval, clock
        self.tasks: list[_Task] = []  # the open loops, outermost first
        self.last_line = clock()

    def iterate(self, items: Iterable[T], desc: str, total: int | None = None, initial: int = 0) -> Iterator[T]:
        """Yield `items` while showing `desc` done/total with the time left; `total` defaults to
        initial + len(items)."""
        if not self.enabled:
            yield from items
            return
        if total is None and hasattr(items, "__len__"):
            total = initial + len(items)
        now = self.clock()
        task = _Task(desc, total, initial, initial, now, now)
        self.tasks.append(task)
        try:
            if self.bars:  # nested bars; inner ones vanish when done, the outermost stays
                with tqdm(items, desc=desc, total=total, initial=initial, file=self.stream,
                          leave=len(self.tasks) == 1, dynamic_ncols=True) as bar:
                    yield from bar
                return
            for item in items:
                yield item
                task.done, task.last_done = task.done + 1, self.clock()
                self._status_line()
        finally:
            self.tasks.remove(task)

    def _status_line(self) -> None:
        now = self.clock()
        if now - self.last_line < self.interval:
            return
        self.last_line = now
        print("progress: " + " > ".join(t.status(now) for t in self.tasks), file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """Print a line on stdout (e.g. the per-round line) without tearing the bars; it also restarts
        the status-line interval."""
        if self.bars and self.tasks:
            tqdm.write(line, file=sys.stdout)
        else:
            print(line, flush=True)
        if self.enabled:
            self.last_line = self.clock()


QUIET = Progress(enabled=False)  # the default of library calls: shows nothing and holds no state
