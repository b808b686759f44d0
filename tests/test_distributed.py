"""Real multi-process CPU runs: the launch paths, placement invariance, and no hidden synchronization."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import REPO, assert_same_results, free_port, read_rounds, run_ok, tensorboard_events

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

ROUNDS = "3"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny config (4 clients) under `fabric run` on 2 ranks. (That results do not depend on the placement is
    tested on the demo, `tests/test_learning.py`, and with spare ranks below.)"""
    root = tmp_path_factory.mktemp("runs")
    fabric = str(Path(sys.executable).parent / "fabric")
    common = ["--config", "configs/tiny.yaml", "--federation.rounds", ROUNDS, "--run.figures", "true"]  # its images too
    two = run_ok([fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()),
                  "fedur/main.py", *common, "--run.output_dir", str(root / "two")])
    return {"two": root / "two", "stdout_two": two.stdout}


def test_two_rank_run_writes_its_results(runs):
    run_dir = runs["two"]
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json", "tensorboard", "prompts"}
    rows = read_rounds(run_dir)
    assert [r["round"] for r in rows] == list(range(1, int(ROUNDS) + 1))  # counted from 1, as on the console
    for key in ("mean_accuracy", "client_accuracy", "pseudo_label_accuracy", "selected", "lr", "round_seconds", "bytes_sent"):
        assert key in rows[0]
    assert len(rows[0]["client_accuracy"]) == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["num_clients"] == 4
    for key in ("final_mean_accuracy", "best_mean_accuracy", "zero_shot_client_mean", "zero_shot_global"):
        assert isinstance(summary[key], float)
    assert summary["settings"]["federation"]["rounds"] == int(ROUNDS)
    assert "rounds: 3" in (run_dir / "config.yaml").read_text()
    assert sorted(p.name for p in (run_dir / "prompts").iterdir()) == [f"client_00{k}.pt" for k in range(4)] + ["global.pt"]
    assert runs["stdout_two"].count("zero-shot CLIP") == 1, "only rank 0 prints"

    placement = json.loads((run_dir / "placement.json").read_text())["ranks"]
    assert [r["clients"] for r in placement] == [[0, 1], [2, 3]]
    confusion = json.loads((run_dir / "confusion.json").read_text())
    assert [sum(row) for row in confusion["matrix"]] == [20] * 5 and confusion["round"] == int(ROUNDS)


def test_tensorboard_holds_every_documented_tag(runs):
    events = tensorboard_events(runs["two"] / "tensorboard")  # every event file, hparams included
    last = int(ROUNDS)
    scalars = events["scalars"]
    for tag in ["accuracy/mean"] + [f"accuracy/client_{k:03d}" for k in range(4)]:
        assert scalars[tag] == list(range(last + 1))  # step 0: zero-shot CLIP
    per_round = ["pseudo_labels/accuracy_client_{k}", "pseudo_labels/selected_client_{k}", "loss/client_{k}"]
    for tag in [t.format(k=f"{k:03d}") for t in per_round for k in range(4)] + [
        "pseudo_labels/accuracy_mean", "pseudo_labels/selected_total", "loss/loss_mean", "loss/loss_pos_mean",
        "loss/loss_neg_mean", "optim/lr", "comm/bytes_total", "comm/bytes_cumulative", "time/round_seconds",
    ]:
        assert scalars[tag] == list(range(1, last + 1)), tag
    refreshes = [1, 3]  # smoke: refresh_every 2, so the rounds with index 0 and 2
    assert all(scalars[f"pseudo_labels/class_weight_{c:03d}"] == refreshes for c in range(5))
    for tag in ("hparams/final_mean_accuracy", "hparams/best_mean_accuracy", "hparams/zero_shot_client_mean"):
        assert scalars[tag] == [last]
    assert events["images"] == {"partition/train": [0], "partition/test": [0], "pseudo_labels/selection": refreshes,
                                "confusion/final": [last], "calibration/reliability": [last]}  # labels: the calibration
    assert events["text"] == {"config/text_summary": [0]}
    assert set(events["hparams"]) == {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}


def _no_hidden_sync_worker(fabric, config_args, run_dir):
    from fedur.app.cli import parse_config
    from fedur.federated.collectives import Collectives
    from fedur.model.clip import load_clip
    from fedur.train.fit import fit
    from fedur.train.run_dir import RunDir

    cfg = parse_config(config_args)
    torch.set_num_threads(1)
    if fabric.is_global_zero:
        Path(run_dir).mkdir()
    fabric.barrier()
    result = fit(fabric, cfg, RunDir(run_dir))

    texts = Collectives(fabric).gather_clients(
        {c.client_id: c.pieces["text_ctx"] for c in result.clients}, 4, like=result.clients[0].pieces["text_ctx"], what="text prompts"
    )
    assert all(not torch.equal(texts[i], texts[j]) for i in range(4) for j in range(i)), "text prompts synchronized"
    visuals = fabric.all_gather(result.global_pieces["visual"])  # (world_size, depth, n_tok, width)
    assert torch.equal(visuals[0], visuals[1]), "global visual prompt differs across ranks"
    torch.manual_seed(cfg.run.seed)
    fresh = load_clip(cfg.model.name, cfg.model.pretrained).model.state_dict()
    trained = result.tuner.model.clip.state_dict()
    assert all(torch.equal(trained[k], v) for k, v in fresh.items()), "backbone changed"
    return True


def test_no_hidden_sync_across_ranks(tmp_path):
    from lightning import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    args = ["--config", "configs/tiny.yaml", "--federation.rounds", "1"]
    assert fabric.launch(_no_hidden_sync_worker, args, str(tmp_path / "run"))


def test_more_ranks_than_clients_spare_ranks_join_every_exchange(tmp_path):
    """One client on 2 ranks (as CUB's 5 clients on 8 GPUs): rank 1 hosts none, takes part in every
    collective, and the run equals the same run on 1 rank."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    args = ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--federation.num_clients", "1"]
    fabric = str(Path(sys.executable).parent / "fabric")
    two = run_ok([fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()),
                  "fedur/main.py", *args, "--run.output_dir", str(tmp_path / "two")])
    cfg = parse_config([*args, "--run.output_dir", str(tmp_path / "one")])
    run(cfg)
    assert_same_results(tmp_path / "two", tmp_path / "one", num_clients=1)
    placement = json.loads((tmp_path / "two" / "placement.json").read_text())["ranks"]
    assert [r["clients"] for r in placement] == [[0], []]
    assert two.stdout.count("rank 1 hosts no client (1 client on 2 ranks) and takes part in every exchange") == 1


def test_a_bad_setting_under_fabric_run_is_printed_once_by_rank_zero():
    fabric = str(Path(sys.executable).parent / "fabric")
    result = subprocess.run(
        [fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()), "fedur/main.py",
         "--config", "configs/tiny.yaml", "--federation.beta", "-1"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("fedur: error:") == 1, output[-3000:]
    assert result.stderr.startswith('fedur: error: Parser key "federation.beta": Not of type PositiveFloat: -1'), output[-3000:]
    assert "exitcode  : 2" in output  # rank 0's exit is what the launcher reports


def test_two_jobs_on_one_machine_through_the_launch_script_both_run(tmp_path):
    """`fabric run`'s default port is the same for every job: a second job on the machine failed with a 30-line
    EADDRINUSE traceback. launch/local.sh picks a free port for each."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    jobs = [subprocess.Popen(["bash", "launch/local.sh", "cpu:2", "--config", "configs/tiny.yaml", "--federation.rounds", "2",
                              "--run.output_dir", str(tmp_path / f"job{i}"), "--run.progress", "false"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (1, 2)]
    outputs = [job.communicate(timeout=300)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert all((tmp_path / f"job{i}" / "summary.json").is_file() for i in (1, 2))
