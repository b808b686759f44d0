"""Where a run's scalars, settings and figures go beside its own files: the trackers `run.loggers` names.

The Recorder (rank 0 only, fedur/train/recorder.py) hands every tracker the same five calls: `config` (the resolved
settings, at step 0), `scalars` (a step's scalars: metrics.jsonl's numbers, TensorBoard's tags), `image` (a figure,
(H, W, 3) uint8), `final` (the settings with the final metrics, after the last round) and `close`. So each tracker
receives the same scalars, the run's settings and the figures:

- tensorboard (the default): Lightning's TensorBoardLogger in RUN/tensorboard/; a resumed run purges the steps after
  the last kept round.
- csv: RUN/csv/scalars.csv ("step,tag,value", a line per scalar; cut back to the kept rounds on resume), the figures
  as RUN/csv/images/<tag>/step_<step>.png, the settings and final metrics as RUN/csv/settings.json.
- wandb: Weights & Biases, offline unless WANDB_MODE says otherwise (`wandb sync RUN/wandb/offline-run-*` uploads it
  later); project WANDB_PROJECT or "fedur", the run named after its directory; a resumed run continues the same W&B
  run (its id in RUN/wandb/fedur-run-id; W&B ignores steps it already has).
- mlflow: MLflow's tracking client; MLFLOW_TRACKING_URI, or a local file store in RUN/mlruns/ (MLFLOW_ALLOW_FILE_STORE
  is set for it: MLflow 3 asks for that opt-in); experiment MLFLOW_EXPERIMENT_NAME or "fedur"; the settings as
  params, the figures as images, config.yaml as an artifact; a resumed run logs into the same MLflow run (its id in
  RUN/mlruns/fedur-run-id).

A tracker whose library is not installed is refused before any compute (`check_trackers`), naming what to install.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import uuid
from pathlib import Path

import numpy as np

from fedur.errors import ConfigError

LIBRARIES = {"tensorboard": "tensorboard", "csv": None, "wandb": "wandb", "mlflow": "mlflow"}
RUN_ID = "fedur-run-id"  # a W&B or MLflow run's id, kept in its folder, so that a resumed run continues it


def check_trackers(names: list[str]) -> None:
    """Every tracker's library is installed (a ConfigError naming what to install)."""
    for name in names:
        library = LIBRARIES[name]
        if library is not None and importlib.util.find_spec(library) is None:
            raise ConfigError(f"run.loggers {name} needs {library}: pip install {library} (or pip install 'fedur[{name}]'), "
                              f"or leave {name} out of run.loggers")


class Tracker:
    """One destination of the run's scalars, settings and figures; `folder` is where it writes (error messages)."""

    folder: Path

    def config(self, text: str, settings: dict) -> None:
        """The run's resolved settings (config.yaml's text and its values), at the start."""

    def scalars(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError  # internal: every tracker takes scalars

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        """A figure: (H, W, 3) uint8 pixels."""

    def final(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        """The settings with the run's final metrics, after the last round."""

    def close(self, status: str) -> None:
        """"success" at the end of a run."""


class TensorBoard(Tracker):
    def __init__(self, root: Path, start_round: int) -> None:
        from lightning.fabric.loggers import TensorBoardLogger

        self.folder = root / "tensorboard"
        purge = {"purge_step": start_round + 1} if start_round else {}  # passed on to SummaryWriter
        self.logger = TensorBoardLogger(root_dir=str(root), name="", version="tensorboard", **purge)

    def config(self, text: str, settings: dict) -> None:
        self.logger.experiment.add_text("config", f"```\n{text}\n```", 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.logger.log_metrics(values, step=step)

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.logger.experiment.add_image(tag, pixels, step, dataformats="HWC")

    def final(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        if metrics:  # the settings with the final metrics, for TensorBoard's HPARAMS tab
            self.logger.log_hyperparams(settings, metrics, step=step)

    def close(self, status: str) -> None:
        self.logger.finalize(status)


class CSV(Tracker):
    def __init__(self, root: Path, start_round: int) -> None:
        self.folder = root / "csv"
        self.folder.mkdir(exist_ok=True)
        self.path = self.folder / "scalars.csv"
        if start_round and self.path.is_file():  # a resume: the rows of the kept rounds only
            with open(self.path, newline="") as f:
                kept = [row for row in csv.reader(f) if row[0] == "step" or int(row[0]) <= start_round]
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerows(kept)
        elif not self.path.is_file():
            self.path.write_text("step,tag,value\n")

    def scalars(self, values: dict[str, float], step: int) -> None:
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerows((step, tag, repr(float(value))) for tag, value in values.items())

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        from fedur.plots import write_png

        path = self.folder / "images" / tag / f"step_{step}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_png(pixels, path)

    def config(self, text: str, settings: dict) -> None:
        self._write_settings({"settings": settings})

    def final(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        self._write_settings({"settings": settings, "final": metrics, "step": step})

    def _write_settings(self, content: dict) -> None:
        (self.folder / "settings.json").write_text(json.dumps(content, indent=2) + "\n")


def _saved_id(folder: Path) -> str | None:
    path = folder / RUN_ID
    return path.read_text().strip() if path.is_file() else None


class WandB(Tracker):
    def __init__(self, root: Path, start_round: int) -> None:
        import wandb

        self.folder = root / "wandb"
        self.folder.mkdir(exist_ok=True)
        self.wandb = wandb
        run_id = _saved_id(self.folder) or uuid.uuid4().hex[:16]  # a name, not a random draw of the run's
        self.run = wandb.init(
            mode=os.environ.get("WANDB_MODE", "offline"), dir=str(root), project=os.environ.get("WANDB_PROJECT", "fedur"),
            name=root.name, id=run_id, resume="allow",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True),
        )
        (self.folder / RUN_ID).write_text(run_id + "\n")
        self.start_round = start_round

    def config(self, text: str, settings: dict) -> None:
        self.run.config.update(settings, allow_val_change=True)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.run.log({tag: self.wandb.Image(pixels)}, step=step)

    def final(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        self.run.config.update(settings, allow_val_change=True)
        self.run.summary.update(metrics)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "success" else 1)


class MLflow(Tracker):
    def __init__(self, root: Path, start_round: int) -> None:
        from mlflow.tracking import MlflowClient

        self.folder = root / "mlruns"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:  # the local file store, which MLflow 3 keeps behind an opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = self.folder.resolve().as_uri()
        self.folder.mkdir(exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        run_id = _saved_id(self.folder)
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedur")
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run_id = self.client.create_run(experiment_id, run_name=root.name).info.run_id
            (self.folder / RUN_ID).write_text(run_id + "\n")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def config(self, text: str, settings: dict) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:6000]) for key, value in flatten(settings).items()]
        logged = self.client.get_run(self.run_id).data.params  # a resume: MLflow refuses to change a param
        params = [p for p in params if p.key not in logged]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_text(self.run_id, text, "config.yaml")

    def scalars(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, float(value), now, step) for tag, value in values.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes 1,000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.client.log_image(self.run_id, pixels, key=tag, step=step)

    def final(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        self.scalars(metrics, step)  # (the settings are the run's params already)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if status == "success" else "FAILED")


def flatten(settings: dict, prefix: str = "") -> dict:
    """{"model.name": "ViT-B-32", ...}: nested settings as dotted keys (a plugin as its class path and init_args)."""
    flat = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


TRACKERS = {"tensorboard": TensorBoard, "csv": CSV, "wandb": WandB, "mlflow": MLflow}


def open_trackers(names: list[str], root: Path, start_round: int) -> list[Tracker]:
    """The trackers `names` (run.loggers, in that order) on the run directory `root`; `start_round` > 0: a resume."""
    return [TRACKERS[name](root, start_round) for name in dict.fromkeys(names)]
