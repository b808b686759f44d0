import re
import time
from dataclasses import dataclass

import pytest

from fedur.config import GROUPS
from fedur.main import ConfigError, main, parse_config, resolve_precision, validate


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_main(capsys, monkeypatch):
    """The entry point in-process: `fedur/main.py ARGS` -> exit code and output."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def call(*args):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return call


def test_help_documents_every_option(run_main):
    out = run_main("--help").stdout
    for name, group in GROUPS.items():
        for field in group.__dataclass_fields__:
            assert f"--{name}.{field}" in out
    assert "Learnable text context vectors" in out  # field docstrings become help text
    assert "--fabric.devices" in out and "\n  --devices" not in out  # namespaced: no clash with `fabric run`


def test_print_config_and_overrides(run_main):
    out = run_main("--config", "configs/smoke.yaml", "--federation.rounds", "7", "--print_config").stdout
    assert "rounds: 7" in out and "name: fedur-tiny" in out


def test_overrides_and_later_configs_win(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("federation:\n  beta: 0.05\n")
    cfg, _ = parse_config(["--config", "configs/cifar10.yaml", "--config", str(extra), "--optim.lr", "0.2"])
    assert cfg.federation.beta == 0.05 and cfg.optim.lr == 0.2 and cfg.model.name == "ViT-B-32"


@pytest.mark.parametrize(
    "override, message",
    [
        (["--federation.beta", "0"], "federation.beta must be > 0"),
        (["--federation.join_rate", "1.5"], "join_rate must be in (0, 1]"),
        (["--model.n_ctx", "-1"], "model.n_ctx must be >= 0"),
        (["--model.visual_tokens", "-2"], "model.visual_tokens must be >= 0"),
        (["--fedur.tau_neg", "1.2"], "fedur.tau_neg"),
        (["--model.n_ctx", "0", "--model.visual_tokens", "0"], "nothing to train"),
        (["--model.name", "ViT-Huge-Nope"], "Unknown open_clip model"),
        (["--data.name", "imagefolder", "--data.root", "/nonexistent/data"], "/nonexistent/data/train is missing"),
    ],
)
def test_bad_settings_fail_before_compute(override, message):
    cfg, _ = parse_config(["--config", "configs/smoke.yaml", *override])
    with pytest.raises(Exception, match=re.escape(message)):
        validate(cfg)


def test_bad_input_exits_2_and_touches_nothing(tmp_path, run_main):
    out_dir = tmp_path / "run"
    result = run_main("--config", "configs/smoke.yaml", "--federation.beta", "-1", "--run.output_dir", str(out_dir))
    assert result.returncode == 2 and "fedur: error: federation.beta must be > 0" in result.stderr
    assert not out_dir.exists()


def test_offline_real_config_stops_at_once_with_what_to_download(run_main):
    start = time.perf_counter()
    result = run_main("--config", "configs/cifar10.yaml")
    assert result.returncode == 2
    assert "model.pretrained=" in result.stderr and "huggingface.co" in result.stderr
    assert time.perf_counter() - start < 60


def test_existing_run_directory_is_never_overwritten(tmp_path, run_main):
    (tmp_path / "keep.txt").write_text("earlier results")
    result = run_main("--config", "configs/smoke.yaml", "--run.output_dir", str(tmp_path))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_precision_auto(monkeypatch):
    from fedur.config import FabricConfig

    monkeypatch.delenv("LT_PRECISION", raising=False)
    assert resolve_precision(FabricConfig(accelerator="cpu")) == "32-true"
    assert resolve_precision(FabricConfig(accelerator="cuda")) == "bf16-mixed"
    assert resolve_precision(FabricConfig(precision="bf16-mixed", accelerator="cpu")) == "bf16-mixed"
    monkeypatch.setenv("LT_PRECISION", "bf16-mixed")  # `fabric run --precision` wins: pass nothing
    assert resolve_precision(FabricConfig(accelerator="cpu")) is None
    monkeypatch.setenv("LT_PRECISION", "16-mixed")
    cfg, _ = parse_config(["--config", "configs/smoke.yaml"])
    with pytest.raises(ConfigError, match="GradScaler"):
        validate(cfg)
