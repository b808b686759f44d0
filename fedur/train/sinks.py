"""Where the recorder's stream goes, on rank 0: the scalars ({tag: value} at a step: fedur/train/round_fields.py
declares the tags), the figures, the config's text, and the settings with the final metrics. TensorBoard is fedur's
one sink; another tracker (W&B, MLflow, a CSV file) is another class with these methods, opened beside it in
`Recorder.open_sinks`."""

from __future__ import annotations

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


class TensorBoard:
    """The run's tensorboard/ folder, through Lightning's TensorBoardLogger. A resumed run (`purge_step`: the first
    step it logs) reopens the folder; TensorBoard then drops what the interrupted run logged at or after that step."""

    def __init__(self, folder: Path, purge_step: int | None = None) -> None:
        from lightning.fabric.loggers import TensorBoardLogger

        self.folder = folder
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
