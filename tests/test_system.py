"""Clients that drop, lag and misbehave, end to end on the tiny model (docs/system.md): the server sees exactly the
uploads that arrived, per round in metrics.jsonl and TensorBoard, the accuracy against virtual time, a round with too
few uploads keeping the global state, an attacker's flipped labels, and every impossible setting in one line before
anything is loaded. (2 ranks = 1 and crash-and-resume: the shared cases fedur-stragglers, fedcopl-attacked,
promptfl-flipped-krum and fedur-scaled-clipped in tests/shared_runs.py.)"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedur.federated import streams

from .conftest import read_rounds, scalar_curve
from .shared_runs import SHARED

TINY = ["--config", "configs/tiny.yaml", "--run.progress", "false"]
WITNESS = ["--method", "tests.plugins.witness.Witness"]
LAGGING = ["--clock.drop_rate", "0.3", "--clock.speeds", "lognormal", "--clock.deadline", "1.0",
           "--clock.late", "partial"]


@pytest.fixture(scope="module")
def lagging(tmp_path_factory):
    """A Witness run with lost uploads, lognormal speeds and a deadline taking partial work, figures on."""
    from fedur.app.main import main

    run_dir = tmp_path_factory.mktemp("system") / "run"
    main([*TINY, *WITNESS, *LAGGING, "--run.figures", "true", "--run.output_dir", str(run_dir)])
    return run_dir


@pytest.mark.slow
def test_the_server_aggregates_exactly_the_uploads_that_arrived_in_time(lagging):
    rounds = read_rounds(lagging)
    seen_lost = seen_late = False
    for r in rounds:
        lost = np.flatnonzero(streams.lost(4, 0.3, 1, r["round"] - 1)).tolist()  # run.seed 1's per-round draws
        assert r["dropped"] == lost and r["asked"] == [0, 1, 2, 3]
        assert r["answered"] == [k for k in r["asked"] if k not in lost]
        assert r["accepted"] == [k for k in r["answered"] if k not in r["late"] or r["local_steps"][k] > 0]
        assert r["method"]["uploads"] == len(r["accepted"])  # the method's ServerRound holds them and no other
        assert r["method"]["who"] == sum(2 ** k for k in r["accepted"])
        assert all(r["loss"][k] is not None for k in lost)  # a lost upload's client trained all the same
        speeds = streams.client_factors(4, 1.0, 1, streams.SPEED)  # lognormal, spread 1, run.seed 1
        for k in r["late"]:  # partial work: the whole steps that end by the deadline (sending takes no time here)
            assert r["client_virtual_seconds"][k] > r["deadline_seconds"]
            assert r["local_steps"][k] == int(np.floor(r["deadline_seconds"] * speeds[k]))
        seen_lost, seen_late = seen_lost or bool(lost), seen_late or bool(r["late"])
        assert r["virtual_seconds"] == pytest.approx(min(r["deadline_seconds"], max(r["client_virtual_seconds"])))
    assert seen_lost and seen_late  # the run exercised both
    assert [r["virtual_clock"] for r in rounds] == pytest.approx(np.cumsum([r["virtual_seconds"] for r in rounds]).tolist())


def test_the_rounds_answers_reach_tensorboard_the_summary_and_a_figure(lagging):
    rounds = read_rounds(lagging)
    for tag, key in (("clients/accepted", "accepted"), ("clients/dropped", "dropped"), ("clients/late", "late")):
        assert [v for _, v in scalar_curve(lagging / "tensorboard", tag)] == [len(r[key]) for r in rounds]
    assert [v for _, v in scalar_curve(lagging / "tensorboard", "time/virtual_clock")] == \
        pytest.approx([r["virtual_clock"] for r in rounds], rel=1e-6)
    system = json.loads((lagging / "summary.json").read_text())["system"]
    assert system["accepted_uploads"] == sum(len(r["accepted"]) for r in rounds)
    assert system["dropped_uploads"] == sum(len(r["dropped"]) for r in rounds)
    assert system["virtual_seconds"] == rounds[-1]["virtual_clock"]
    assert (lagging / "accuracy_virtual_time.png").stat().st_size > 10_000


def test_a_round_with_too_few_uploads_keeps_the_global_state(run_main, tmp_path):
    result = run_main(*TINY, *WITNESS, "--clock.drop_rate", "0.6", "--clock.min_uploads", "3",
                      "--run.keep_checkpoints", "5", "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    rounds = read_rounds(tmp_path / "run")
    kept = [r for r in rounds if len(r["accepted"]) < 3]
    assert kept and all(r["kept_global"] and r["method"] == {} for r in kept)  # nothing aggregated
    assert all(not r["kept_global"] and r["method"]["uploads"] == len(r["accepted"]) for r in rounds if r not in kept)
    assert "(global kept)" in result.stdout
    shared = {r["round"]: torch.load(next((tmp_path / "run" / "checkpoints").glob(f"round_{r['round']:05d}")) / "global.pt")
              ["shared"]["visual"] for r in rounds}
    before = {r["round"]: shared.get(r["round"] - 1) for r in kept if r["round"] > 1}
    assert before and all(torch.equal(shared[n], value) for n, value in before.items())


def test_an_attacker_trains_on_flipped_pseudo_labels(run_main, tmp_path):
    flags = [*TINY, "--federation.rounds", "1", "--evaluation.global_model", "false"]
    honest = run_main(*flags, "--run.output_dir", str(tmp_path / "honest"))
    flipped = run_main(*flags, "--adversary.attackers", "1", "--adversary.attack", "label_flip",
                       "--run.output_dir", str(tmp_path / "flipped"))
    assert honest.returncode == 0 and flipped.returncode == 0, flipped.stderr
    attacker = streams.chosen(4, 1, 1)[0]  # run.seed 1's draw
    (a,), (b,) = read_rounds(tmp_path / "honest"), read_rounds(tmp_path / "flipped")
    assert b["selection"][attacker] == a["selection"][attacker][::-1]  # its counts of class C-1-c
    assert [row for k, row in enumerate(b["selection"]) if k != attacker] == \
        [row for k, row in enumerate(a["selection"]) if k != attacker]
    assert f"attackers [{attacker}] (label_flip" in flipped.stdout


@pytest.mark.parametrize(("flags", "says"), [
    (["--clock.drop_rate", "1"], "clock.drop_rate"),
    (["--adversary.attackers", "5", "--adversary.attack", "scale"], "at most every client can attack"),
    (["--adversary.attackers", "1"], "set both"),
    (["--clock.min_uploads", "5"], "no round could aggregate"),
    (["--clock.over_select", "0.5"], "join_rate 1 draws every client already"),
    (["--method", "GDAU", "--aggregator.rule", "median"], "sums its clients' statistics"),
    (["--method", "ZeroShot", "--adversary.attackers", "1", "--adversary.attack", "label_flip"], "ZeroShot has none"),
    (["--privacy.mode", "central", "--privacy.noise_multiplier", "1", "--clock.deadline", "0.9"],
     "who counts would follow a client's own number of local steps"),
    (["--privacy.mode", "central", "--privacy.noise_multiplier", "1", "--aggregator.rule", "median"],
     "a reducer of its own"),
    (["--clock.speeds", "no-such-file.json"], "no such file"),
])
@pytest.mark.slow
def test_a_setting_that_cannot_run_stops_in_one_line_before_anything_is_loaded(run_main, tmp_path, flags, says):
    result = run_main(*TINY, *flags, "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode != 0
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_deadline_no_upload_can_meet_stops_before_round_one(run_main, tmp_path):
    result = run_main(*TINY, "--clock.bandwidth", "10", "--clock.deadline", "1", "--clock.deadline_unit",
                      "seconds", "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode != 0 and "no upload could arrive in time" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow  # the shared runs (tests/shared_runs.py): whole runs, not the fast lane
def test_everything_off_is_the_default_and_changes_no_result(tiny_runs):
    """The shared FedUR case ran with every federation setting of this issue at its default: every asked client's
    upload taken, none lost, late or surplus, and the virtual clock counting local steps at 1 per second."""
    assert "--clock.drop_rate" not in SHARED
    for r in read_rounds(tiny_runs / "fedur"):
        assert r["accepted"] == r["asked"] == r["participants"]
        assert r["dropped"] == r["late"] == r["surplus"] == r["histograms_lost"] == [] and not r["kept_global"]
        assert r["virtual_seconds"] == max(r["local_steps"])
    assert "system" not in json.loads((tiny_runs / "fedur" / "summary.json").read_text())


def test_fedur_report_prints_who_answered_each_round_and_draws_accuracy_against_virtual_time(lagging, tmp_path):
    from fedur.app.report import main as report

    report([str(lagging), "--out", str(tmp_path / "report")])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Clients that answered (aggregator mean; docs/system.md)" in text
    section = text.split("Clients that answered")[1].split("\n\n")[1]  # its table
    rows = section.splitlines()[2:]  # below the header
    rounds = read_rounds(lagging)
    assert len(rows) == len(rounds)
    for line, r in zip(rows, rounds):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:6] == [str(r["round"]), *(str(len(r[k])) for k in ("asked", "answered", "dropped", "late", "accepted"))]
    assert "![accuracy_virtual_time](accuracy_virtual_time.png)" in text
    assert (tmp_path / "report" / "accuracy_virtual_time.png").stat().st_size > 0


def test_the_reports_virtual_time_lines_are_each_runs_clock_and_mean_accuracy():
    from fedur.app.report import Run, virtual_time_series

    def run(name, lost, clocks, accs):
        rows = [{"round": i + 1, "asked": [0, 1], "answered": [0, 1], "dropped": [1] if lost else [], "late": [],
                 "accepted": [0] if lost else [0, 1], "virtual_clock": c, "mean_accuracy": a}
                for i, (c, a) in enumerate(zip(clocks, accs))]
        return Run(Path(name), name, rows, {}, None, zero_shot={"zero_shot_client_mean": 50.0})

    lossy, whole = run("lossy", True, [2.0, 5.5], [60.0, 65.0]), run("whole", False, [3.0, 6.0], [61.0, 66.0])
    assert virtual_time_series([whole]) == {}  # every client answered: the table and the figure are left out
    assert virtual_time_series([lossy, whole]) == {"lossy": ([0.0, 2.0, 5.5], [50.0, 60.0, 65.0]),
                                                   "whole": ([0.0, 3.0, 6.0], [50.0, 61.0, 66.0])}
