"""Preemption: SIGUSR1/SIGTERM ask the run to stop at the next safe point (after a round's checkpoint is
committed); under SLURM rank 0 then requeues the job, which resumes with `run.resume auto`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

SIGNALS = {"SIGUSR1": signal.SIGUSR1, "SIGTERM": signal.SIGTERM}


class StopRequest:
    """Records the first stop signal; the round loop polls it and the ranks agree on it."""

    def __init__(self, signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM")) -> None:
        self.received: str | None = None
        self._previous = {}
        for name in signals:
            self._previous[name] = signal.signal(SIGNALS[name], self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            print(f"fedur: received {self.received}: stopping after this round's checkpoint", file=sys.stderr, flush=True)

    def restore(self) -> None:
        for name, handler in self._previous.items():
            signal.signal(SIGNALS[name], handler)

    def __enter__(self) -> "StopRequest":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def requeue_slurm_job(requeue_on: tuple[str, ...], received: str) -> str | None:
    """`scontrol requeue $SLURM_JOB_ID` when the signal asks for it and the run is a SLURM job.

    Returns what was done, for the log. SIGTERM is not requeued by default: `scancel` sends it too.
    """
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
        job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if job_id is None or received not in requeue_on:
        return None
    if shutil.which("scontrol") is None:
        return f"not requeued: scontrol is not on PATH (SLURM job {job_id})"
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return f"requeue of SLURM job {job_id} failed: {result.stderr.strip() or result.stdout.strip()}"
    return f"requeued SLURM job {job_id}"
