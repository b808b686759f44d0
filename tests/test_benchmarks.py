"""Every benchmark at its smallest size, so that none rots unnoticed: each runs in-process through its `main(argv)`
and writes its report, and one that fails exits non-zero. Smokes, not measurements: nothing here asserts on time.
A benchmark that needs ../shared (tiny-clip, CIFAR-10 JPEGs) skips without FEDUR_SHARED_DIR; one that must start
processes runs in the slow lane, with its reason on its test."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
from PIL import Image

from .conftest import REPO

pytestmark = pytest.mark.slow  # the fast lane stays under a minute: this module's checks run in the full suite

BENCHMARKS = REPO / "benchmarks"


@functools.cache
def benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported by its path (benchmarks/ is no package), once per session."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def exit_code(main, *args) -> int:
    """A benchmark's main called in-process: its return value or its SystemExit's code, as the shell would see it."""
    try:
        code = main(*args)
    except SystemExit as exit:
        code = exit.code
    return code if isinstance(code, int) else (0 if code is None else 1)  # SystemExit("message") exits 1


def fedur_run(out: Path, *flags: str) -> Path:
    """A finished fedur run, in this process: configs/tiny.yaml at its smallest (2 clients, 1 round)."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    run(parse_config(["--config", str(REPO / "configs" / "tiny.yaml"), "--federation.num_clients", "2",
                      "--federation.rounds", "1", "--federation.local_epochs", "1", "--dataset.train_per_class", "8",
                      "--dataset.test_per_class", "2", "--run.output_dir", str(out), "--run.progress", "false", *flags]))
    return out


@pytest.fixture(scope="module")
def cifar_subset(shared_dir, tmp_path_factory) -> Path:
    """The first 10 train and 5 test JPEGs of every CIFAR-10 class, from the shared archive, as an image folder."""
    root = tmp_path_factory.mktemp("cifar-subset")
    wanted, taken = {"train": 10, "test": 5}, {}
    with tarfile.open(shared_dir / "data" / "cifar10-jpg.tar.gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and taken.get(tuple(parts[:2]), 0) < wanted.get(parts[0], 0):
                taken[tuple(parts[:2])] = taken.get(tuple(parts[:2]), 0) + 1
                archive.extract(member, root, filter="data")
    return root


# ---------------------------------------------------------------- round_cost.py and gpu_round_cost.sh


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_round_cost_smoke_measures_every_model_part_and_writes_its_report(tmp_path, precision):
    # bf16 autocast on the CPU is the first-light script's setting (its round-cost step)
    code = exit_code(benchmark("round_cost").main, ["--smoke", "--precision", precision, "--parts", "text,train,eval,bytes",
                                                     "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "cpu-smoke.json").read_text())
    entry = results["micro"]["fedur-tiny|10"]
    assert set(entry) == {"text", "train", "eval", "bytes"} and not any("error" in part for part in entry.values())
    assert entry["train"]["on"]["flops_per_step"] > 0 and entry["bytes"]["visual_prompt"] > 0
    assert "## Prompted training step" in (tmp_path / "cpu-smoke.md").read_text()


def test_round_cost_with_a_failed_part_exits_non_zero_and_still_writes_its_report(tmp_path, capsys):
    code = exit_code(benchmark("round_cost").main, ["--smoke", "--models", "no-such-model", "--parts", "text",
                                                     "--out", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert "part(s) or run(s) failed" in err and "Unknown open_clip model 'no-such-model'" in err
    assert (tmp_path / "cpu-smoke.md").is_file()  # the report is written all the same


def test_round_cost_reports_the_evaluation_with_the_global_model_on_and_off_and_the_time_before_round_1():
    rc = benchmark("round_cost")

    def run(evaluate: float, startup: dict | None) -> dict:
        row = {"round": 1, "round_seconds": 1.0, "phase_seconds": {"refresh": 0.1, "train": 0.5, "aggregate": 0.0,
                                                                   "evaluate": evaluate},
               "trained_images": 10, "refreshed": True, "floor": {"evaluate": 0.1}, "floor_seconds": 0.5, "bytes_sent": [8]}
        return {"model": "fedur-tiny", "train_images": 20, "test_images": 10, "clients": 2, "shared_prefix_text": True,
                "process_wall_seconds": 9.0, "rounds": [row], "startup_seconds": startup}

    startup = {"imports": 5.0, "setup": 1.0, "zero_shot": 0.5, "other": 0.5, "total": 7.0}
    runs = {"fedur-tiny|20|on": run(0.3, startup), "fedur-tiny|20|on" + rc.GLOBAL_OFF: run(0.2, None)}
    pairs = rc.global_evaluation(runs)
    assert pairs == {"fedur-tiny|20|on": [{"round": 1, "evaluate_on": 0.3, "evaluate_off": 0.2,
                                           "on_over_off": pytest.approx(1.5)}]}
    text = "\n".join(rc.global_table(pairs) + rc.startup_table(runs))
    assert "| fedur-tiny|20|on | 1 | 0.300 | 0.200 | x1.50 |" in text
    assert "| fedur-tiny|20|on | 5.00 | 1.00 | 0.50 | 0.50 | 7.00 | 9.0 |" in text
    assert "| fedur-tiny|20|on|global-off | not recorded |" in text  # a fedur that does not write startup_seconds


def test_round_cost_puts_a_run_beside_its_twin_with_a_label_free_validation_split():
    rc = benchmark("round_cost")

    def run(evaluate: float, seconds: float) -> dict:
        return {"rounds": [{"round": 1, "round_seconds": seconds, "phase_seconds": {"evaluate": evaluate}}]}

    runs = {"fedur-tiny|20|on": run(0.2, 1.0), "fedur-tiny|20|on" + rc.LABEL_FREE: run(0.3, 0.9)}
    text = "\n".join(rc.label_free_table(runs))
    assert "| fedur-tiny|20|on | 1 | 0.200 | 0.300 | x1.50 | 1.000 | 0.900 | x0.90 |" in text
    assert rc.global_evaluation(runs) == {}  # a label-free twin is not a global-off twin


@pytest.mark.slow  # two fedur processes (one seed, one round each)
def test_label_free_benchmark_runs_and_tables_its_smallest_size(tmp_path, capsys):
    label_free = benchmark("label_free")
    assert exit_code(label_free.main, ["run", "demo", "--seeds", "1", "--methods", "fedur,promptfl", "--rounds", "1",
                                       "--workdir", str(tmp_path)]) == 0
    assert exit_code(label_free.main, ["table", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "label_free.md").read_text()
    assert "| FedUR | 1 | mano |" in text and "| PromptFL | mano |" in text
    found = json.loads((tmp_path / "out" / "label_free.json").read_text())
    assert set(found["demo"]) == {"fedur", "promptfl"} and set(found["demo"]["fedur"]["choices"][0]) == set(label_free.CHOOSERS)
    assert exit_code(label_free.main, ["table", str(tmp_path / "nothing"), "--out", str(tmp_path / "out2")]) == 1


@pytest.fixture(scope="module")
def first_light(tmp_path_factory) -> tuple[int, Path]:
    """gpu_first_light.py's CPU rehearsal of its round-cost step, run once for the tests that read it: (its exit
    code, its --out folder). The step runs round_cost.py's `round` part on fedur-tiny, 2 clients and 40 images, the
    text tower shared, the global model on and off: two fedur processes, each of 2 rounds (round_cost/cpu.json)."""
    out = tmp_path_factory.mktemp("first-light")
    return exit_code(benchmark("gpu_first_light").main, ["--cpu-rehearsal", "--steps", "round-cost", "--out", str(out)]), out


@pytest.mark.slow  # reads the whole-round runs of the first-light rehearsal's round_cost.py (two fedur processes)
def test_round_cost_whole_rounds_run_with_the_global_model_on_and_off(first_light):
    code, out = first_light
    assert code == 0, (out / "first-light.md").read_text()
    results = json.loads((out / "round_cost" / "cpu.json").read_text())
    assert set(results["round"]) == {"fedur-tiny|40|on", "fedur-tiny|40|on|global-off"}
    assert [r["global_model"] for r in results["round"].values()] in ([True, False], [False, True])
    rows = results["global_evaluation"]["fedur-tiny|40|on"]
    assert [row["round"] for row in rows] == [1, 2]  # each of its rounds, against the global-off twin's
    assert all(row["evaluate_on"] > 0 and row["evaluate_off"] > 0 for row in rows)
    for run in results["round"].values():  # not yet written by every fedur: then null
        assert run["startup_seconds"] is None or set(benchmark("round_cost").STARTUP) <= set(run["startup_seconds"])
    assert "### Evaluation with the global protocol on and off" in (out / "round_cost" / "cpu.md").read_text()


@pytest.mark.slow  # starts two fedur processes
def test_round_cost_methods_part_puts_each_methods_round_beside_fedurs(tmp_path):
    code = exit_code(benchmark("round_cost").main, ["--smoke", "--parts", "methods", "--methods", "FedMaPLe",
                                                     "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "cpu-smoke.json").read_text())
    assert [run["method"] for run in results["methods"].values()] == ["FedUR", "FedMaPLe"]  # FedUR first, the base
    text = (tmp_path / "cpu-smoke.md").read_text()
    assert "## Each method's round against FedUR's" in text and "| FedUR |" in text and "x1.00 |" in text
    assert "--method FedMaPLe" in text


@pytest.mark.slow  # starts three fedur processes
def test_round_cost_cache_part_runs_a_method_cold_warm_and_off(tmp_path):
    code = exit_code(benchmark("round_cost").main, ["--smoke", "--parts", "cache", "--cache-methods", "PromptFL",
                                                     "--out", str(tmp_path)])
    assert code == 0
    runs = json.loads((tmp_path / "cpu-smoke.json").read_text())["cache"]
    assert [run["cache_state"] for run in runs.values()] == ["cold", "warm", "off"]
    assert [run["startup_seconds"] is not None for run in runs.values()] == [True] * 3
    text = (tmp_path / "cpu-smoke.md").read_text()
    assert "## The frozen-feature cache: cold, warm and off" in text and "| PromptFL | warm |" in text
    commands = [line for line in text.splitlines() if line.startswith("- `python -m fedur.main")]
    assert len(commands) == 3 and ["--data.feature_cache false" in c for c in commands] == [False, False, True]  # off's


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_gpu_round_cost_script_passes_round_cost_only_flags_it_takes(tmp_path, device):
    script = BENCHMARKS / "gpu_round_cost.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    done = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1", "DEVICE": device})
    assert done.returncode == 0, done.stdout + done.stderr
    stages = [line.split("benchmarks/round_cost.py", 1)[1] for line in done.stdout.splitlines() if line.startswith("+ ")]
    assert len(stages) == 3
    for stage in stages:
        args = benchmark("round_cost").parse_args(shlex.split(stage))  # an unknown flag exits here
        assert args.device == device
    assert not list(tmp_path.glob("*.json"))  # nothing measured


# ---------------------------------------------------------------- gpu_first_light.py


def test_gpu_first_light_import_check_finds_every_method(capsys):
    from fedur import plugins

    assert exit_code(benchmark("gpu_first_light").main, ["--child", "imports", "cpu"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    facts = json.loads(line.removeprefix(benchmark("gpu_first_light").RESULT_MARK))
    assert facts["missing"] == []
    assert list(facts["methods"]) == [cls.__name__ for cls in plugins.builtin("method")]  # what the methods step runs
    assert facts["methods"]["ZeroShot"] == 0 and facts["methods"]["FedUR"] == 2


def test_gpu_first_light_memory_child_runs_fedur_in_process(tmp_path, capsys):
    first_light = benchmark("gpu_first_light")
    args = ["--config", str(REPO / "configs" / "tiny.yaml"), "--federation.num_clients", "2", "--federation.rounds", "1",
            "--federation.local_epochs", "1", "--dataset.train_per_class", "8", "--dataset.test_per_class", "2",
            "--fabric.accelerator", "cpu", "--run.progress", "false", "--run.output_dir", str(tmp_path / "run")]
    assert exit_code(first_light.main, ["--child", "memory", *args]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1].removeprefix(first_light.RESULT_MARK))
    assert result["peak_bytes"] > 0 and (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow  # starts the import check, the matmul child, round_cost.py and its fedur runs as processes
def test_gpu_first_light_rehearses_its_round_cost_step(first_light):
    code, out = first_light
    report = (out / "first-light.md").read_text()
    assert code == 0, report
    assert "| imports | PASS" in report and "| round-cost | PASS" in report


# ---------------------------------------------------------------- the others


def test_cross_dataset_demo_tables_a_column_and_fails_on_a_run_it_cannot_test(tmp_path):
    column = tmp_path / "column"
    fedur_run(column / "fedur" / "seed1")
    main = benchmark("cross_dataset_demo").main
    assert exit_code(main, [str(column), "--test-per-class", "1", "--out", str(tmp_path / "table.md")]) == 0
    table = (tmp_path / "table.md").read_text()
    assert table.splitlines()[2].startswith("| fedur | ") and "—" not in table  # every target tested
    (column / "broken" / "seed1").mkdir(parents=True)
    (column / "broken" / "seed1" / "summary.json").write_text("{}")  # finished, but no config.yaml
    assert exit_code(main, [str(column), "--test-per-class", "1"]) == 1


def test_data_throughput_runs_on_a_small_image_folder(tmp_path):
    for split in ("train", "test"):
        for name, color in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
            folder = tmp_path / "images" / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (8, 8), color).save(folder / f"{i}.jpg")
    out = tmp_path / "throughput.md"
    code = exit_code(benchmark("data_throughput").main, ["--root", str(tmp_path / "images"), "--images", "8", "--image-size",
                                                          "32", "--workers", "0", "--build-workers", "0", "--repeats", "1",
                                                          "--out", str(out)])
    assert code == 0 and "| jpeg | cache, batch normalised on the CPU | 0 |" in out.read_text()


def test_ot_syncs_runs_and_leaves_fedotp_as_it_found_it(tmp_path):
    from fedur.methods import fedotp_math

    before = (fedotp_math.CHECK_EVERY, fedotp_math._NO_SYNC_DEVICES)
    out = tmp_path / "ot.md"
    code = exit_code(benchmark("ot_syncs").main, ["--device", "cpu", "--b", "1", "--c", "2", "--m", "4", "--d", "8",
                                                   "--repeats", "1", "--out", str(out)])
    assert code == 0
    assert (fedotp_math.CHECK_EVERY, fedotp_math._NO_SYNC_DEVICES) == before  # the suite's fedotp tests run after
    rows = [line for line in out.read_text().splitlines() if line.startswith(("| COT", "| Sinkhorn"))]
    assert len(rows) == 8 and all(row.endswith("| True |") for row in rows)


def test_many_clients_flags_are_ones_fedur_takes(tmp_path):
    from fedur.app.cli import parse_config

    cfg = parse_config([*benchmark("many_clients").settings(REPO, 10, 2, 2, False), "--run.output_dir", str(tmp_path)])
    assert cfg.federation.num_clients == 10 and cfg.run.clients_per_step == 2


@pytest.mark.slow  # starts a fedur process per cell
def test_many_clients_smallest_cell(tmp_path):
    out = tmp_path / "many.md"
    code = exit_code(benchmark("many_clients").main, ["--clients", "2", "--groups", "1", "--ranks", "1", "--rounds", "2",
                                                       "--train-per-class", "2", "--test-per-class", "1", "--out", str(out)])
    assert code == 0 and "| now | 2 | 1 | 1 |" in out.read_text()


def test_tinyclip_patch_tokens_on_a_few_images(shared_dir, cifar_subset, tmp_path):
    out = tmp_path / "patch_tokens.json"
    code = exit_code(benchmark("tinyclip_patch_tokens").main, ["--data-root", str(cifar_subset), "--model-dir",
                                                                str(shared_dir / "assets" / "tiny-clip"), "--images", "20",
                                                                "--out", str(out)])
    assert code == 0 and json.loads(out.read_text())["images"] == 20 and out.with_suffix(".md").is_file()


def test_tiny_clip_headroom_on_a_few_images(shared_dir, cifar_subset, tmp_path):
    out = tmp_path / "headroom.md"
    code = exit_code(benchmark("tiny_clip_headroom").main, ["--shared-dir", str(shared_dir), "--data-root", str(cifar_subset),
                                                             "--train-fraction", "1", "--test-fraction", "1", "--threads",
                                                             "1", "--out", str(out)])
    assert code == 0 and "| linear probe (true labels) |" in out.read_text()


@pytest.mark.slow  # two whole fedur runs on tiny-clip, ~5 s even at 5 clients and 150 images
def test_partition_heatmaps_on_a_few_images(shared_dir, cifar_subset, tmp_path):
    code = exit_code(benchmark("partition_heatmaps").main, ["--shared-dir", str(shared_dir), "--data-root", str(cifar_subset),
                                                             "--clients", "5", "--threads", "1", "--out", str(tmp_path)])
    assert code == 0
    for name in ("dirichlet-beta0.1", "quantity"):
        assert (tmp_path / name / "partition_train.png").is_file()
    assert "## quantity" in (tmp_path / "results.md").read_text()


@pytest.mark.slow  # starts a fedur process per variant
def test_learning_check_smallest_run(shared_dir, cifar_subset, tmp_path):
    code = exit_code(benchmark("learning_check").main, ["--shared-dir", str(shared_dir), "--data-root", str(cifar_subset),
                                                         "--workdir", str(tmp_path), "--variants", "fedur", "--clients", "2",
                                                         "--rounds", "1", "--local-epochs", "1", "--refresh-every", "1",
                                                         "--train-fraction", "1", "--test-fraction", "1", "--threads", "1"])
    assert code == 0 and "| fedur | 1 |" in (tmp_path / "results.md").read_text()


# ---------------------------------------------------------------- others' benchmarks, read-only


def test_output_parity_cases_cover_every_method_and_compare_tells_runs_apart(tmp_path, monkeypatch, capsys):
    from fedur import plugins

    from .shared_runs import SPECIAL

    parity = benchmark("output_parity")
    cases = parity.cases()
    methods = {args[args.index("--method") + 1] for args in cases.values() if "--method" in args}
    assert {cls.__name__ for cls in plugins.builtin("method")} <= methods
    pairs = {(args[args.index("--method") + 1], args[args.index("--labeller") + 1]) for args in cases.values()
             if "--method" in args and "--labeller" in args}
    assert {(m.__name__, lab.__name__) for m in plugins.builtin("method") if m.trains
            for lab in plugins.builtin("labeller")} <= pairs  # every trainable method with every labeller
    assert all(f"shared-{name}" in cases for name in SPECIAL)  # the test files' shared cases (privacy, stragglers, ...)
    before, after = tmp_path / "before" / "case", tmp_path / "after" / "case"
    for run in (before, after):
        (run / "prompts").mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "mean_accuracy": 50.0, "round_seconds": 1.0}) + "\n")
        (run / "summary.json").write_text(json.dumps({"final_mean_accuracy": 50.0, "best_round": 1, "wall_seconds": 3}))
        torch.save({"text_ctx": torch.ones(2, 3)}, run / "prompts" / "client_000.pt")

    def compare() -> int:
        monkeypatch.setattr(sys, "argv", ["output_parity.py", "compare", str(before.parent), str(after.parent)])
        return exit_code(parity.main)

    assert compare() == 0 and "1 of 1 identical" in capsys.readouterr().out
    torch.save({"text_ctx": torch.ones(2, 3) + 1e-6}, after / "prompts" / "client_000.pt")
    assert compare() == 1 and "prompts/client_000.pt.text_ctx" in capsys.readouterr().out

    def within(*bounds: str) -> int:
        monkeypatch.setattr(sys, "argv", ["output_parity.py", "compare", "--tolerance", *bounds, str(before.parent),
                                          str(after.parent)])
        return exit_code(parity.main)

    assert within("--max-tensors", "1e-5") == 0 and "case: within" in capsys.readouterr().out
    assert within("--max-tensors", "1e-7") == 1 and "tensors 9.54e-07" in capsys.readouterr().out
    (after / "metrics.jsonl").write_text(json.dumps({"round": 1, "mean_accuracy": 48.0, "round_seconds": 2.0}) + "\n")
    assert within("--max-tensors", "1e-5", "--table", str(tmp_path / "t.md")) == 1
    assert "accuracy 2 points" in capsys.readouterr().out
    assert "| case | 2 | 0 | 0 | 9.54e-07 | 0 | - | OUT |" in (tmp_path / "t.md").read_text()
    assert within("--max-tensors", "1e-5", "--max-accuracy", "2") == 0


def test_demo_learning_help(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["demo_learning.py", "--help"])
    assert exit_code(benchmark("demo_learning").main) == 0
    assert "--variants" in capsys.readouterr().out


def reference_race(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    """reference_race.py as a script: imported, it defines a dataset class (key "cifar10", for fedur's CLI), which
    would join this session's dataset registry beside fedur's own CIFAR10. Run as __main__ it imports no fedur."""
    return subprocess.run([sys.executable, str(BENCHMARKS / "reference_race.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_reference_race_help_and_a_missing_checkout(tmp_path):
    done = reference_race("--help")
    assert done.returncode == 0 and "--reference" in done.stdout
    done = reference_race("--reference", str(tmp_path))
    assert done.returncode == 1 and "point it at a FedCoPL checkout" in done.stderr


@pytest.mark.slow  # starts the reference's and fedur's processes
def test_reference_race_smoke(shared_dir, tmp_path):
    checkout, python = os.environ.get("FEDCOPL_CHECKOUT"), os.environ.get("FEDCOPL_PYTHON", sys.executable)
    if not checkout or not (Path(checkout) / "methods" / "main_UL.py").is_file():
        pytest.skip("FEDCOPL_CHECKOUT (a checkout of krumpguo/FedCoPL) is not set: see benchmarks/results/reference_race/")
    done = reference_race("--reference", checkout, "--reference-python", python, "--smoke", "--archive",
                          str(shared_dir / "data" / "cifar10-jpg.tar.gz"), "--out", str(tmp_path), timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "cpu-smoke.md").is_file()


def test_privacy_selection_tables_a_grids_finished_runs_and_fails_on_none(tmp_path, capsys):
    grid = tmp_path / "demo-privacy"
    fedur_run(grid / "demo-privacy-central-eps4" / "fedur" / "seed1", "--privacy.mode", "central",
              "--privacy.noise_multiplier", "2", "--evaluation.membership_attack", "true")
    (grid / "demo-privacy-none" / "fedur" / "seed1").mkdir(parents=True)  # not finished: left out
    capsys.readouterr()  # the run's own lines
    assert exit_code(benchmark("privacy_selection").main, [str(grid)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 3 and table[2].startswith("| fedur | central-eps4 | 1 |")
    epsilon, tv = table[2].split(" | ")[-2:]
    assert float(epsilon) > 0 and 0 <= float(tv.rstrip(" |")) <= 1
    empty = tmp_path / "empty"
    (empty / "demo-privacy-none" / "fedur" / "seed1").mkdir(parents=True)
    assert exit_code(benchmark("privacy_selection").main, [str(empty)]) == 1


def test_backbone_matrix_on_two_families(tmp_path):
    assert exit_code(benchmark("backbone_matrix").main, ["--models", "ViT-B-32,RN50", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "backbone_matrix.md").read_text()
    assert "| `RN50` | open_clip ModifiedResNet" in report and "`RN50`, `FedUR`: FedUR cannot run on RN50" in report
    assert exit_code(benchmark("backbone_matrix").main, ["--models", "no-such-model", "--out", str(tmp_path)]) == 1


@pytest.mark.slow  # six estimates and four measured steps: 8 s
def test_memory_estimate_smallest(tmp_path):
    args = ["--parts", "vits,tiny", "--models", "fedur-tiny", "--families", "fedur-tiny", "--batch", "4", "--eval-batch", "4",
            "--out", str(tmp_path)]
    assert exit_code(benchmark("memory_estimate").main, args) == 0
    report = (tmp_path / "memory_estimate.md").read_text()
    assert "| fedur-tiny | 32-true | on |" in report and "| fedur-tiny | fedur-tiny | FedUR | off |" in report


def test_every_benchmark_has_a_smoke_here():
    """A benchmark added to benchmarks/ without a smoke in this file fails here."""
    source = Path(__file__).read_text()
    missing = [p.name for p in sorted(BENCHMARKS.glob("*.py")) + sorted(BENCHMARKS.glob("*.sh"))
               if f'"{p.stem}"' not in source and p.name not in source]
    assert not missing

