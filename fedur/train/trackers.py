"""The trackers `run.loggers` names: where the recorder's stream (fedur/train/sinks.py: the scalars, the figures, the
config's text, and the settings with the final metrics) also goes, each a `Sink` beside TensorBoard's.

The recorder (rank 0 only, fedur/train/recorder.py) hands every sink the same calls, so each tracker receives the
same scalars at the same steps, the run's settings (config.yaml's text at step 0, read back as values where the
tracker keeps settings as values) and the figures:

- tensorboard (the default): RUN/tensorboard/ (fedur/train/sinks.py::TensorBoard).
- csv: RUN/csv/scalars.csv ("step,tag,value", a line per scalar; cut back to the kept rounds on resume), the figures
  as RUN/csv/images/<tag>/step_<step>.png, a text as RUN/csv/<tag>.txt, the settings and final metrics as
  RUN/csv/settings.json.
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
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedur.errors import ConfigError
from fedur.train.round_fields import CONFIG
from fedur.train.run_dir import writing
from fedur.train.sinks import Sink, TensorBoard

LIBRARIES = {"tensorboard": "tensorboard", "csv": None, "wandb": "wandb", "mlflow": "mlflow"}
RUN_ID = "fedur-run-id"  # a W&B or MLflow run's id, kept in its folder, so that a resumed run continues it


def check_trackers(names: list[str]) -> None:
    """Every tracker's library is installed (a ConfigError naming what to install)."""
    for name in names:
        library = LIBRARIES[name]
        if library is not None and importlib.util.find_spec(library) is None:
            raise ConfigError(f"run.loggers {name} needs {library}: pip install {library} (or pip install 'fedur[{name}]'), "
                              f"or leave {name} out of run.loggers")


def settings_of(tag: str, text: str) -> dict | None:
    """The settings the recorder's config text carries (config.yaml in a Markdown code fence, at step 0), as values;
    None for another text."""
    if tag != CONFIG:
        return None
    import yaml

    return yaml.safe_load(text.strip().removeprefix("```").removesuffix("```"))


class CSV:
    """RUN/csv/: scalars.csv, the figures, the texts and settings.json."""

    def __init__(self, root: Path, start_round: int) -> None:
        self.folder = root / "csv"
        self.path = self.folder / "scalars.csv"
        with writing(self.folder):
            self.folder.mkdir(exist_ok=True)
            if start_round and self.path.is_file():  # a resume: the rows of the kept rounds only
                with open(self.path, newline="") as f:
                    kept = [row for row in csv.reader(f) if row[0] == "step" or int(row[0]) <= start_round]
                with open(self.path, "w", newline="") as f:
                    csv.writer(f).writerows(kept)
            elif not self.path.is_file():
                self.path.write_text("step,tag,value\n")

    def scalars(self, values: dict[str, float], step: int) -> None:
        with writing(self.path), open(self.path, "a", newline="") as f:
            csv.writer(f).writerows((step, tag, repr(float(value))) for tag, value in values.items())

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        from fedur.plots import write_png

        path = self.folder / "images" / tag / f"step_{step}.png"
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_png(pixels, path)

    def text(self, tag: str, text: str, step: int) -> None:
        with writing(self.folder):
            (self.folder / f"{tag.replace('/', '_')}.txt").write_text(text)
            settings = settings_of(tag, text)
            if settings is not None:
                self._settings({"settings": settings})

    def finish(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        with writing(self.folder):
            self._settings({"settings": settings, "final": metrics, "step": step})

    def _settings(self, content: dict) -> None:
        (self.folder / "settings.json").write_text(json.dumps(content, indent=2) + "\n")


def _saved_id(folder: Path) -> str | None:
    path = folder / RUN_ID
    return path.read_text().strip() if path.is_file() else None


class WandB:
    """A Weights & Biases run in RUN/wandb/, offline unless WANDB_MODE says otherwise."""

    def __init__(self, root: Path, start_round: int) -> None:
        import wandb

        self.folder = root / "wandb"
        self.wandb = wandb
        with writing(self.folder):
            self.folder.mkdir(exist_ok=True)
            run_id = _saved_id(self.folder) or uuid.uuid4().hex[:16]  # a name, not a random draw of the run's
            self.run = wandb.init(
                mode=os.environ.get("WANDB_MODE", "offline"), dir=str(root), project=os.environ.get("WANDB_PROJECT", "fedur"),
                name=root.name, id=run_id, resume="allow",
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True),
            )
            (self.folder / RUN_ID).write_text(run_id + "\n")

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.run.log({tag: self.wandb.Image(pixels)}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        settings = settings_of(tag, text)
        if settings is not None:
            self.run.config.update(settings, allow_val_change=True)
        else:
            self.run.log({tag: self.wandb.Html(f"<pre>{text}</pre>")}, step=step)

    def finish(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        self.run.config.update(settings, allow_val_change=True)
        self.run.summary.update(metrics)
        self.run.finish(exit_code=0)


class MLflow:
    """An MLflow run: MLFLOW_TRACKING_URI's, or a file store in RUN/mlruns/."""

    def __init__(self, root: Path, start_round: int) -> None:
        from mlflow.tracking import MlflowClient

        self.folder = root / "mlruns"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:  # the local file store, which MLflow 3 keeps behind an opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = self.folder.resolve().as_uri()
        with writing(self.folder):
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

    def scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, float(value), now, step) for tag, value in values.items()]
        with writing(self.folder):
            for start in range(0, len(metrics), 1000):  # MLflow takes 1,000 metrics per batch
                self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        with writing(self.folder):
            self.client.log_image(self.run_id, pixels, key=tag, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        from mlflow.entities import Param

        settings = settings_of(tag, text)
        with writing(self.folder):
            if settings is None:
                self.client.log_text(self.run_id, text, f"{tag.replace('/', '_')}.txt")
                return
            params = [Param(key, str(value)[:6000]) for key, value in flatten(settings).items()]
            logged = self.client.get_run(self.run_id).data.params  # a resume: MLflow refuses to change a param
            params = [p for p in params if p.key not in logged]
            for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
                self.client.log_batch(self.run_id, params=params[start:start + 100])
            self.client.log_text(self.run_id, text.strip().removeprefix("```").removesuffix("```").strip() + "\n", "config.yaml")

    def finish(self, settings: dict, metrics: dict[str, float], step: int) -> None:
        self.scalars(metrics, step)  # (the settings are the run's params already)
        with writing(self.folder):
            self.client.set_terminated(self.run_id, "FINISHED")


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


TRACKERS = {"csv": CSV, "wandb": WandB, "mlflow": MLflow}


def open_trackers(names: list[str], root: Path, start_round: int, note: Callable[[str], None] = print) -> list[Sink]:
    """The sinks of `names` (run.loggers, in that order) on the run directory `root`; `start_round` > 0: a resume
    (TensorBoard purges the steps after it, `note` saying where it cannot)."""
    sinks = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            sinks.append(TensorBoard(root / "tensorboard", start_round + 1 if start_round else None, note))
        else:
            sinks.append(TRACKERS[name](root, start_round))
    return sinks
