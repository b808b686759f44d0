"""An asynchronous server's runs (fedur/train/asynchronous.py): the hand-worked event sequence of four clients of known
speeds against the run's record, jobs in flight from older versions at a checkpoint and a SIGKILL there resumed to the
same bits, the FedAsync case's draws and evaluations, FedBuff with every client at once being FedAvg up to float
rounding; and the refresh of a client alone with the others' last histograms, on hand-written counts. (2 ranks = 1 and
the crash-and-resume of both cases: tests/test_methods.py and tests/test_resume.py, on tests/shared_runs.py.)"""

import json

import pytest
import torch

from fedur.train.refresh import Refresh, Stale

from ..conftest import read_rounds
from ..shared_runs import SHARED, SPECIAL


def refresh(estimated, selected, hits=None) -> Refresh:
    estimated, selected = torch.tensor(estimated), torch.tensor(selected)
    return Refresh(estimated=estimated, quotas=selected, selected=selected, label_hits=hits, class_weights=None)


def test_a_client_refreshing_alone_reads_the_others_last_histograms():
    last = refresh([[4, 0], [1, 3], [2, 2]], [[3, 0], [1, 2], [2, 1]], torch.tensor([[3, 3], [2, 3], [1, 3]]))
    stale = Stale.of(last, torch.tensor([True, False, True]))  # client 1 refreshes; 0 and 2 stand by their last
    total, count = stale.estimates(torch.tensor([0, 5]), 1)  # client 1's fresh estimate
    assert total.tolist() == [6, 7] and count == 3
    total, heard = stale.selected(torch.tensor([1, 1]), torch.tensor([False, True, False]))
    assert total.tolist() == [6, 2] and heard.tolist() == [True, True, True]
    fresh = [torch.tensor([[0, 0], [0, 5], [0, 0]]), torch.tensor([[0, 0], [1, 1], [0, 0]]),
             torch.tensor([[0, 0], [1, 1], [0, 0]]), torch.tensor([[0, 0], [2, 2], [0, 0]]), None]
    estimated, quotas, selected, hits, agreed = stale.rows(*fresh)
    assert estimated.tolist() == [[4, 0], [0, 5], [2, 2]] and selected.tolist() == [[3, 0], [1, 1], [2, 1]]
    assert hits.tolist() == [[3, 3], [2, 2], [1, 3]] and agreed is None
    alone = Stale.of(None, torch.tensor([True, False, True]))  # without Ask.others: the members alone, as before
    assert alone.estimates(torch.tensor([0, 5]), 1)[1] == 1 and alone.rows(*fresh)[0] is fresh[0]


# The hand-worked sequence (docs/asynchronous.md, tests/federated/test_asynchronous.py): speeds 1, 2, 4, 0.5, one step
# a job, buffer 2: each step's (version, arrived, staleness, arrived at, started, virtual clock).
HAND_WORKED = [(1, [2, 1], [0, 0], [0.25, 0.5], [1, 2], 0.5), (2, [2, 0], [0, 1], [0.75, 1.0], [0, 2], 1.0),
               (3, [1, 2], [1, 0], [1.0, 1.25], [1, 2], 1.25), (4, [2, 1], [0, 0], [1.5, 1.75], [1, 2], 1.75)]


@pytest.mark.slow
def test_the_runs_record_is_the_hand_worked_sequence(tiny_runs):
    rows = read_rounds(tiny_runs / "fedur-fedbuff")
    assert all(sum(1 for s in r["selected"] if s) == 4 and r["arrival_steps"] == [1, 1] for r in rows)  # one step a job
    got = [(r["version"], r["arrived"], r["staleness"], r["arrival_seconds"], r["started"], r["virtual_clock"]) for r in rows]
    assert got == HAND_WORKED
    assert all(r["in_flight"] == [0, 1, 2, 3] for r in rows)
    assert [r["step_sizes"] for r in rows][1] == [1.0, pytest.approx(2 ** -0.5)]  # FedBuff's 1 / sqrt(1 + s)
    summary = json.loads((tiny_runs / "fedur-fedbuff" / "summary.json").read_text())
    assert summary["system"]["server"] == {"mode": "fedbuff", "concurrency": 4, "buffer": 2, "steps": 4, "arrivals": 8,
                                           "staleness_mean": 0.25, "staleness_max": 1}
    assert summary["system"]["virtual_seconds"] == 1.75


@pytest.mark.slow
def test_a_checkpoint_holds_the_jobs_in_flight_from_older_versions(tiny_runs):
    """After step 1 (version 1, at 0.5 s) clients 0 and 3 still train from version 0 and clients 2 and 1 from version
    1: what tests/test_resume.py's crash before the second commit resumes from."""
    state = torch.load(tiny_runs / "fedur-fedbuff" / "checkpoints" / "round_00001" / "global.pt", weights_only=True)
    events = state["flights"]["events"]
    assert events["version"] == 1 and events["now"] == 0.5 and events["jobs"] == [1, 2, 2, 1]
    assert events["flying"] == [[0, 0, 0, 0.0, 1.0], [3, 0, 0, 0.0, 2.0], [1, 1, 1, 0.5, 1.0], [2, 1, 1, 0.5, 0.75]]
    assert set(state["flights"]["class_weights"]) == {"0", "1", "2", "3"}


@pytest.mark.slow
def test_a_sigkill_with_jobs_in_flight_on_two_ranks_resumes_on_one_to_the_same_bits(tiny_runs, tmp_path):
    from fedur.app.cli import parse_config
    from fedur.app.run import run
    from fedur.train import checkpoint

    from ..test_resume import assert_same_run, launch, timed_output

    run_dir, flags = tmp_path / "run", [*SHARED, *SPECIAL["fedur-fedbuff"]]
    killed = launch([*flags, "--run.output_dir", str(run_dir)], fabric_ranks=2, fault="kill:commit:3:1")
    out, _ = timed_output(killed)
    assert killed.returncode != 0 and "injected fault: kill at commit of round 3 on rank 1" in out, out[-2000:]
    assert checkpoint.latest(run_dir).round_idx == 1  # step 2 committed, with clients 1 and 3 in flight from versions 1, 0
    run(parse_config([*flags, "--run.output_dir", str(run_dir), "--run.resume", "true"]))
    assert_same_run(run_dir, tiny_runs / "fedur-fedbuff")


@pytest.mark.slow
def test_fedasync_draws_who_starts_from_the_idle_and_evaluates_every_second_step(tiny_runs):
    rows = read_rounds(tiny_runs / "promptfl-fedasync")
    assert len(rows) == 6  # ceil(2 rounds x 3 clients at once / 1)
    for row in rows:
        assert len(row["arrived"]) == 1 and len(row["in_flight"]) == 3 and len(row["started"]) == 1
        assert (row["mean_accuracy"] is None) == (row["round"] % 2 == 1)  # steps 2, 4, 6
        tau = row["staleness"][0]
        assert row["step_sizes"] == [pytest.approx(0.6 * (1.0 if tau <= 1 else 1 / (10 * (tau - 1) + 1)))]
        assert row["loss"][row["arrived"][0]] is not None and sum(v is not None for v in row["loss"]) == 1
    for before, row in zip(rows, rows[1:]):  # who starts was idle: not among those still training
        assert not set(row["started"]) & (set(before["in_flight"]) - set(row["arrived"]))
    assert [r["virtual_clock"] for r in rows] == sorted(r["virtual_clock"] for r in rows)


@pytest.mark.slow
def test_fedbuff_with_every_client_at_once_is_synchronous_fedavg_up_to_float_rounding(tiny_runs, tmp_path):
    """Every client starts after every step, each step waits for all of them with staleness 0 and lr 1: the same
    refreshes, data orders and schedules as the synchronous run, each step's new version x + (mean of u_k - x)."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    run(parse_config([*SHARED, "--server.mode", "fedbuff", "--server.buffer", "4", "--server.staleness", "constant",
                      "--clock.speeds", "lognormal", "--run.output_dir", str(tmp_path / "run")]))
    steps, rounds = read_rounds(tmp_path / "run"), read_rounds(tiny_runs / "fedur")
    assert len(steps) == len(rounds) == 2 and all(r["staleness"] == [0, 0, 0, 0] for r in steps)
    assert steps[0]["selected"] == rounds[1]["selected"]  # a step's line: the refresh of the jobs that start after it
    assert all(s["loss"] == pytest.approx(r["loss"], rel=1e-5) for s, r in zip(steps, rounds))  # what trained
    for k in range(4):
        got, want = (torch.load(d / "prompts" / f"client_{k:03d}.pt", weights_only=True) for d in (tmp_path / "run",
                                                                                                   tiny_runs / "fedur"))
        assert all(torch.allclose(got[name], want[name], atol=1e-6) for name in ("visual", "text_ctx")), k


@pytest.mark.slow
def test_the_label_free_estimates_and_choice_run_on_the_steps_that_evaluate(tmp_path):
    """Know-without-labels under an asynchronous server: a step that evaluates records the estimates (the others have
    none), and each client's label-free choice is zero-shot CLIP or a model of a step that evaluated, saved and checked
    against the recorded estimates at the end (fedur/train/label_free.py::check_and_save_choice)."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    run_dir = tmp_path / "run"
    run(parse_config([*SHARED, "--server.mode", "fedbuff", "--server.buffer", "2", "--server.evaluate_every", "3",
                      "--clock.speeds", "lognormal", "--data.validation_fraction", "0.2", "--evaluation.select",
                      "label_free", "--run.output_dir", str(run_dir)]))
    steps = read_rounds(run_dir)
    evaluated = [s["round"] for s in steps if s.get("estimated_accuracy") is not None]
    assert evaluated == [s["round"] for s in steps if s["mean_accuracy"] is not None] and len(evaluated) < len(steps)
    choice = json.loads((run_dir / "summary.json").read_text())["label_free_choice"]["clients"]
    assert len(choice) == 4 and all(c["round"] in [0, *evaluated] for c in choice)
    assert all((c["model"] == "zero_shot") == (c["round"] == 0) for c in choice)
    assert sorted(p.name for p in (run_dir / "prompts" / "chosen").iterdir()) == [f"client_{k:03d}.pt" for k in range(4)]
