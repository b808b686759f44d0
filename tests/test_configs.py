"""Every YAML under configs/ parses into typed settings; every dataset has a main config; the paper's
configs build on them, say how to run them and hold the settings of the table cell they name."""

import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from fedur.app.cli import build_parser, parse_config
from fedur.app.tables.grids import TABLE1_DATASETS
from fedur.data.datasets import dataset_classes

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
PAPER = [p for p in CONFIGS if "paper" in p.relative_to(REPO / "configs").parts]
DOMAINS = {"domainnet": 6, "officehome": 4}
# every dataset a run trains on has a main config: fedur's own but folders of your own (one set, or one per client),
# generated shapes and the test-only sets (ImageNet's shifted ones, which a run trained on ImageNet is tested on)
DATASETS = sorted(key for key, cls in dataset_classes().items()
                  if cls.__module__.startswith("fedur.") and not cls.test_only
                  and key not in ("imagefolder", "clientfolders", "synthetic", "synthetic_domains"))
TABLES = {"table1": 12, "table2": 6, "table3": 2, "table4": 2, "table5": 2, "table8": 4}


def name(path: Path) -> str:
    return str(path.relative_to(REPO / "configs"))


@cache
def parser():
    return build_parser(docs=False)  # one for every file: building it costs more than parsing one


@cache
def parsed(path: Path):
    """Parsed once per file for the tests below."""
    return parse_config(["--config", str(path)], parser())


def test_there_are_configs():
    top = {p.stem for p in CONFIGS if p.parent == REPO / "configs"}
    assert top >= {"smoke", *DATASETS}, "a main config for every dataset"
    found = {table: sum(p.parent.name == table for p in PAPER) for table in TABLES}
    assert found == TABLES, "one config per cell of Tables 1-5 and 8"


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_config_parses(path):
    cfg = parsed(path)
    resolved = cfg.yaml()
    assert cfg.federation.num_clients >= 1
    assert "federation:" in resolved and "fabric:" in resolved
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each config starts with a header saying what it runs"


@pytest.mark.parametrize("path", PAPER, ids=name)
def test_paper_config_matches_its_header(path):
    cfg = parsed(path)
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    relative = path.relative_to(REPO).as_posix()
    run = re.search(r"fabric run --devices (\d+) fedur/main.py --config (\S+) --dataset.root \S+ --run.seed 1", header)
    assert run and run.group(2) == relative, "the header's command runs this very file"
    assert int(run.group(1)) <= 8
    body = yaml.safe_load(path.read_text())
    assert body["config"] == f"../../{cfg.dataset.key}.yaml", "a table config builds on its dataset's main config"
    assert all("." in key for key in body if key != "config"), "and holds only dotted overrides"
    assert f"python fedur/main.py --config {relative} --dataset.root" in header and "--check_data" in header
    assert "--method FedCoPL" in header
    assert re.search(r"FedUR\s+\d+\.\d\d", header), "the header quotes the paper's FedUR number"
    assert path.stem.split("-")[0] == cfg.dataset.key and not Path(cfg.dataset.root).is_absolute()
    beta = re.search(r"beta(0\.\d+)", path.stem)
    if beta:
        assert cfg.federation.beta == float(beta.group(1))
    table, fed = path.parent.name, cfg.federation
    if table in ("table1", "table2", "table8"):
        assert fed.num_clients == (5 if cfg.dataset.key in ("cub", "ucf101") else 10)
        assert fed.partition == ("quantity" if table == "table2" else "dirichlet")
    if table == "table3":
        assert fed.partition == "domain" and fed.num_clients == DOMAINS[cfg.dataset.key]
    if table in ("table4", "table5"):
        assert fed.partition == "domain_dirichlet" and fed.num_clients == 3 * DOMAINS[cfg.dataset.key]
        assert fed.clients_per_domain == 3
    assert cfg.model.name == ("ViT-B-16" if table == "table8" else "ViT-B-32") and cfg.model.pretrained == "openai"


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_dataset_has_a_main_config_with_the_papers_setting(dataset):
    path = REPO / "configs" / f"{dataset}.yaml"
    cfg = parsed(path)
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert f"fabric run --devices 8 fedur/main.py --config configs/{dataset}.yaml --dataset.root" in header
    assert "--check_data" in header
    if dataset in (*TABLE1_DATASETS, *DOMAINS):  # the paper's datasets: its number; the others say it has none
        assert re.search(r"FedUR\s+\d+\.\d\d", header)
    else:
        assert "The paper reports no number for it." in header
    fed = cfg.federation
    assert cfg.dataset.key == dataset and cfg.model.name == "ViT-B-32" and cfg.model.pretrained == "openai"
    assert (fed.rounds, fed.local_epochs, fed.refresh_every) == (20, 10, 5)
    if dataset in DOMAINS:  # Table 3: one client per domain
        assert fed.partition == "domain" and fed.num_clients == DOMAINS[dataset]
    else:  # Table 1: Dirichlet beta 0.1
        assert fed.partition == "dirichlet" and fed.beta == 0.1
        assert fed.num_clients == (5 if dataset in ("cub", "ucf101") else 10)


def _weighting(preset: dict, default: str) -> str:
    return (preset.get("method", {}).get("init_args") or {}).get("weighting", default)


def _optimizer_state(preset: dict) -> str:
    return (preset.get("optim") or {}).get("optimizer_state", "reset")


def test_the_later_baselines_demo_presets_keep_their_published_weighting_and_optimizer_state():
    """A method fedur added after the paper runs the demo with what its published settings say of the method itself:
    the server's weighting (FedTPG's unweighted mean, FedPGP's and PromptFolio's data size, ...) and, where the
    original keeps each client's SGD across rounds (FedTPG), optim.optimizer_state client. The paper's baselines keep
    FedUR's weighting on the demo, as the paper runs them (docs/reference-parity.md)."""
    from fedur import plugins
    from fedur.app.tables import grids

    later = [grids.METHODS[key] for key in grids.NEW_BASELINES if grids.METHODS[key].preset]  # each with its YAMLs:
    assert later  # tests/test_plugin_description.py
    for cls in later:
        key = cls.key
        published = yaml.safe_load((plugins.configs_dir() / "presets" / f"{cls.preset}.yaml").read_text())
        demo = yaml.safe_load(plugins.demo_preset(cls).read_text())
        default = cls().weighting
        assert _weighting(demo, default) == _weighting(published, default), (key, _weighting(demo, default), _weighting(published, default))
        assert _optimizer_state(demo) == _optimizer_state(published), (key, _optimizer_state(demo), _optimizer_state(published))
