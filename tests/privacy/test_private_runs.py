"""Runs with privacy on, end to end on the tiny model: epsilon in every round's line as the library composes the run's
releases by hand, the stop before a round that would pass a target, a refusal before anything is loaded, and
privacy off recording no privacy setting. (2 ranks = 1 and crash-and-resume with noise on: the shared cases
fedur-private-central and scaffold-private-local in tests/shared_runs.py.)"""

import io
import json
import math
import shutil
from contextlib import redirect_stderr, redirect_stdout

import dp_accounting
import pytest
from dp_accounting import rdp

from fedur.config import Config, result_settings

from ..conftest import MainResult, read_rounds, scalar_curve

TINY = ["--config", "configs/tiny.yaml", "--run.progress", "false"]
CENTRAL = ["--privacy.mode", "central", "--privacy.noise_multiplier", "2", "--federation.join_rate", "0.75"]


def library_epsilon(rounds: int, refreshes: int) -> float:
    """The tiny run's releases composed by hand: 3 of its 4 clients drawn without replacement each round (z = 2 on
    a sum of sensitivity 2C: 1), and at each refresh CoDPL's two histograms (z_h = 2 on non-negative histograms,
    sensitivity sqrt(2) B: sqrt(2))."""
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(4, 3, dp_accounting.GaussianDpEvent(1.0)), rounds)
    acc.compose(dp_accounting.GaussianDpEvent(2 / math.sqrt(2)), 2 * refreshes)
    return acc.get_epsilon(1e-5)


def main_in_process(*args: str) -> MainResult:
    """run_main's call for a module-scoped fixture (run_main is per test): the entry point in this process."""
    from fedur.app.main import main

    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))  # reconfigurable
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
    return MainResult(code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())


@pytest.fixture(scope="module")
def central(tmp_path_factory):
    """The tiny run with central privacy, its 4 rounds uninterrupted, the noise seed drawn (the default): (its
    directory, what it printed). Read by the tests below; the ones that resume work on a copy or on a run of their own."""
    run_dir = tmp_path_factory.mktemp("central") / "run"
    result = main_in_process(*TINY, *CENTRAL, "--run.output_dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    return run_dir, result


@pytest.mark.slow
def test_every_rounds_epsilon_is_the_librarys_composition_of_the_runs_releases(central):
    run_dir, result = central
    assert "privacy central: the ranks are trusted" in result.stdout
    rounds = read_rounds(run_dir)
    for r in rounds:  # tiny: refreshes at rounds 1 and 3 (every 2)
        assert r["epsilon"] == pytest.approx(library_epsilon(r["round"], (r["round"] + 1) // 2), rel=1e-9)
        assert r["delta"] == 1e-5 and "eps " in result.stdout
    refresh = rounds[0]
    assert refresh["released_histograms"] is None and len(refresh["released_totals"]) == 5  # central: the sum only
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["privacy"]["epsilon"] == rounds[-1]["epsilon"] and not summary["privacy"]["stopped_at_target"]
    curve = scalar_curve(run_dir / "tensorboard", "privacy/epsilon")  # TensorBoard's, in float32
    assert [step for step, _ in curve] == [1, 2, 3, 4]
    assert [value for _, value in curve] == pytest.approx([r["epsilon"] for r in rounds], rel=1e-6)


def test_the_run_stops_before_a_round_that_would_pass_its_target(run_main, tmp_path):
    target = (library_epsilon(2, 1) + library_epsilon(3, 2)) / 2  # within after round 2, past it after round 3
    result = run_main(*TINY, *CENTRAL, "--privacy.target_epsilon", str(target), "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "stopped before round 3 of 4" in result.stdout
    assert [r["round"] for r in read_rounds(tmp_path / "run")] == [1, 2]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["stopped_at_target"] and summary["privacy"]["stopped_before_round"] == 3
    assert summary["rounds_completed"] == 2 and summary["privacy"]["epsilon"] <= target


def test_a_setting_that_cannot_hold_stops_in_one_line_before_anything_is_loaded(run_main, tmp_path):
    result = run_main(*TINY, "--method", "ZeroShot", "--privacy.mode", "local", "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode != 0
    assert "privacy.mode=local" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    result = run_main(*TINY, *CENTRAL, "--privacy.delta", "1.5", "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode != 0 and "privacy.delta" in result.stderr


def test_with_privacy_off_its_other_settings_are_not_the_runs():
    settings = Config().settings
    settings["privacy"]["noise_multiplier"] = 3.0
    flat = result_settings(settings)
    assert flat["privacy.mode"] == "none" and not [k for k in flat if k.startswith("privacy.") and k != "privacy.mode"]
    settings["privacy"]["mode"] = "central"
    assert result_settings(settings)["privacy.noise_multiplier"] == 3.0


def test_the_noise_seed_is_secret_by_default_and_a_resume_continues_the_saved_one(run_main, central, tmp_path):
    import torch

    from fedur.train import checkpoint

    seeds = []
    # two runs of the same settings, each drawing its own seed: a run of 2 rounds here, and the module's run of 4
    result = run_main(*TINY, *CENTRAL, "--federation.rounds", "2", "--run.output_dir", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    for run_dir in (tmp_path / "a", central[0]):
        saved = torch.load(checkpoint.latest(run_dir).folder / "global.pt", weights_only=True)
        seeds.append(saved["privacy"]["seed"])
        assert str(seeds[-1]) not in (run_dir / "config.yaml").read_text()
        assert read_rounds(run_dir)[-1]["global_accuracy"] is not None
    assert seeds[0] != seeds[1]  # drawn from the OS: 62 bits
    # a resume for two more rounds keeps the seed it committed
    result = run_main(*TINY, *CENTRAL, "--federation.rounds", "4", "--run.output_dir", str(tmp_path / "a"), "--run.resume", "true")
    assert result.returncode == 0, result.stderr
    resumed = torch.load(checkpoint.latest(tmp_path / "a").folder / "global.pt", weights_only=True)["privacy"]
    assert resumed["seed"] == seeds[0] and resumed["ledger"]["rounds"] == [4]


def test_a_resume_that_would_reprice_past_releases_is_refused(run_main, central, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(central[0], run_dir)  # the module's finished run (z = 2), resumed for a fifth round at z = 4
    result = run_main(*TINY, "--privacy.mode", "central", "--privacy.noise_multiplier", "4", "--federation.join_rate", "0.75",
                      "--federation.rounds", "5", "--run.output_dir", str(run_dir), "--run.resume", "true",
                      "--run.force_resume", "true")
    assert result.returncode != 0 and "cannot change what past releases cost" in result.stderr
