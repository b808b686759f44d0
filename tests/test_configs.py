"""Every YAML in configs/ parses into typed settings that pass the offline-independent checks."""

from pathlib import Path

import pytest

from fedur.main import parse_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert any(p.name == "smoke.yaml" for p in CONFIGS) and any(p.name == "cifar10.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses(path):
    cfg, resolved = parse_config(["--config", str(path)])
    assert cfg.federation.num_clients >= 1
    assert "federation:" in resolved and "fabric:" in resolved
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each config starts with a header saying what it runs"
