"""The method API in whole runs (1 rank, in this process): SCAFFOLD's correction and messages, a method's
own piece, a server's metrics on every surface, and the contracts the round loop checks."""

import json
from pathlib import Path

import pytest
import torch

from fedur.app.cli import parse_config
from fedur.app.report import main as report_main
from fedur.app.run import run
from fedur.errors import PluginError
from fedur.methods import FedUR
from fedur.train.setup import SetupError
from tests.conftest import scalar_curve

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

TINY = ["--config", "configs/tiny.yaml", "--federation.rounds", "3", "--federation.refresh_every", "1", "--run.progress", "false"]


def run_tiny(run_dir: Path, *flags: str):
    cfg = parse_config([*TINY, "--run.output_dir", str(run_dir), *flags])
    return run(cfg)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_scaffold_equals_fedur_until_its_control_variates_exist_and_sends_them_as_messages(tmp_path):
    """Round 1: c = c_k = 0, so no correction: FedUR's round bitwise. Round 2 on: corrected, so other losses.
    The control-variate deltas are messages: counted in bytes_sent by size, never written as pieces."""
    run_tiny(tmp_path / "fedur")
    result = run_tiny(tmp_path / "scaffold", "--method", "SCAFFOLD", "--method.weighting", "selected")  # FedUR's weighting
    fedur, scaffold = rows(tmp_path / "fedur"), rows(tmp_path / "scaffold")
    assert scaffold[0]["loss"] == fedur[0]["loss"] and scaffold[0]["client_accuracy"] == fedur[0]["client_accuracy"]
    assert scaffold[1]["loss"] != fedur[1]["loss"]
    visual = result.clients[0].pieces["visual"]
    size = visual.numel() * visual.element_size()
    assert scaffold[0]["upload_bytes"] == {"visual": size, "dc_visual": size} and fedur[0]["upload_bytes"] == {"visual": size}
    assert [b - f for b, f in zip(scaffold[0]["bytes_sent"], fedur[0]["bytes_sent"])] == [size] * 4
    assert set(torch.load(tmp_path / "scaffold" / "prompts" / "global.pt", weights_only=True)) == {"visual"}
    client = torch.load(tmp_path / "scaffold" / "prompts" / "client_000.pt", weights_only=True)
    assert {"c_visual", "c_local_visual"} <= set(client) and float(client["c_local_visual"].norm()) > 0
    norms = [r["method"]["control_norm_visual"] for r in scaffold]
    assert all(n > 0 for n in norms) and fedur[0]["method"] == {}


def test_a_server_metric_reaches_metrics_jsonl_tensorboard_and_the_report(tmp_path):
    run_dir = tmp_path / "momentum"
    run_tiny(run_dir, "--method", "examples.server_momentum.ServerMomentum", "--method.momentum", "0.5")
    norms = [r["method"]["velocity_norm_visual"] for r in rows(run_dir)]
    assert len(norms) == 3 and all(n > 0 for n in norms)
    curve = scalar_curve(run_dir / "tensorboard", "method/velocity_norm_visual")
    assert [step for step, _ in curve] == [1, 2, 3]
    assert [value for _, value in curve] == pytest.approx(norms, rel=1e-6)
    report_main([str(run_dir), "--out", str(tmp_path / "report")])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Method metrics" in text and "velocity_norm_visual" in text and f"{norms[-1]:.4g}" in text


@pytest.mark.parametrize("shared", [False, True])
def test_a_piece_a_plugin_declares_is_trained_saved_and_shared_as_declared(tmp_path, shared):
    run_dir = tmp_path / "adapter"
    result = run_tiny(run_dir, "--method", "examples.feature_adapter.FeatureAdapter",
                      "--method.share_adapter", str(shared).lower())
    adapters = [c.pieces["adapter"] for c in result.clients]
    dim = result.host.model.feature_dim
    assert adapters[0].shape == (dim, dim) and all(float(a.abs().max()) > 0 for a in adapters)  # it trained from zero
    same = all(torch.equal(a, adapters[0]) for a in adapters)
    assert same == shared
    saved = torch.load(run_dir / "prompts" / "client_001.pt", weights_only=True)
    assert torch.equal(saved["adapter"], adapters[1])
    global_pieces = torch.load(run_dir / "prompts" / "global.pt", weights_only=True)
    assert ("adapter" in global_pieces) == shared
    assert "adapter" in rows(run_dir)[0]["prompt_divergence"]


def test_gda_u_sends_its_statistics_as_messages_and_writes_no_global_prompts(tmp_path):
    run_dir = tmp_path / "gdau"
    run_tiny(run_dir, "--method", "GDAU")
    row = rows(run_dir)[0]
    assert set(row["upload_bytes"]) == {"counts", "sums", "second_moment", "num_samples"}
    assert row["bytes_sent"][0] == sum(row["upload_bytes"].values())
    assert not (run_dir / "prompts" / "global.pt").exists()
    assert "gda_W" in torch.load(run_dir / "prompts" / "client_000.pt", weights_only=True)


class WrongUpload(FedUR):
    def upload(self, client, data, local):
        return {}


class WrongAggregate(FedUR):
    def aggregate(self, round):
        return dict(round.current)  # the shape of fedur 0.3's hook, not Aggregated


@pytest.mark.parametrize("method, message", [
    ("tests.train.test_method_api_runs.WrongUpload", r"upload of client 0 sent \[\]; it must send one tensor per shared piece"),
    ("tests.train.test_method_api_runs.WrongAggregate", "aggregate must return fedur.methods.Aggregated"),
])
def test_the_round_loop_names_a_broken_hook(tmp_path, method, message):
    with pytest.raises(PluginError, match=message):
        run_tiny(tmp_path / "broken", "--method", method)


def test_a_method_with_nothing_to_train_stops_before_training(tmp_path):
    with pytest.raises(SetupError, match="nothing to train: PromptFL has no prompt or other piece with elements"):
        run_tiny(tmp_path / "empty", "--method", "PromptFL", "--model.n_ctx", "0")
    assert not (tmp_path / "empty" / "metrics.jsonl").exists()
