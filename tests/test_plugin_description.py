"""Plugins describe themselves (a table name, a preset, settings added after runs were made, settings that do not
change results, old keys), and fedur's tables, settings record, resumes and errors read what they say; a plugin's
constructor that refuses a value stops fedur in one line; --<plugin>.help shows a class's whole first paragraph."""

import importlib
import inspect
import json
import pkgutil
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml

from fedur.app.cli import MESSAGES, legacy_keys, parse_config
from fedur.config import RESULT_NEUTRAL, result_settings
from fedur.errors import CommandLineError
from fedur.train.run_dir import changed_settings

from .conftest import REPO

TINY = ["--config", "configs/tiny.yaml"]
CAREFUL = "tests.plugins.described.Careful"
CAPPED = "tests.plugins.described.Capped"


def defined_in_modules(kind: str) -> set[type]:
    """Every concrete public subclass of the kind's base that a module of fedur's package for the kind defines, found
    by importing each module of the package (not from the subclass tree plugins.builtin walks)."""
    from fedur import plugins

    base = plugins.base_class(kind)
    package = importlib.import_module(plugins.PACKAGES[kind])
    found = set()
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        found |= {obj for obj in vars(module).values() if isinstance(obj, type) and issubclass(obj, base) and obj is not base
                  and obj.__module__ == module.__name__ and not obj.__name__.startswith("_") and not inspect.isabstract(obj)}
    return found


@pytest.mark.parametrize("kind", ["method", "labeller", "dataset"])
def test_fedurs_plugins_are_every_class_its_modules_define_each_under_a_key_of_its_own(kind):
    """plugins.builtin finds every method, labeller and dataset fedur's modules define (a new one is its file), each
    with its own lowercase key, and the command line takes every one by its class name."""
    from fedur import plugins

    found = plugins.builtin(kind)
    assert set(found) == defined_in_modules(kind) and len(found) > 1
    keys = [cls.key for cls in found if getattr(cls, "key", None)]
    assert len(keys) == len(set(keys)) and all(k == k.lower() for k in keys)
    assert plugins.names(kind) == sorted(cls.__name__ for cls in found)
    if kind != "dataset":  # a dataset's variant keeps its parent's key (data/test_datasets.py)
        assert len(keys) == len(found), "every method and labeller has a key (the tables' rows, summary.json)"


def test_fedur_classes_say_what_the_tables_and_resumes_used_to_list():
    """The lookups the tables kept by hand, read from the classes: every method and labeller by key, each with its
    table name; the paper's rows name only fedur's classes; the paper's baselines and the methods fedur added after
    them (NEW_BASELINES) follow from the paper's tables and the classes."""
    from fedur import plugins
    from fedur.app.tables import grids, paper
    from fedur.data.datasets import dataset_classes
    from fedur.labels import CPL, FPL, CoDPL, CoPL, Labeller

    assert [c.label for c in (FPL, CPL, CoPL, CoDPL)] == ["FPL", "CPL", "CoPL", "CoDPL"]
    assert CoPL.added_settings == CoDPL.added_settings == {"quota_arithmetic": "exact"} and FPL.added_settings == {}
    assert Labeller.result_neutral == () and "labels." in Labeller.old_keys
    classes = dataset_classes()
    assert classes["cifar10"].result_neutral == ("root", "download") and "data.name" in classes["cub"].old_keys
    methods, labellers = plugins.builtin("method"), plugins.builtin("labeller")
    assert grids.METHOD_CLASSES == {cls.key: cls.__name__ for cls in methods} and len(grids.METHOD_CLASSES) == len(methods)
    assert grids.LABELLER_CLASSES == {cls.key: cls.__name__ for cls in labellers}
    assert grids.LABELLER_LABELS == {cls.key: cls.label for cls in labellers}
    labels = [cls.label for cls in methods] + [cls.label for cls in labellers]
    assert all(labels) and len(set(labels)) == len(labels)  # a table tells every row apart
    # every row of the paper's tables is fedur's: zero-shot, `<method>+<labeller>`, a method with its own labeller, or
    # one of Table 6's ablations
    rows = {row for table in paper.PAPER.values() for dataset in table.values() for cells in dataset.values() for row in cells}
    ablations = {key for key, *_ in grids.ABLATION}
    for row in rows - ablations:
        method, _, labeller = row.partition("+")
        assert method in grids.METHODS and (not labeller or labeller in grids.LABELLERS), row
    baselines = {row.partition("+")[0] for row in rows - ablations if "+" in row}  # the paper's FL baselines
    assert set(grids.BASELINES) == baselines and grids.BASELINE_LABELS == {k: grids.METHODS[k].label for k in grids.BASELINES}
    assert all(grids.METHODS[k].preset for k in grids.BASELINES)  # each with its published settings (the 'own' protocol)
    in_the_paper = {row.partition("+")[0] for row in rows} & set(grids.METHODS)
    assert grids.NEW_BASELINES == tuple(cls.key for cls in methods if cls.trains and cls.key not in in_the_paper)
    assert grids.NEW_BASELINES and not set(grids.NEW_BASELINES) & set(grids.BASELINES)
    assert grids.TABLE1_DATASETS == paper.DATASETS_T1
    assert grids.DATASET_LABELS == {key: classes[key].label for key in paper.DATASETS_T1}
    assert [r.labels for r in grids.PAPER_ROWS[:3]] == [("CLIP (zero-shot)", "-"), ("GDA-U", "EM"), ("PromptFL", "FPL")]
    assert all(grids.METHODS[cls.key] is cls for cls in methods)


def test_every_preset_a_class_names_has_its_yaml_and_every_preset_yaml_its_class():
    """A method's `preset` is configs/presets/<preset>.yaml (its published settings: the 'own' protocol's grids) and it
    has a demo preset, configs/presets/demo/<key>.yaml (the demo's learning rate); no YAML there is left without its
    class. PRESETS (the tables' list) is every method with a preset."""
    from fedur import plugins
    from fedur.app.tables import grids

    methods = plugins.builtin("method")
    presets = plugins.configs_dir() / "presets"
    with_preset = [cls for cls in methods if cls.preset]
    assert grids.PRESETS == tuple(cls.key for cls in with_preset)
    assert {p.stem for p in presets.glob("*.yaml")} == {cls.preset for cls in with_preset}
    assert {p.stem for p in (presets / "demo").glob("*.yaml")} <= {cls.key for cls in methods}
    for cls in with_preset:
        assert plugins.demo_preset(cls) is not None, f"{cls.__name__}: no configs/presets/demo/{cls.key}.yaml"
    published, demo = {cls.preset: cls.__name__ for cls in with_preset}, {cls.key: cls.__name__ for cls in methods}
    for folder, owner in ((presets, published), (presets / "demo", demo)):  # each parses: tests/test_configs.py
        for path in folder.glob("*.yaml"):
            assert yaml.safe_load(path.read_text())["method"]["class_path"] == owner[path.stem], path  # its method


def test_the_old_keys_name_fedurs_own_classes():
    """What main.py listed by hand of the old keys, its names now fedur's own classes of each kind."""
    keys = legacy_keys()
    assert keys.items() >= {
        "labels.": "--labeller CLASS --labeller.<arg> (e.g. --labeller CoDPL --labeller.tau_neg 0.3)",
        "data.root": "--dataset.root",
        "method.prox_mu": "--method PromptProx --method.mu",
        "method.ot_": "--method FedOTP --method.eps / top_percent / max_iter / thresh",
        "run.fault": "the FEDUR_FAULT environment variable (fedur/train/faults.py)",
    }.items()
    from fedur import plugins

    for old, kind in (("method.name", "method"), ("method.labeller", "labeller"), ("data.name", "dataset")):
        assert keys[old].endswith(f"CLASS ({', '.join(plugins.names(kind))})"), keys[old]


# What config.py's RESULT_NEUTRAL and run_dir.py's ADDED_SETTINGS listed by hand before the classes said it (and the
# evaluation group's, added since with the evaluation protocols).
OLD_RESULT_NEUTRAL = {"evaluation.global_model", "evaluation.membership_attack", "run.figures",
    "model.cache_dir", "dataset.root", "dataset.download", "data.num_workers", "data.cache", "data.cache_dir",
    "federation.rounds", "optim.eval_batch_size", "run.output_dir", "run.resume", "run.force_resume",
    "run.keep_checkpoints", "run.peer_timeout", "run.wait_timeout", "run.requeue_deadline", "run.requeue_on",
    "run.threads", "run.clients_per_step", "run.log_every_n_steps", "run.progress", "fabric.accelerator",
    "fabric.devices", "fabric.num_nodes", "fabric.strategy",
}
OLD_ADDED_SETTINGS = {"labeller.quota_arithmetic": "exact", "method.weighting": "selected", "method.cache_shots": None,
                      "method.cache_self_vote": True, "method.cache_alpha_scale": "none", "optim.schedule": "cosine",
                      "federation.partition_file": None, "evaluation.new_clients": 0, "evaluation.new_client_epochs": None,
                      "evaluation.new_client_labels": "arrival", "method.global_text": "template"}


@pytest.mark.parametrize("plugins", [
    ["--method", "PFedPrompt", "--labeller", "CoDPL"],
    ["--method", "FedOTP", "--labeller", "CPL", "--dataset", "CIFAR10", "--dataset.root", "/nowhere"],
    ["--method", "ZeroShot"],
])
def test_fedur_plugins_record_and_compare_the_same_settings_as_before(plugins):
    from fedur.config import flat_settings

    cfg = parse_config([*TINY, *plugins])
    flat = flat_settings(cfg.settings)
    settings = result_settings(cfg.settings)
    off = {k for k in flat if k.startswith("privacy.") and k != "privacy.mode"}  # privacy off: only its mode is recorded
    assert OLD_RESULT_NEUTRAL <= RESULT_NEUTRAL | {"dataset.root", "dataset.download"}  # what changed nothing still does not
    added = RESULT_NEUTRAL - OLD_RESULT_NEUTRAL  # settings added since, result-neutral from their start
    assert settings == {k: v for k, v in flat.items() if k not in OLD_RESULT_NEUTRAL | added | off}  # the checkpoints' record
    old_run = {k: v for k, v in settings.items() if k not in OLD_ADDED_SETTINGS}  # a checkpoint from before them
    for now in (settings, {**settings, **{k: "other" for k in OLD_ADDED_SETTINGS if k in settings}}):
        as_before = {**{k: v for k, v in OLD_ADDED_SETTINGS.items() if k in now}, **old_run}  # run_dir.py's rule then
        assert changed_settings(old_run, now) == changed_settings(as_before, now)


def test_a_plugin_says_which_settings_change_results_and_what_old_runs_ran_with():
    """A user's labeller (tests/plugins/described.py): `report` is result-neutral, `margin` was added with 0.0."""
    cfg = parse_config([*TINY, "--labeller", CAREFUL, "--labeller.margin", "0.0"])
    settings = result_settings(cfg.settings)
    assert settings["labeller"] == CAREFUL and settings["labeller.margin"] == 0.0
    assert "labeller.report" not in settings  # not recorded, so a resume may change it
    louder = parse_config([*TINY, "--labeller", CAREFUL, "--labeller.report", "true"])
    assert result_settings(louder.settings) == settings
    before_margin = {k: v for k, v in settings.items() if k != "labeller.margin"}  # a run from before `margin`
    assert changed_settings(before_margin, settings) == {}
    assert changed_settings(before_margin, {**settings, "labeller.margin": 0.1}) == {"labeller.margin": (0.0, 0.1)}


def test_a_plugin_method_shows_its_label_and_runs_its_preset_in_a_grid(tmp_path):
    from fedur.app.tables.grids import GRIDS, expand, method_row, with_protocol
    from fedur.app.tables.render import collect, markdown
    from fedur.app.tables.runner import Inputs, command
    from tests.plugins.described import Capped, Careful

    row = method_row(Capped, Careful)
    assert (row.key, row.labels, row.preset) == ("capped+careful", ("PromptFL (capped)", "Careful FPL"), "promptfl")
    assert row.flags == ("--method", CAPPED, "--labeller", CAREFUL)
    grid = with_protocol(replace(GRIDS["demo-table1"], rows=(method_row("fedur", None), method_row(Capped, "fpl"))), "own")
    specs = expand(grid, [1], tmp_path)
    cmd = command(specs[1], Inputs())
    assert cmd[cmd.index("--method") + 1] == CAPPED and str(REPO / "configs" / "presets" / "demo" / "promptfl.yaml") in cmd
    specs[1].run_dir.mkdir(parents=True)
    (specs[1].run_dir / "summary.json").write_text(json.dumps({"final_mean_accuracy": 50.0, "final_client_accuracy": [50.0]}))
    table = markdown(grid, collect(grid, specs), specs, [1])
    assert "| PromptFL (capped) | FPL | 50.00" in table and "| FedUR | - | — (0/1) |" in table


@pytest.mark.parametrize("args, setting", [
    (["--labeller", CAREFUL, "--labeller.margin", "-1"],
     f"--labeller {CAREFUL}: margin is a lead of one probability over another, so at least 0; got -1.0"),
    (["--method", CAPPED, "--method.max_rounds", "0"], f"--method {CAPPED}: max_rounds must be at least 1, got 0"),
])
def test_a_plugin_constructor_that_refuses_a_value_is_one_line(args, setting, run_main, tmp_path):
    code, out, err = run_main(*TINY, *args, "--run.output_dir", str(tmp_path / "run"))
    assert (code, err) == (2, f"fedur: error: {setting}\n")
    assert not (tmp_path / "run").exists()


def test_plugin_help_shows_the_whole_first_paragraph_of_its_docstring(run_main):
    code, out, _ = run_main("--labeller.help", CAREFUL)
    assert code == 0 and "--labeller.margin" in out
    assert ("FPL that keeps a pseudo-label only where the top-1 probability leads the runner-up by at least `margin`, "
            "so that near-ties between two classes train nothing:") in out
    assert "second paragraph" not in out
    code, out, _ = run_main("--method.help", "FedUR")  # a one-line docstring as before
    assert "\nFedUR: deep visual prompts averaged by the server, personal text prompts, CoDPL pseudo-labels:\n" in out


# Each jsonargparse message form fedur reads (main.MESSAGES), raised by the real parser: (settings, YAML file
# content or None, the form, what fedur reads of it, what fedur's error then says).
JSONARGPARSE_CASES = [
    ([], "data:\n  name: cub\n", "group option", ("data", "name"), "`data.name` is gone: use --dataset CLASS"),
    (["--method", "PromptProx", "--method.prox_mu", "0.1"], None, "plugin option", ("method", "prox_mu"),
     "`method.prox_mu` is gone: use --method PromptProx --method.mu"),
    (["--method", "PromptFL", "--method.share", "visual"], None, "plugin option", ("method", "share"),
     "--method.share is not a setting of this method"),
    ([], "labels:\n  tau_neg: 0.3\n", "option", ("labels.tau_neg",), "`labels.tau_neg` is gone: use --labeller CLASS"),
    (["--data.root", "/data"], None, "unrecognized", ("data.root",), "`data.root` is gone: use --dataset.root"),
    (["--method", "fedur"], None, "plugin name", ("method", "fedur"),
     "--method fedur: no such method (did you mean --method FedUR? names are class names)"),
    (["--labeller.tau_neg", "0.3"], None, "plugin abstract", ("labeller",),
     "(name the labeller before its settings: --labeller CLASS --labeller.<arg> ...)"),
]


@pytest.mark.parametrize("args, yaml_text, form, read, said", JSONARGPARSE_CASES,
                         ids=[f"{c[2]}: {' '.join(c[0]) or c[1].split(':')[0]}" for c in JSONARGPARSE_CASES])
def test_the_jsonargparse_messages_fedur_reads(args, yaml_text, form, read, said, tmp_path):
    """jsonargparse names a refused key only in its message's text: an upgrade that words one of these otherwise
    fails here, not silently in the hints."""
    if yaml_text is not None:
        (tmp_path / "old.yaml").write_text(yaml_text)
        args = [*args, "--config", str(tmp_path / "old.yaml")]
    with pytest.raises(CommandLineError) as error:
        parse_config([*TINY, *args])
    raw = str(error.value.__cause__)  # jsonargparse's own message
    found = MESSAGES[form].search(raw)
    assert found is not None, raw
    assert found.groups() == read
    assert said in str(error.value)
    assert set(MESSAGES) == {case[2] for case in JSONARGPARSE_CASES}  # every form fedur reads has its case


@pytest.mark.slow
def test_the_refusal_and_the_help_through_the_real_entry_point():
    """`python fedur/main.py` as a user runs it, with the plugin on the path as an installed one would be."""
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    refused = subprocess.run([sys.executable, "fedur/main.py", *TINY, "--labeller", CAREFUL, "--labeller.margin", "-1"],
                             cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr == (f"fedur: error: --labeller {CAREFUL}: margin is a lead of one probability over another, "
                              "so at least 0; got -1.0\n")
    shown = subprocess.run([sys.executable, "fedur/main.py", "--labeller.help", CAREFUL], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env=env)
    assert shown.returncode == 0 and "runner-up by at least `margin`, so that near-ties between two classes" in shown.stdout


@pytest.mark.slow
def test_a_plugin_resumes_across_its_result_neutral_and_added_settings(tmp_path):
    """A checkpoint made before Careful had `margin` (its marker lacks it) resumes with margin 0.0 and a changed
    `report`; margin 0.1 is a change of results, refused."""
    from fedur.app.run import run
    from fedur.train import checkpoint
    from fedur.train.run_dir import RunDirError

    def session(run_dir, *flags):
        cfg = parse_config([*TINY, "--run.output_dir", str(run_dir), "--labeller", CAREFUL,
                                         "--run.progress", "false", *flags])
        return run(cfg)

    first = tmp_path / "first"
    session(first, "--federation.rounds", "1")
    marker = checkpoint.latest(first).folder / checkpoint.MARKER
    content = json.loads(marker.read_text())
    del content["settings"]["labeller.margin"]  # as a run from before `margin` recorded it
    marker.write_text(json.dumps(content, indent=1) + "\n")
    shutil.copytree(first, tmp_path / "second")

    session(first, "--federation.rounds", "2", "--run.resume", "true", "--labeller.report", "true")
    assert checkpoint.latest(first).round_idx == 1
    with pytest.raises(RunDirError, match=r"labeller.margin: 0.0 \(checkpoint\) -> 0.1 \(now\)"):
        session(tmp_path / "second", "--federation.rounds", "2", "--run.resume", "true", "--labeller.margin", "0.1")


def test_the_methods_page_and_the_readme_are_the_classes():
    """docs/methods.md is generated from the classes, and the README's methods table names every method and says how
    many fedur has: a method added to fedur that they do not show fails here."""
    import re

    from fedur import plugins

    assert (REPO / "docs" / "methods.md").read_text() == plugins.methods_page(), \
        "docs/methods.md is stale: python -m fedur.plugins methods > docs/methods.md"
    readme = (REPO / "README.md").read_text()
    classes = plugins.builtin("method")
    missing = [cls.__name__ for cls in classes if f"| `{cls.__name__}` " not in readme]
    assert not missing, f"the README's methods table lacks {missing}"
    counted = re.search(r"(\d+) methods", readme)
    assert counted and int(counted.group(1)) == len(classes), f"the README says {counted and counted.group(0)}; fedur has {len(classes)}"
