"""Every YAML under configs/ parses into typed settings; the paper's configs say how to run them and hold
the settings of the table cell they name."""

import re
from functools import cache
from pathlib import Path

import pytest

from fedur.main import parse_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
PAPER = [p for p in CONFIGS if "paper" in p.relative_to(REPO / "configs").parts]
DOMAINS = {"domainnet": 6, "officehome": 4}
TABLES = {"table1": 12, "table2": 6, "table3": 2, "table4": 2, "table5": 2, "table8": 4}


def name(path: Path) -> str:
    return str(path.relative_to(REPO / "configs"))


@cache
def parsed(path: Path):
    """Parsed once per file (0.3 s each) for both tests below."""
    return parse_config(["--config", str(path)])


def test_there_are_configs():
    assert any(p.name == "smoke.yaml" for p in CONFIGS) and any(p.name == "cifar10.yaml" for p in CONFIGS)
    found = {table: sum(p.parent.name == table for p in PAPER) for table in TABLES}
    assert found == TABLES, "one config per cell of Tables 1-5 and 8"


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_parses(path):
    cfg, resolved = parsed(path)
    assert cfg.federation.num_clients >= 1
    assert "federation:" in resolved and "fabric:" in resolved
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each config starts with a header saying what it runs"


@pytest.mark.parametrize("path", PAPER, ids=name)
def test_paper_config_matches_its_header(path):
    cfg, _ = parsed(path)
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    relative = path.relative_to(REPO).as_posix()
    run = re.search(r"fabric run --devices (\d+) fedur/main.py --config (\S+) --data.root \S+ --run.seed 1", header)
    assert run and run.group(2) == relative, "the header's command runs this very file"
    assert int(run.group(1)) <= cfg.federation.num_clients, "a rank hosts at least one client"
    assert f"python fedur/main.py --config {relative} --data.root" in header and "--check_data" in header
    assert "--fedur.class_weights none --fedur.negatives none" in header
    assert re.search(r"FedUR\s+\d+\.\d\d", header), "the header quotes the paper's FedUR number"
    assert path.stem.split("-")[0] == cfg.data.name and not Path(cfg.data.root).is_absolute()
    beta = re.search(r"beta(0\.\d+)", path.stem)
    if beta:
        assert cfg.federation.beta == float(beta.group(1))
    table, fed = path.parent.name, cfg.federation
    if table in ("table1", "table2", "table8"):
        assert fed.num_clients == (5 if cfg.data.name in ("cub", "ucf101") else 10)
        assert fed.partition == ("quantity" if table == "table2" else "dirichlet")
    if table == "table3":
        assert fed.partition == "domain" and fed.num_clients == DOMAINS[cfg.data.name]
    if table in ("table4", "table5"):
        assert fed.partition == "domain_dirichlet" and fed.num_clients == 3 * DOMAINS[cfg.data.name]
        assert fed.clients_per_domain == 3
    assert cfg.model.name == ("ViT-B-16" if table == "table8" else "ViT-B-32") and cfg.model.pretrained == "openai"
