"""Preemption: SIGUSR1/SIGTERM ask the run to stop at the next safe point (after a round's checkpoint is
committed); under SLURM rank 0 then requeues the job, which resumes with `run.resume auto`.

If the round does not end in time, rank 0 requeues anyway `requeue_deadline` seconds after the signal:
SLURM then ends the job, and the requeued job repeats that round from the last commit. Without this a
job whose rounds outlast the signal's lead time would hit its time limit and never come back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

SIGNALS = {"SIGUSR1": signal.SIGUSR1, "SIGTERM": signal.SIGTERM}


class StopRequest:
    """Records the first stop signal; the round loop polls it and the ranks agree on it.

    `requeue_on`: the signals after which this process requeues the SLURM job (rank 0 passes
    run.requeue_on, the other ranks nothing).
    """

    def __init__(
        self,
        signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM"),
        requeue_on: tuple[str, ...] = (),
        requeue_deadline: float = 60.0,
    ) -> None:
        self.received: str | None = None
        self.requeue_on, self.requeue_deadline = requeue_on, requeue_deadline
        self.requeued: str | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._previous = {name: signal.signal(SIGNALS[name], self._handle) for name in signals}

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:
            return
        self.received = signal.Signals(signum).name
        print(f"fedur: received {self.received}: stopping after this round's checkpoint", file=sys.stderr, flush=True)
        if self.received in self.requeue_on:
            self._timer = threading.Timer(self.requeue_deadline, self._requeue_late)
            self._timer.daemon = True
            self._timer.start()

    def _requeue_late(self) -> None:
        print(
            f"fedur: the round did not end within run.requeue_deadline={self.requeue_deadline:g}s of {self.received}; "
            "requeueing now (the job resumes from the last committed round)",
            file=sys.stderr, flush=True,
        )
        outcome = self.requeue()
        if outcome:
            print(f"fedur: {outcome}", file=sys.stderr, flush=True)

    def requeue(self) -> str | None:
        """Requeue the SLURM job once, if a requeue signal arrived; returns what was done, for the log."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self.requeued is not None or self.received not in self.requeue_on:
                return None
            self.requeued = requeue_slurm_job() or "not a SLURM job: nothing to requeue"
            return self.requeued

    def restore(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for name, handler in self._previous.items():
            signal.signal(SIGNALS[name], handler)

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def requeue_slurm_job() -> str | None:
    """`scontrol requeue` of this SLURM job (array task included); None when not under SLURM."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
        job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if job_id is None:
        return None
    if shutil.which("scontrol") is None:
        return f"not requeued: scontrol is not on PATH (SLURM job {job_id})"
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return f"requeue of SLURM job {job_id} failed: {result.stderr.strip() or result.stdout.strip()}"
    return f"requeued SLURM job {job_id}"
