"""Keys that moved to a group of their own (fedur/config.py::RENAMED: the clock's, the adversary's, the aggregator's
settings were `federation.*`) keep working: on the command line, in a YAML file (an earlier run's config.yaml), and in
a checkpoint's recorded settings (a resume compares them under their new names); each is said once by its new name."""

import pytest
import yaml

from fedur.app import cli
from fedur.app.cli import parse_config
from fedur.config import RENAMED, result_settings
from fedur.train.run_dir import changed_settings

TINY = ["--config", "configs/tiny.yaml"]


def test_every_moved_key_names_a_setting_that_exists():
    flat = result_settings(parse_config(TINY).settings) | {"aggregator.krum_malicious": None, "aggregator.krum_keep": None,
                                                           "clock.bandwidth": None, "clock.deadline": None,
                                                           "aggregator.norm_bound": None, "adversary.scale": None}
    assert set(RENAMED.values()) <= set(flat), set(RENAMED.values()) - set(flat)
    assert not any(old in flat for old in RENAMED)


def test_old_keys_on_the_command_line_are_read_under_their_new_names_and_said_once(capsys):
    cli.SAID.clear()
    cfg = parse_config([*TINY, "--federation.drop_rate", "0.2", "--federation.aggregator=median",
                        "--federation.clip_norm", "3", "--federation.attack_scale", "2"])
    assert cfg.clock.drop_rate == 0.2 and cfg.aggregator.rule == "median"
    assert cfg.aggregator.norm_bound == 3.0 and cfg.adversary.scale == 2.0
    said = capsys.readouterr().err
    assert "federation.drop_rate is clock.drop_rate now" in said and "federation.clip_norm is aggregator.norm_bound now" in said
    parse_config([*TINY, "--federation.drop_rate", "0.3"])
    assert "federation.drop_rate" not in capsys.readouterr().err  # once per process


def test_an_earlier_runs_config_file_with_old_keys_is_read(tmp_path, capsys):
    old = yaml.safe_load(open("configs/tiny.yaml"))
    old["federation"].update({"speeds": "lognormal", "deadline": 0.8, "attackers": 1, "attack": "gaussian",
                              "aggregator": "trimmed_mean", "trim": 0.25})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    cfg = parse_config(["--config", str(tmp_path / "config.yaml")])
    assert cfg.clock.speeds == "lognormal" and cfg.clock.deadline == 0.8
    assert cfg.adversary.attackers == 1 and cfg.adversary.attack == "gaussian"
    assert cfg.aggregator.rule == "trimmed_mean" and cfg.aggregator.trim == 0.25
    assert cfg.federation.num_clients == old["federation"]["num_clients"]  # the group's other keys as they were


@pytest.mark.parametrize(("old", "new", "value"), [("federation.drop_rate", "clock.drop_rate", 0.2),
                                                   ("federation.aggregator", "aggregator.rule", "median")])
def test_a_checkpoint_recorded_under_the_old_keys_resumes(old, new, value):
    now = result_settings(parse_config([*TINY, f"--{new}", str(value)]).settings)
    recorded = {(old if key == new else key): v for key, v in now.items()}  # as a checkpoint of before wrote them
    assert changed_settings(recorded, now) == {}
    assert changed_settings({**recorded, old: "other"}, now) == {new: ("other", now[new])}
