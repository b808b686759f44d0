"""The recorder (run files, TensorBoard, resume) and the progress display, on hand-written rounds."""

import io
import json

import numpy as np
import pytest
import torch

from fedur.data.partition import class_histogram
from fedur.federated.placement import placement_table
from fedur.train.progress import Progress, eta_seconds, format_duration
from fedur.train.recorder import Recorder, summary_table
from fedur.train.run_dir import RunDir, RunDirError

from ..conftest import REPO, scalar_curve, tensorboard_events


def row(round_idx: int, accuracy: list[float | None], rounds: int = 4, selected=(5, 3)) -> dict:
    refreshed = round_idx % 2 == 0
    return {
        "round": round_idx + 1, "rounds": rounds, "mean_accuracy": float(np.mean([a for a in accuracy if a is not None])),
        "client_accuracy": accuracy, "pseudo_label_accuracy": [80.0, 60.0], "selected": list(selected),
        "selected_per_class": [4, 2, 2], "selection": [[3, 1, 1], [1, 1, 1]] if refreshed else None,
        "class_weights": [0.5, 1.25, 1.25] if refreshed else None, "refreshed": refreshed, "participants": [0, 1],
        "lr": 0.1, "loss": [1.0, 2.0], "loss_pos": [0.5, 1.5], "loss_neg": [0.5, 0.5], "round_seconds": 10.0,
        "bytes_sent": [100, 100],
    }


ACCURACY = [[20.0, 40.0], [30.0, 50.0], [60.0, 45.0], [50.0, 55.0]]  # (round, client)
ZERO_SHOT = torch.tensor([[1, 10], [3, 10]])  # (K, 2) correct, total: 10% and 30%


def test_resume_continues_metrics_and_tensorboard_as_if_never_stopped(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder in (straight, resumed):
        folder.mkdir()
    loggers = ("tensorboard", "csv")
    recorder = Recorder(RunDir(straight), enabled=True, loggers=loggers)
    recorder.record_zero_shot(ZERO_SHOT)
    for r, acc in enumerate(ACCURACY):
        recorder.record_round(row(r, acc))
    recorder.finish({"seed": 1}, {})

    stopped = Recorder(RunDir(resumed), enabled=True, loggers=loggers)  # stops after round index 2, in the middle of writing round 3
    stopped.record_zero_shot(ZERO_SHOT)
    for r, acc in enumerate(ACCURACY[:2] + [[99.0, 99.0]]):  # round 2 logged, then lost with the checkpoint
        stopped.record_round(row(r, acc))
    stopped.sinks[0].flush()
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "mean_acc')

    history = RunDir(resumed).history(2, cut=True)  # the last checkpoint holds rounds 0 and 1
    again = Recorder(RunDir(resumed), True, history, start_round=2, loggers=loggers)
    assert [r["round"] for r in again.rounds] == [1, 2] and again.zero_shot == recorder.zero_shot
    assert len((resumed / "metrics.jsonl").read_text().splitlines()) == 2
    again.record_zero_shot(ZERO_SHOT)  # logged before: not again
    for r in (2, 3):
        again.record_round(row(r, ACCURACY[r]))
    again.finish({"seed": 1}, {})

    assert (resumed / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()
    assert json.loads((resumed / "summary.json").read_text()) == json.loads((straight / "summary.json").read_text())
    expected = [(0, 20.0), (1, 30.0), (2, 40.0), (3, 52.5), (4, 52.5)]
    assert scalar_curve(straight / "tensorboard", "accuracy/mean", digits=4) == expected
    assert scalar_curve(resumed / "tensorboard", "accuracy/mean", digits=4) == expected  # 99.0 at step 3 is purged
    for run in (straight, resumed):  # the CSV tracker's too: its rows after the kept rounds cut on resume
        rows = [line.split(",") for line in (run / "csv" / "scalars.csv").read_text().splitlines()[1:]]
        assert [(int(s), round(float(v), 4)) for s, tag, v in rows if tag == "accuracy/mean"] == expected


class StillClock:
    """time.time and time.sleep of a machine whose clock stands still but for sleeps."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_resume_in_the_second_of_the_interrupted_writer_is_read_after_it(tmp_path, monkeypatch):
    """TensorBoard reads a run's event files in name order, events.out.tfevents.<second>.<host>.<pid>.<counter>; in one
    process, within one second, the order is the counter's as text: a resumed writer numbered 10 after an interrupted
    one numbered 9 would be read first, and TensorBoard would show the interrupted run's points after the resumed
    ones (the purge_step of the resumed file comes before them). The resumed writer waits for the next second."""
    import time

    from tensorboard.summary.writer import event_file_writer

    clock = StillClock(1_700_000_000.25)  # both writers in this second, unless one waits
    monkeypatch.setattr(time, "time", clock.time)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))  # ".9", then ".10"
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    stopped = Recorder(RunDir(resumed), enabled=True)
    stopped.record_zero_shot(ZERO_SHOT)
    for r, acc in enumerate(ACCURACY[:2] + [[99.0, 99.0]]):  # round 3 logged, then lost with the checkpoint
        stopped.record_round(row(r, acc))
    stopped.sinks[0].flush()
    again = Recorder(RunDir(resumed), True, RunDir(resumed).history(2, cut=True), start_round=2)
    for r in (2, 3):
        again.record_round(row(r, ACCURACY[r]))
    again.finish({"seed": 1}, {})

    files = [p.name for p in (resumed / "tensorboard").glob("events.out.tfevents.*")]
    by_name = sorted(files)
    assert [name.rsplit(".", 1)[1] for name in by_name] == ["9", "10"], by_name  # the order they were written in
    assert scalar_curve(resumed / "tensorboard", "accuracy/mean", digits=4) == [(0, 20.0), (1, 30.0), (2, 40.0), (3, 52.5),
                                                                                (4, 52.5)]


def test_a_resume_behind_the_interrupted_machines_clock_says_so_without_waiting(tmp_path, monkeypatch):
    """Event files named 10 minutes ahead (another machine's clock): waiting would not do, the run says what it means."""
    import time

    from fedur.train.sinks import TensorBoard

    clock = StillClock(1_700_000_000.0)
    monkeypatch.setattr(time, "time", clock.time)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    (tmp_path / "events.out.tfevents.1700000600.elsewhere.4242.0").write_bytes(b"")
    said = []
    TensorBoard(tmp_path, purge_step=3, note=said.append)
    assert clock.now == 1_700_000_000.0 and len(said) == 1
    assert "600 s ahead of this machine's clock" in said[0] and "values from step 3 on" in said[0]


def test_resume_without_the_rounds_it_needs_says_so(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row(0, ACCURACY[0])) + "\n")
    (tmp_path / "zero_shot.json").write_text("{}")
    with pytest.raises(RunDirError, match="holds only 1 complete rounds"):
        RunDir(tmp_path).history(2, cut=True)
    with pytest.raises(RunDirError, match="missing"):
        RunDir(tmp_path / "elsewhere").history(1, cut=False)


@pytest.mark.parametrize("figures", [True, False], ids=["figures", "numbers only"])
def test_run_files_and_tensorboard_tags(tmp_path, capsys, figures):
    recorder = Recorder(RunDir(tmp_path), enabled=True, figures=figures)  # run.figures
    train_hist = class_histogram(np.array([0, 0, 2, 1, 1]), [np.array([0, 1, 2]), np.array([3, 4])], 3)
    test_hist = class_histogram(np.array([2, 0, 0]), [np.array([0]), np.array([1, 2])], 3)
    assert train_hist.tolist() == [[2, 0, 1], [0, 2, 0]] and test_hist.tolist() == [[0, 0, 1], [2, 0, 0]]
    recorder.start("seed: 1\n", "two clients")
    recorder.record_placement(placement_table(2, [(0, 0)], None))
    recorder.record_partition({"classnames": ["cat", "dog", "owl"], "train": train_hist.tolist(), "test": test_hist.tolist(),
                               "train_sizes": [3, 2], "test_sizes": [1, 2], "client_names": None,
                               "train_ids": [[0, 1, 2], [3, 4]], "test_ids": [[0], [1, 2]]})
    recorder.record_zero_shot(ZERO_SHOT)
    recorder.record_round(row(0, ACCURACY[0], rounds=1))
    confusion = torch.tensor([[[2, 0, 0], [0, 0, 1], [0, 0, 0]], [[0, 0, 0], [1, 1, 0], [0, 0, 3]]])  # (K, C, C)
    recorder.record_confusion(confusion, ["cat", "dog", "owl"])
    recorder.finish({"optim": {"lr": 0.1}}, {"wall_seconds": 3.0})

    assert json.loads((tmp_path / "placement.json").read_text())["ranks"] == [
        {"rank": 0, "node": 0, "local_rank": 0, "clients": [0, 1]}
    ]
    assert json.loads((tmp_path / "partition.json").read_text())["train"] == [[2, 0, 1], [0, 2, 0]]
    saved = json.loads((tmp_path / "confusion.json").read_text())
    assert saved["matrix"] == [[2, 0, 0], [1, 1, 1], [0, 0, 3]] and saved["round"] == 1
    assert json.loads((tmp_path / "zero_shot.json").read_text())["zero_shot_client_accuracy"] == [10.0, 30.0]
    events = tensorboard_events(tmp_path / "tensorboard")
    images = {"partition/train": [0], "partition/test": [0], "pseudo_labels/selection": [1], "confusion/final": [1]}
    assert events["images"] == (images if figures else {})
    assert {"pseudo_labels/class_weight_000", "pseudo_labels/selected_total", "comm/bytes_cumulative",
            "loss/loss_neg_mean", "hparams/final_mean_accuracy"} <= set(events["scalars"])
    assert "config/text_summary" in events["text"] and "_hparams_/experiment" in events["hparams"]
    out = capsys.readouterr().out
    assert "rank 0 (node 0, local rank 0) hosts clients [0, 1]" in out
    assert "round   1/1  acc 30.00%" in out and "eta 0s" in out
    pngs = {"partition_train.png", "partition_test.png"} if figures else set()
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.yaml", "placement.json", "partition.json", *pngs,
        "zero_shot.json", "metrics.jsonl", "confusion.json", "summary.json", "tensorboard",
    }


def test_only_rank_zero_records(tmp_path, capsys):
    """The other ranks keep the rounds (for the summary they return) but write and print nothing."""
    recorder = Recorder(RunDir(tmp_path), enabled=False)
    recorder.start("seed: 1\n", "two clients")
    recorder.record_zero_shot(ZERO_SHOT)
    recorder.record_round(row(0, ACCURACY[0], rounds=1))
    summary = recorder.finish({"seed": 1}, {})
    assert summary["final_mean_accuracy"] == 30.0 and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == ""


def test_a_run_directory_refuses_undeclared_files(tmp_path):
    """Every output goes through RunDir.path, so `run.resume auto` knows every file a run can leave."""
    run_dir = RunDir(tmp_path)
    assert run_dir.path("prompts/client_000.pt") == tmp_path / "prompts" / "client_000.pt"
    assert run_dir.path("config.resumed-at-round-3.yaml").name == "config.resumed-at-round-3.yaml"
    with pytest.raises(KeyError, match="declare it in fedur/train/run_dir.py LAYOUT"):
        run_dir.path("notes.txt")


def test_summary_table_per_client_and_mean():
    rounds = [row(r, acc) for r, acc in enumerate(ACCURACY)]
    assert summary_table(rounds, [10.0, 30.0]).splitlines() == [
        "client  zero-shot  final   best  at round  selected",
        "     0      10.00  50.00  60.00         3         5",
        "     1      30.00  55.00  55.00         4         3",
        "  mean      20.00  52.50  52.50         3         4",
    ]


def test_eta_and_durations():
    assert eta_seconds(30.0, 3, 7) == 70.0 and eta_seconds(5.0, 0, 7) is None
    assert [format_duration(s) for s in (None, 4.4, 725, 11220)] == ["?", "4s", "12m05s", "3h07m"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_on_a_log_file_prints_a_status_line_per_interval():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(enabled=True, stream=stream, interval=25.0, clock=clock)
    for _ in progress.iterate(range(2), "rounds", total=3, initial=1):  # one round done before a resume
        for _ in progress.iterate(range(4), "client 0 epochs"):
            clock.now += 10.0
    assert stream.getvalue().splitlines() == [
        "progress: rounds 1/3 > client 0 epochs 3/4 (10s left)",  # t=30
        "progress: rounds 2/3 (20s left) > client 0 epochs 2/4 (20s left)",  # t=60: 40 s per round, 20 s into this one
    ]
    assert progress.tasks == []


def test_progress_bars_on_a_terminal_and_silence_when_off(capsys):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    progress = Progress(enabled=True, stream=terminal)
    for _ in progress.iterate(range(3), "rounds"):
        progress.write("round line")
    assert "rounds: 100%" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert capsys.readouterr().out.count("round line") == 3

    quiet, items = Progress(enabled=False, stream=terminal), object()
    assert list(quiet.iterate([items], "rounds")) == [items] and not quiet.tasks


def test_a_checkpoint_older_than_a_setting_counts_as_its_old_behaviour():
    """A run recorded before optim.schedule, method.weighting or pFedPrompt's cache switches existed ran as their
    ADDED_SETTINGS values say: equal to those now it is unchanged, other values now are a change."""
    from fedur.train.run_dir import ABSENT, ADDED_SETTINGS, changed_settings

    old = {"method": "fedur.methods.PFedPrompt", "optim.lr": 0.1}
    legacy = {"method": "fedur.methods.PFedPrompt", "optim.lr": 0.1, "optim.schedule": "cosine", "method.weighting": "selected",
              "method.cache_shots": None, "method.cache_self_vote": True, "method.cache_alpha_scale": "none"}
    assert changed_settings(old, legacy) == {}
    now = {**legacy, "method.cache_shots": 16, "method.cache_self_vote": False, "optim.schedule": "constant"}
    assert changed_settings(old, now) == {"method.cache_shots": (None, 16), "method.cache_self_vote": (True, False),
                                          "optim.schedule": ("cosine", "constant")}
    assert changed_settings(old, {**legacy, "method.mu": 0.5}) == {"method.mu": (ABSENT, 0.5)}  # not an added setting
    assert changed_settings({**legacy, "optim.schedule": "constant"}, legacy) == {"optim.schedule": ("constant", "cosine")}
    from fedur.app.cli import parse_config
    from fedur.config import result_settings

    cfg = parse_config(["--config", str(REPO / "configs" / "tiny.yaml"), "--method", "PFedPrompt", "--labeller", "CoDPL"])
    assert set(ADDED_SETTINGS) <= set(result_settings(cfg.settings)), "each is a real setting's flat key"
