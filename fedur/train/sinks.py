"""Where the recorder's stream goes, on rank 0: the scalars ({tag: value} at a step: fedur/train/round_fields.py
declares the tags), the figures, the config's text, and the settings with the final metrics. TensorBoard is fedur's
one sink; another tracker (W&B, MLflow, a CSV file) is another class with these methods, opened beside it in
`Recorder.open_sinks`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from fedur.train.run_dir import writing


class Sink(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None:
        """Finite numbers only (the recorder leaves out None, inf and nan)."""

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        """(H, W, 3) uint8."""

    def text(self, tag: str, text: str, step: int) -> None: ...

    def finish(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        """The run's end: its settings with its final metrics (none present: the settings are not logged)."""


EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)\.")  # tensorboard's EventFileWriter: .<second>.<host>.<pid>.<n>


def after_earlier_event_files(folder: Path, patience: float = 5.0) -> float:
    """Wait until this machine's clock is past the second that every event file in `folder` is named after, so that
    a writer opened now names its file after theirs; return how far the newest is ahead of the clock beyond
    `patience` seconds, without waiting (0.0: none is).

    TensorBoard (its Python loader and its data server alike) reads a run's event files in name order,
    events.out.tfevents.<second>.<host>.<pid>.<n> (n: the process's count of writers so far), and a resumed writer's
    purge_step hides what the interrupted one logged at and after that step only from the files read before its own.
    Within one second the names order by host, pid and then n as text (".10" before ".9"): a run resumed in the
    process and the second of the interrupted writer (a test, a notebook, a driver that resumes in-process) would be
    read first, and TensorBoard would draw the interrupted run's lost rounds after the resumed ones."""
    seconds = [int(m.group(1)) for p in folder.glob("events.out.tfevents.*") if (m := EVENT_FILE.match(p.name))]
    if not seconds:
        return 0.0
    newest = max(seconds)
    if newest - time.time() > patience:
        return newest - time.time()
    while time.time() < newest + 1:  # under a second within one process
        time.sleep(newest + 1 - time.time())
    return 0.0


class TensorBoard:
    """The run's tensorboard/ folder, through Lightning's TensorBoardLogger. A resumed run (`purge_step`: the first
    step it logs) reopens the folder, in a file named after the interrupted run's (`after_earlier_event_files`);
    TensorBoard then drops what the interrupted run logged at or after that step. `note`: where a warning goes."""

    def __init__(self, folder: Path, purge_step: int | None = None, note: Callable[[str], None] = print) -> None:
        from lightning.fabric.loggers import TensorBoardLogger

        self.folder = folder
        if purge_step:
            ahead = after_earlier_event_files(folder)
            if ahead:
                note(f"warning: {folder} holds event files named {ahead:.0f} s ahead of this machine's clock (another "
                     "machine's): TensorBoard reads a run's files in name order, so it will draw the interrupted run's "
                     f"values from step {purge_step} on after this run's (metrics.jsonl is right); set the clocks right "
                     "(NTP) before resuming")
        purge = {"purge_step": purge_step} if purge_step else {}  # passed on to SummaryWriter
        self.logger = TensorBoardLogger(root_dir=str(folder.parent), name="", version=folder.name, **purge)

    def scalars(self, values: dict[str, float], step: int) -> None:
        with writing(self.folder):
            self.logger.log_metrics(values, step=step)

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        with writing(self.folder):
            self.logger.experiment.add_image(tag, pixels, step, dataformats="HWC")

    def text(self, tag: str, text: str, step: int) -> None:
        with writing(self.folder):
            self.logger.experiment.add_text(tag, text, step)

    def finish(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        with writing(self.folder):
            if metrics:  # the settings with the final metrics, for TensorBoard's HPARAMS tab
                self.logger.log_hyperparams(settings, metrics, step=step)
            self.logger.finalize("success")

    def flush(self) -> None:
        self.logger.experiment.flush()
