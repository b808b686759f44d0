"""run.loggers: one tiny run logged to TensorBoard, CSV, Weights & Biases (offline) and MLflow (a local file store),
each read back from its own files: the same scalars at the same steps, the run's settings and the figures. A tracker
whose library is missing is skipped here with its reason, and refused by the command before any compute."""

import csv
import glob
import importlib.util
import json
import struct
from pathlib import Path

import pytest
import yaml

from fedur.errors import ConfigError
from fedur.train import trackers
from fedur.train.trackers import CSV, check_trackers, flatten
from tests.conftest import scalar_curve

INSTALLED = {name: lib is None or importlib.util.find_spec(lib) is not None for name, lib in trackers.LIBRARIES.items()}
NEEDS = {name: pytest.mark.skipif(not INSTALLED[name], reason=f"{trackers.LIBRARIES[name]} is not installed: "
                                  f"pip install 'fedur[{name}]' to test run.loggers {name}") for name in INSTALLED}
SLOW = pytest.mark.slow  # the tests that read the logged run back: one whole run with every tracker, 13 s
RUN = ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--federation.local_epochs", "1",
       "--federation.num_clients", "2", "--run.progress", "false", "--run.figures", "true"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A tiny run (2 rounds, the figures on) logged to every tracker whose library is here."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    names = [name for name in trackers.LIBRARIES if INSTALLED[name]]
    out = tmp_path_factory.mktemp("trackers") / "run"
    run(parse_config([*RUN, "--run.output_dir", str(out), "--run.loggers", json.dumps(names)]))
    return out


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard")).Reload()
    return {tag: scalar_curve(out / "tensorboard", tag) for tag in events.Tags()["scalars"]}


def csv_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list] = {}
    with open(out / "csv" / "scalars.csv", newline="") as f:
        for row in csv.DictReader(f):
            found.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    return found


def wandb_records(out: Path) -> list:
    """Every record of the offline W&B run's .wandb file (W&B's LevelDB-style log: 7-byte header, then 32 KiB blocks of
    (crc, length, type) chunks, each record a wandb_internal_pb2.Record)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))[0]).read_bytes()
    block, position, chunks, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:
            position += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:  # the block's padding
            position += room
            continue
        chunks += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or its last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def wandb_history(out: Path) -> dict[int, dict]:
    history = {}
    for record in wandb_records(out):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
    return history


def mlflow_client(out: Path):
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # (the tracker set it in the process that wrote the store)
    return MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri()), (out / "mlruns" / "fedur-run-id").read_text().strip()


def same(curve, other) -> bool:
    """Two [(step, value)] curves: the same steps, the same values to TensorBoard's float32."""
    return [s for s, _ in curve] == [s for s, _ in other] and [v for _, v in curve] == pytest.approx([v for _, v in other], rel=1e-6)


@SLOW
def test_tensorboard_gets_the_rounds(logged):
    rows = [json.loads(line) for line in (logged / "metrics.jsonl").read_text().splitlines()]
    curve = tensorboard_scalars(logged)["accuracy/mean"]
    assert [step for step, _ in curve] == [0, 1, 2] and curve[-1][1] == pytest.approx(rows[-1]["mean_accuracy"])


@SLOW
def test_csv_has_tensorboards_scalars_settings_and_figures(logged):
    board, table = tensorboard_scalars(logged), csv_scalars(logged)
    assert set(table) == set(board) - {t for t in board if t.startswith("hparams/")} and len(table) > 20
    assert all(same(table[tag], board[tag]) for tag in table)
    settings = json.loads((logged / "csv" / "settings.json").read_text())
    assert settings["settings"] == yaml.safe_load((logged / "config.yaml").read_text())
    assert settings["final"]["hparams/final_mean_accuracy"] == json.loads((logged / "summary.json").read_text())["final_mean_accuracy"]
    assert (logged / "csv" / "images" / "partition" / "train" / "step_0.png").is_file()
    assert (logged / "csv" / "images" / "confusion" / "final" / "step_2.png").is_file()


@SLOW
@NEEDS["wandb"]
def test_wandb_offline_has_the_same_scalars_settings_and_figures(logged):
    history = wandb_history(logged)
    for tag, curve in tensorboard_scalars(logged).items():
        if not tag.startswith("hparams/"):
            assert same([(step, history[step][tag]) for step, _ in curve], curve), tag
    assert history[0]["partition/train/_type"] == "image-file" and history[2]["confusion/final/_type"] == "image-file"
    run = next(r.run for r in wandb_records(logged) if r.WhichOneof("record_type") == "run")
    config = {item.key: json.loads(item.value_json) for r in wandb_records(logged)
              if r.WhichOneof("record_type") in ("run", "config")
              for item in (r.run.config.update if r.WhichOneof("record_type") == "run" else r.config.update)}
    assert run.run_id == (logged / "wandb" / "fedur-run-id").read_text().strip() and run.display_name == "run"
    assert config["model"]["name"] == "fedur-tiny" and config["run"]["loggers"][0] == "tensorboard"
    assert config == {k: v for k, v in yaml.safe_load((logged / "config.yaml").read_text()).items()} | {"_wandb": {}}


@SLOW
@NEEDS["mlflow"]
def test_mlflow_file_store_has_the_same_scalars_settings_and_figures(logged):
    client, run_id = mlflow_client(logged)
    for tag, curve in tensorboard_scalars(logged).items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, tag))
        assert same(history, curve), tag
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "fedur-tiny"
    assert run.data.params["dataset.class_path"] == "fedur.data.datasets.Synthetic"
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    images = [a.path for a in client.list_artifacts(run_id, "images")]
    assert "config.yaml" in artifacts and any(p.startswith("images/partition~train+step+0") for p in images)


def test_csv_resumes_from_its_kept_rounds(tmp_path):
    tracker = CSV(tmp_path, 0)
    for step in range(4):
        tracker.scalars({"a": float(step), "b": 1.5}, step)
    again = CSV(tmp_path, 2)  # a resume after round 2: its steps 3 and on are dropped
    again.scalars({"a": 30.0}, 3)
    rows = (tmp_path / "csv" / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,tag,value" and [r.split(",")[0] for r in rows[1:]] == ["0", "0", "1", "1", "2", "2", "3"]
    assert rows[-1] == "3,a,30.0"


def test_a_missing_library_is_refused_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"run.loggers wandb needs wandb: pip install wandb \(or pip install 'fedur\[wandb\]'\)"):
        check_trackers(["csv", "wandb"])
    check_trackers(["csv"])  # nothing to install


def test_settings_flatten_to_dotted_params():
    assert flatten({"model": {"name": "x", "n_ctx": 4}, "method": {"class_path": "A", "init_args": {}}, "tags": []}) == {
        "model.name": "x", "model.n_ctx": 4, "method.class_path": "A", "method.init_args": {}, "tags": []}
