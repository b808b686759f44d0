"""A method and a labeller of a user's own (tests/plugins/, outside fedur), selected by import path: they
run on 2 ranks identical to 1 rank, resume exactly after a crash (the server's momentum is part of the
checkpoint), and do what they say."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from fedur.train import checkpoint

from .conftest import REPO, assert_same_results, free_port, run_ok
from .test_resume import assert_same_run, run_in_process

pytestmark = pytest.mark.slow

PLUGINS = ["--method", "examples.server_momentum.ServerMomentum", "--method.momentum", "0.5",
           "--method.weighting", "uniform",  # a setting of fedur's Method, passed on by the plugin's **kwargs;
           # some clients have no sample above the threshold: under uniform weights they must sit the round out
           "--labeller", "examples.confident.Confident", "--labeller.threshold", "0.25"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    common = ["--config", "configs/tiny.yaml", "--federation.rounds", "3", "--federation.refresh_every", "1",
              "--run.progress", "false", *PLUGINS]
    one, two = [*common, "--run.output_dir", str(root / "one")], [*common, "--run.output_dir", str(root / "two")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the plugins' package, as a user's own would be installed
    fabric = str(Path(sys.executable).parent / "fabric")
    run_ok([sys.executable, "tests/run_many.py", json.dumps(one)], timeout=600, env=env)
    run_ok([fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()),
            "tests/run_many.py", json.dumps(two)], timeout=600, env=env)
    return root


def test_a_plugin_on_two_ranks_equals_one_rank(runs):
    assert json.loads((runs / "two" / "summary.json").read_text())["world_size"] == 2
    assert_same_results(runs / "one", runs / "two", num_clients=4)
    summary = json.loads((runs / "one" / "summary.json").read_text())
    assert (summary["method"], summary["labeller"]) == ("servermomentum", "confident")
    assert summary["settings"]["method"]["class_path"] == "examples.server_momentum.ServerMomentum"
    assert summary["settings"]["method"]["init_args"]["weighting"] == "uniform"


def test_the_server_keeps_its_momentum_and_the_labeller_its_threshold(runs):
    server = checkpoint.load(checkpoint.latest(runs / "one").folder / "global.pt")
    velocity = server["method"]["velocity_visual"]
    assert velocity.shape == server["shared"]["visual"].shape and velocity.abs().sum() > 0
    client = checkpoint.load(checkpoint.client_file(checkpoint.latest(runs / "one").folder, 0))
    labels = client["pseudo_labels"]
    assert len(labels["labels"]) > 0  # Confident kept the samples at or above its threshold, none below (tiny CLIP
    # probabilities over 5 classes hover around 0.2-0.35)


def test_a_plugin_resumes_exactly_after_a_crash(tmp_path):
    flags = [*PLUGINS, "--federation.refresh_every", "1"]
    run_in_process(tmp_path / "uninterrupted", *flags)
    run_dir = tmp_path / "run"
    with pytest.raises(Exception, match="injected fault"):
        run_in_process(run_dir, *flags, fault="raise:commit:2:0")
    assert checkpoint.latest(run_dir).round_idx == 0
    run_in_process(run_dir, *flags, "--run.resume", "true")
    assert_same_run(run_dir, tmp_path / "uninterrupted")
    velocity = [checkpoint.load(checkpoint.latest(d).folder / "global.pt")["method"]["velocity_visual"]
                for d in (run_dir, tmp_path / "uninterrupted")]
    assert torch.equal(*velocity)
