"""fedur-tables: a grid run end to end (skip, resume), tables from hand-written summaries, the SLURM
array script, the grids' configs and flags, and the transcription of the paper's numbers."""

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from fedur.app.tables import cli
from fedur.app.tables.grids import GRIDS, config_path, expand, preset_config
from fedur.app.tables.paper import DATASETS_T1, PAPER, PAPER_AVERAGE, TABLE7_GAINS
from fedur.app.tables.runner import Inputs, command
from fedur.config import GROUPS, PLUGINS

from .conftest import REPO


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_tiny_grid_runs_skips_and_resumes(tmp_path, capsys):
    out = tmp_path / "tables"  # in this process (`python -m fedur.app.tables.cli`: the installed wheel's test below)
    code = cli.main(["tiny", "--out", str(out), "--seeds", "1,2", "--jobs", "2"])
    printed = capsys.readouterr()
    assert code == 0, printed.out[-4000:] + printed.err[-2000:]
    first = printed.out
    assert "4 to run" in first
    grid = GRIDS["tiny"]
    specs = expand(grid, [1, 2], out)
    assert len(specs) == 4
    for _i, spec in enumerate(specs, start=1):
        assert spec.log.is_file() and str(spec.log) in first
        assert (spec.run_dir / "summary.json").is_file()
    assert "[4/4] finished" in first

    # The table, recomputed from the summaries.
    wide = {row["row"]: row for row in read_csv(out / "tiny" / "table.csv")}
    markdown = (out / "tiny" / "table.md").read_text()
    for row in grid.rows:
        summaries = [json.loads((s.run_dir / "summary.json").read_text()) for s in specs if s.row is row]
        values = [s["final_mean_accuracy"] for s in summaries]
        worst = [min(s["final_client_accuracy"]) for s in summaries]
        line = wide[row.key]
        assert float(line["tiny mean"]) == pytest.approx(statistics.fmean(values), abs=1e-4)
        assert float(line["tiny std"]) == pytest.approx(statistics.stdev(values), abs=1e-4)
        assert float(line["tiny worst"]) == pytest.approx(statistics.fmean(worst), abs=1e-4)
        assert float(line["tiny worst_min"]) == pytest.approx(min(worst), abs=1e-4)
        assert line["tiny n"] == "2"
        text = (f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f} · "
                f"worst {statistics.fmean(worst):.2f} ({min(worst):.2f})")
        assert f"| {' | '.join(row.labels)} | {text} |" in markdown

    # A second call runs nothing: every run has its summary.json.
    logs = {spec.log: (spec.log.stat().st_mtime_ns, spec.log.stat().st_size) for spec in specs}
    assert cli.main(["tiny", "--out", str(out), "--seeds", "1,2"]) == 0
    second = capsys.readouterr().out
    assert "4 finished, 0 to run" in second, second[-3000:]
    assert {log: (log.stat().st_mtime_ns, log.stat().st_size) for log in logs} == logs

    # An interrupted run (committed round 1 of 2, no summary) is resumed, not restarted, and ends as the
    # uninterrupted run did (bitwise on CPU).
    spec = specs[1]
    before = json.loads((spec.run_dir / "summary.json").read_text())
    (spec.run_dir / "summary.json").unlink()
    shutil.rmtree(spec.run_dir / "checkpoints" / "round_00002")
    assert cli.main(["tiny", "--out", str(out), "--seeds", "1,2"]) == 0, spec.log.read_text()[-3000:]
    third = capsys.readouterr().out
    assert "1 to run (1 to resume)" in third, third[-3000:]
    assert f"resuming after round 1: {spec.name}" in third
    after = json.loads((spec.run_dir / "summary.json").read_text())
    assert after["final_client_accuracy"] == before["final_client_accuracy"]
    assert after["rounds_completed"] == 2
    assert spec.log.read_text().count("# fedur-tables ") == 2  # the log is appended to
    assert sum(1 for line in (spec.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()) == 2


def write_summary(run_dir: Path, **values) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(values))


def test_table_from_hand_written_summaries(tmp_path, capsys):
    out = tmp_path / "tables"
    grid = GRIDS["table1"]
    runs = {(s.row.key, s.column.key, s.seed): s for s in expand(grid, [1, 2, 3], out)}
    # FedUR on DTD beta 0.1: 60, 62, 64 -> mean 62, std 2; worst clients 50, 40, 45.
    for seed, final, clients in ((1, 60.0, [50.0, 70.0]), (2, 62.0, [40.0, 84.0]), (3, 64.0, [45.0, 83.0])):
        write_summary(runs[("fedur", "dtd-beta0.1", seed)].run_dir, final_mean_accuracy=final,
                      final_client_accuracy=clients, best_mean_accuracy=final + 1, zero_shot_global=43.0,
                      zero_shot_client_mean=41.0)
    # Zero-shot CLIP on DTD beta 0.1, two seeds of three (one run failed): its client mean like every row, its
    # accuracy on the whole test set beside it (the paper's zero-shot protocol, which the paper's number is).
    for seed, value in ((1, 43.0), (2, 43.5)):
        write_summary(runs[("zeroshot", "dtd-beta0.1", seed)].run_dir, final_mean_accuracy=value - 3,
                      final_client_accuracy=[30.0, 50.0], zero_shot_global=value, zero_shot_client_mean=value - 3)
    failed = runs[("zeroshot", "dtd-beta0.1", 3)]
    failed.cell_dir.mkdir(parents=True, exist_ok=True)
    failed.log.write_text("fedur: error: something\n")

    code = cli.main(["table1", "--out", str(out), "--table-only", "--rows", "fedur,zeroshot",
                     "--columns", "dtd-beta0.1,cub-beta0.05"])
    assert code == 0
    printed = capsys.readouterr().out
    markdown = (out / "table1" / "table.md").read_text()
    assert markdown in printed
    assert "| FedUR | CoDPL | 62.00 ± 2.00 · worst 45.00 (40.00) · paper 62.75 (Δ -0.75) | — · paper 73.92 |" in markdown
    assert ("| CLIP (zero-shot) | - | 40.25 ± 0.35 [2/3 seeds] · worst 30.00 (30.00) · whole test set 43.25 · paper 43.24 "
            "(Δ +0.01) | — · paper 60.19 |") in markdown
    assert "| FedUR | CoDPL | — (0/3) · paper 55.09 | — · paper 75.46 |" in markdown  # beta 0.05: no run
    assert f"- zeroshot | dtd-beta0.1 | seed 3: see {failed.log}" in markdown
    assert "- fedur | cub-beta0.05 | seed 1: not run" in markdown

    wide = {row["row"]: row for row in read_csv(out / "table1" / "table.csv")}
    assert set(wide) == {"zeroshot", "fedur"}
    fedur = wide["fedur"]
    assert (fedur["dtd-beta0.1 mean"], fedur["dtd-beta0.1 std"], fedur["dtd-beta0.1 n"]) == ("62.0000", "2.0000", "3")
    assert (fedur["dtd-beta0.1 worst"], fedur["dtd-beta0.1 worst_min"]) == ("45.0000", "40.0000")
    assert (fedur["dtd-beta0.1 paper"], fedur["dtd-beta0.1 diff"]) == ("62.7500", "-0.7500")
    assert fedur["cub-beta0.05 mean"] == "" and fedur["cub-beta0.05 paper"] == "55.0900"
    assert wide["zeroshot"]["dtd-beta0.1 std"] == f"{statistics.stdev([43.0, 43.5]):.4f}"

    cells = {(c["row"], c["column"]): c for c in read_csv(out / "table1" / "cells.csv")}
    zero = cells[("zeroshot", "dtd-beta0.1")]
    assert (zero["value_key"], zero["values"], zero["missing_seeds"]) == ("final_mean_accuracy", "40.0000 40.5000", "3")
    assert (zero["client_mean"], zero["zero_shot_global"]) == ("40.2500", "43.2500")  # and the whole test set's
    assert cells[("fedur", "dtd-beta0.1")]["best_mean"] == "63.0000"


def test_the_table_lists_flags_given_after_the_double_dash(tmp_path, capsys):
    out = tmp_path / "tables"
    runs = {s.seed: s for s in expand(GRIDS["tiny"], [1, 2], out) if s.row.key == "fedur"}
    for _seed, spec in runs.items():
        write_summary(spec.run_dir, final_mean_accuracy=50.0, final_client_accuracy=[50.0], zero_shot_global=40.0)
    # seed 1 was started with extra flags, interrupted, then resumed with others: the last start counts
    runs[1].log.write_text("# fedur-tables 2026-01-01 00:00:00: python -m fedur.main ...\n"
                           "# fedur-tables flags after --: --optim.lr 0.5\nfedur: ...\n"
                           "# fedur-tables 2026-01-01 01:00:00: python -m fedur.main ...\n"
                           "# fedur-tables flags after --: --method.cache_alpha 0.13\nfedur: ...\n")
    runs[2].log.write_text("# fedur-tables 2026-01-01 00:00:00: python -m fedur.main ...\nfedur: ...\n")
    assert cli.main(["tiny", "--out", str(out), "--table-only", "--seeds", "1,2", "--rows", "fedur"]) == 0
    markdown = (out / "tiny" / "table.md").read_text()
    assert "- `--method.cache_alpha 0.13`: 1 runs: fedur | tiny | seed 1" in markdown
    assert "- none: 1 runs: fedur | tiny | seed 2" in markdown and "--optim.lr 0.5" not in markdown
    runs[2].log.write_text(runs[1].log.read_text())
    assert cli.main(["tiny", "--out", str(out), "--table-only", "--seeds", "1,2", "--rows", "fedur"]) == 0
    assert "- `--method.cache_alpha 0.13`: all 2 finished runs" in (out / "tiny" / "table.md").read_text()


def test_finished_runs_with_other_settings_are_refused(tmp_path, capsys):
    """A call whose settings differ from a finished run's (as its last checkpoint recorded them) would leave that
    run as it is and mix two settings in one table: refused. Launch settings (threads) do not count."""
    from fedur.app.cli import parse_config
    from fedur.config import result_settings
    from fedur.train.checkpoint import MARKER, Marker, round_folder

    out = tmp_path / "tables"
    spec = next(s for s in expand(GRIDS["tiny"], [1], out) if s.row.key == "fedur")
    write_summary(spec.run_dir, final_mean_accuracy=50.0, final_client_accuracy=[50.0], zero_shot_global=40.0)
    cmd = command(spec, Inputs(extra=("--optim.lr", "0.5")))
    settings = result_settings(parse_config(cmd[cmd.index("--config"):]).settings)
    marker = Marker(1, 4, 1, settings)
    folder = round_folder(spec.run_dir, marker.number)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(marker.to_json())
    capsys.readouterr()
    assert cli.main(["tiny", "--out", str(out), "--seeds", "1", "--rows", "fedur"]) == 2
    err = capsys.readouterr().err
    assert "1 finished run(s)" in err and "optim.lr 0.5 (run) vs 0.1 (now)" in err
    assert cli.main(["tiny", "--out", str(out), "--seeds", "1", "--rows", "fedur", "--", "--optim.lr", "0.5",
                     "--run.threads", "2"]) == 0
    assert "0 to run" in capsys.readouterr().out


def test_average_column_needs_every_dataset(tmp_path, capsys):
    out = tmp_path / "tables"
    values = {"dtd": 60.0, "resisc45": 70.0, "cub": 50.0, "ucf101": 65.0, "cifar10": 90.0, "cifar100": 71.0}
    for spec in expand(GRIDS["table2"], [1], out, rows=["fedcopl"]):
        write_summary(spec.run_dir, final_mean_accuracy=values[spec.column.dataset], final_client_accuracy=[1.0])
    assert cli.main(["table2", "--out", str(out), "--seeds", "1", "--table-only", "--rows", "fedcopl"]) == 0
    average = statistics.fmean(values.values())
    assert f"| {average:.2f} · paper 72.31 (Δ {average - 72.31:+.2f}) |" in (out / "table2" / "table.md").read_text()


def test_slurm_array_script(tmp_path, capsys):
    out, data = tmp_path / "tables", tmp_path / "data"
    specs = expand(GRIDS["table6"], [1, 2, 3], out)
    assert len(specs) == 8 * 4 * 3
    write_summary(specs[5].run_dir, final_mean_accuracy=50.0, final_client_accuracy=[50.0])  # finished: left out
    code = cli.main(["table6", "--seeds", "1,2,3", "--data-root", str(data), "--out", str(out), "--slurm",
                     "--slurm-parallel", "16", "--sbatch-option", "partition=gpu", "--dry-run", "--", "--optim.lr", "0.05"])
    assert code == 0
    script = (out / "table6" / "table6-array.sbatch").read_text()
    assert "#SBATCH --array=0-4,6-95%16\n" in script
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --gres=gpu:1\n" in script
    assert f"#SBATCH --output={out}/table6/slurm/%A_%a.out" in script
    task = script.strip().splitlines()[-1]
    assert task.startswith(f"{sys.executable} -m fedur.app.tables.cli table6 --task \"$SLURM_ARRAY_TASK_ID\" --seeds 1,2,3 --out {out}")
    assert f"--data-root {data}" in task and "--launcher 'srun --kill-on-bad-exit=1'" in task
    assert task.endswith('-- --optim.lr 0.05 --run.threads "${SLURM_CPUS_PER_TASK:-1}" --fabric.num_nodes "$SLURM_NNODES" '
                         '--fabric.devices "$SLURM_NTASKS_PER_NODE"')
    index = (out / "table6" / "runs.tsv").read_text().splitlines()
    assert len(index) == 1 + 96 and index[6].startswith("5\tdone\t")

    # What task 7 runs: run 7 of the grid, through srun, with the task's extra flags.
    capsys.readouterr()
    assert cli.main(["table6", "--task", "7", "--seeds", "1,2,3", "--data-root", str(data), "--out", str(out),
                     "--launcher", "srun --kill-on-bad-exit=1", "--dry-run", "--", "--optim.lr", "0.05"]) == 0
    printed = capsys.readouterr().out
    spec = specs[7]
    assert f"task 7: new: {spec.name}" in printed
    expected = command(spec, Inputs(data_root=str(data), launcher="srun --kill-on-bad-exit=1", extra=("--optim.lr", "0.05")))
    assert expected[:4] == ["srun", "--kill-on-bad-exit=1", sys.executable, str(REPO / "fedur" / "main.py")]
    assert " ".join(expected[-12:]) in printed
    assert f"--dataset.root {data / spec.column.dataset}" in printed
    seeded = command(spec, Inputs(data_root=str(data), extra=("--federation.partition_seed", "{seed}")))
    assert seeded[seeded.index("--federation.partition_seed") + 1] == str(spec.seed) == "2"


def flag_pairs(flags: tuple[str, ...]) -> list[tuple[str, str]]:
    assert len(flags) % 2 == 0, flags
    return list(zip(flags[::2], flags[1::2]))


def check_flag(flag: str, value: str) -> None:
    """`--group.key value` names a real setting and a value its type allows (plugins: parsed whole below)."""
    group, _, key = flag[2:].partition(".")
    if group in PLUGINS:
        return
    assert group in GROUPS, flag
    types = typing.get_type_hints(GROUPS[group])
    assert key in {f.name for f in fields(GROUPS[group])}, flag
    hint = types[key]
    if typing.get_origin(hint) is typing.Literal:
        assert value in typing.get_args(hint), (flag, value)
    elif hint is bool:
        assert value in ("true", "false"), (flag, value)


@pytest.mark.slow
def test_grids_resolve_to_configs_and_real_settings():
    from fedur.app.cli import build_parser

    parser = build_parser()
    for grid in GRIDS.values():
        assert len({r.key for r in grid.rows}) == len(grid.rows) and len({c.key for c in grid.columns}) == len(grid.columns)
        for column in grid.columns:
            assert config_path(column.config).is_file(), (grid.name, column.config)
            for row in grid.rows:  # every baseline has its own settings for every column ('own' protocol)
                assert row.preset is None or config_path(preset_config(row, column)).is_file(), (grid.name, row.key)
            for flag, value in flag_pairs(column.flags):
                check_flag(flag, value)
        for flag, value in flag_pairs(grid.flags) + [p for r in grid.rows for p in flag_pairs(r.flags)]:
            check_flag(flag, value)
        # One whole command line per grid through fedur's own parser (the last row on the last column).
        spec = expand(grid, [1], Path("/tmp/never-written"))[-1]
        args = command(spec, Inputs(data_root="/data", model_dir="/models"))[3:]
        assert parser.parse_args(args).run.seed == 1
    # Every row's flags (methods and labellers by class name, their settings) through the parser.
    rows = {r.flags for grid in GRIDS.values() for r in grid.rows}
    for flags in rows:
        assert parser.parse_args(["--config", str(config_path("tiny.yaml")), *flags]).method is not None, flags
    assert [c.config for c in GRIDS["table1"].columns][:2] == ["paper/table1/dtd-beta0.1.yaml",
                                                               "paper/table1/resisc45-beta0.1.yaml"]
    assert len(expand(GRIDS["table1"], [1, 2, 3], Path("x"))) == 12 * 12 * 3
    assert len(expand(GRIDS["table7"], [1, 2, 3], Path("x"))) == 16 * 5 * 3


@pytest.mark.slow  # eight skeletons built: 3 s
def test_the_backbone_grid_says_what_each_backbone_takes_and_skips_what_it_cannot():
    from fedur.app.tables.grids import BACKBONES
    from fedur.model.clip import backbone_features, register_model_config

    register_model_config(None)
    for name, _tag, _label, takes in BACKBONES:
        assert backbone_features(name)[1] == takes, name
    columns = {c.flags[1] + ":" + c.flags[3]: c for c in GRIDS["backbones"].columns}
    assert columns["RN50:openai"].skip_rows == ("fedcopl", "fedur")
    assert columns["ViT-B-16-SigLIP:webli"].skip_rows == ("fedotp+fpl", "fedotp+cpl")
    specs = expand(GRIDS["backbones"], [1], Path("x"))
    assert not any(s.row.key in s.column.skip_rows for s in specs) and len(specs) == 12 * 8 - 2 * 4
    assert [c.dataset for c in GRIDS["coop"].columns] == ["imagenet", "caltech101", "oxford_pets", "stanford_cars",
                                                          "oxford_flowers", "food101", "fgvc_aircraft", "sun397", "dtd",
                                                          "eurosat", "ucf101"]


def test_paper_numbers_are_consistent():
    # The paper's Average columns are the means of its cells (to rounding).
    for table, settings in PAPER_AVERAGE.items():
        for setting, rows in settings.items():
            for row, average in rows.items():
                cells = [PAPER[table][d][setting][row] for d in DATASETS_T1]
                assert statistics.fmean(cells) == pytest.approx(average, abs=0.006), (table, setting, row)
    # Table 7's printed gains are CoDPL minus the baseline row above it.
    base = {"promptfl": "promptfl+cpl", "promptprox": "promptprox+cpl", "pfedprompt": "pfedprompt+fpl", "fedotp": "fedotp+fpl"}
    for row, gains in TABLE7_GAINS.items():
        for dataset, gain in zip(DATASETS_T1[:5], gains):
            t7 = PAPER["table7"][dataset]["beta0.1"]
            assert t7[row] - t7[base[row.split("+")[0]]] == pytest.approx(gain, abs=0.006)
            assert t7[base[row.split("+")[0]]] == PAPER["table1"][dataset]["beta0.1"][base[row.split("+")[0]]]
    # Table 6's FedCoPL and FedUR rows are Table 1's at beta 0.1.
    for dataset in DATASETS_T1[:4]:
        for row in ("fedcopl", "fedur"):
            assert PAPER["table6"][dataset]["beta0.1"][row] == PAPER["table1"][dataset]["beta0.1"][row]
    assert PAPER["table1"]["cifar10"]["beta0.05"]["fedur"] == 96.06
    assert PAPER["table2"]["resisc45"]["quantity"]["fedcopl"] == 81.06


@pytest.mark.slow
def test_fedur_tables_works_from_an_installed_wheel(tmp_path):
    """A built wheel, installed on its own (no checkout on the path): the grids find their configs inside the
    package, and nothing refers to the repository or to ../shared."""
    import venv

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)],
                   check=True, capture_output=True, timeout=600)
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import zipfile

    zipfile.ZipFile(next(wheels.glob("fedur-*.whl"))).extractall(site)  # the wheel's files, as pip installs them
    deps = [p for p in sys.path if p.endswith("site-packages")]  # torch, jsonargparse, ... (not fedur: no .pth read)
    (Path(site) / "deps.pth").write_text("\n".join(deps) + "\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    run = subprocess.run([str(python), "-m", "fedur.app.tables.cli", "table1", "--dry-run", "--seeds", "1", "--rows", "fedur",
                          "--columns", "cub-beta0.1", "--data-root", "/data", "--out", str(away / "tables")],
                         cwd=away, capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"]})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    config = str(Path(site) / "fedur" / "configs" / "paper" / "table1" / "cub-beta0.1.yaml")
    assert f"--config {config}" in run.stdout and str(REPO) not in run.stdout
    proxy = subprocess.run([str(python), "-m", "fedur.app.tables.cli", "proxy-table1", "--seeds", "1", "--data-root", "/data",
                            "--out", str(away / "tables")], cwd=away, capture_output=True, text=True, timeout=300,
                           env={"PATH": os.environ["PATH"]})
    assert proxy.returncode == 2 and "--model-dir DIR or $FEDUR_TINY_CLIP" in proxy.stderr


@pytest.mark.slow
def test_figures_from_hand_written_runs(tmp_path, capsys):
    """fedur-tables writes Figure 3 (accuracy against K and the joining rate, a band over the seeds), Figure 2 (the
    prompt divergence per round, visual and text) and a bar chart per table section, as PNG and PDF; the lines
    are the cells' numbers."""
    from fedur.app.tables.figures import divergence_series, figure3_series
    from fedur.app.tables.render import collect

    out = tmp_path / "tables"
    grid = GRIDS["figure3"]
    specs = expand(grid, [1, 2], out, rows=["fedur", "promptfl+fpl"])
    for spec in specs:
        x = float(spec.column.setting.removeprefix("clients").removeprefix("join"))
        final = 50.0 + x / 10 + spec.seed + (5.0 if spec.row.key == "fedur" else 0.0)
        write_summary(spec.run_dir, final_mean_accuracy=final, final_client_accuracy=[final - 10, final + 10])
        divergence = {"visual": {"drift_diversity": 0.1 * spec.seed}, "text_ctx": {"drift_diversity": 0.2}}
        if spec.row.key != "fedur":  # PromptFL: a text prompt only, no Figure 2 line
            divergence = {"text_ctx": {"drift_diversity": 0.3}}
        lines = [json.dumps({"round": r, "prompt_divergence": divergence}) for r in range(3)]
        (spec.run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert cli.main(["figure3", "--out", str(out), "--table-only", "--seeds", "1,2", "--rows", "fedur,promptfl+fpl"]) == 0

    folder = out / "figure3"
    printed = capsys.readouterr().out
    for stem in ("figure3-clients", "figure3-join", "figure2-cifar10-clients10", "table-cifar10-clients5-to-cifar10-clients100",
                 "table-cifar10-join0.1-to-cifar10-join0.5"):
        for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
            path = folder / f"{stem}{suffix}"
            assert path.is_file() and path.read_bytes()[:4] == magic and path.stat().st_size > 5000, path
        assert f"{folder / stem}.png" in printed

    cells = collect(grid, [s for s in expand(grid, [1, 2], out) if s.row.key in ("fedur", "promptfl+fpl")])
    clients = figure3_series(grid, cells, "clients")
    xs, means, lows, highs = clients["FedUR CoDPL, cifar10"]
    assert xs == [5.0, 10.0, 20.0, 50.0, 100.0]
    assert means == pytest.approx([55.0 + x / 10 + 1.5 for x in xs]) and highs == pytest.approx([56.0 + x / 10 + 1 for x in xs])
    assert lows == pytest.approx([55.0 + x / 10 + 1 for x in xs])
    assert figure3_series(grid, cells, "join")["PromptFL FPL, cifar10"][0] == [0.1, 0.2, 0.5]

    curves = divergence_series([s for s in specs if s.column.key == "cifar10-clients10"])
    assert curves.keys() == {"visual", "text_ctx"} and set(curves["visual"]) == {"FedUR CoDPL"}  # PromptFL: no visual
    assert set(curves["text_ctx"]) == {"FedUR CoDPL"}
    rounds, mean, low, high = curves["visual"]["FedUR CoDPL"]
    assert rounds == [1, 2, 3] and mean == pytest.approx([0.15] * 3) and (low, high) == (pytest.approx([0.1] * 3), pytest.approx([0.2] * 3))


def test_own_protocol_runs_baselines_with_their_presets(tmp_path):
    """table7-own: the same rows and columns as table7, in a folder of their own, each baseline with its published
    settings (configs/presets/) over the column's config and under the row's method; rows without a preset
    (FedUR, FedCoPL, zero-shot) as in the paper's protocol. The table says which protocol it shows."""
    from fedur.app.cli import parse_config
    from fedur.app.tables.grids import PRESETS, with_protocol

    own, paper = GRIDS["table7-own"], GRIDS["table7"]
    assert (own.rows, own.columns, own.protocol, paper.protocol) == (paper.rows, paper.columns, "own", "fedur")
    born_own = {"demo-privacy", "demo-system", "demo-async", "demo-robust"}  # grids of the 'own' protocol alone (each
    # baseline at its demo preset)
    assert {f"{name}-own" for name, g in GRIDS.items() if g.protocol == "fedur" and any(r.preset for r in g.rows)} == {
        name for name, g in GRIDS.items() if g.protocol == "own"} - born_own
    assert all(GRIDS[name].protocol == "own" and f"{name}-own" not in GRIDS for name in born_own)
    assert "table7-own" in GRIDS and "tiny-own" not in GRIDS and "demo-table1-own" in GRIDS
    with pytest.raises(ValueError, match="unknown protocol 'mine'; use one of fedur, own"):
        with_protocol(paper, "mine")

    expected = {  # method class, lr, local epochs, n_ctx, schedule, weighting: the presets' published settings
        "promptfl": ("PromptFL", 0.001, 5, 16, "cosine", "uniform"),
        "promptprox": ("PromptProx", 0.001, 1, 16, "constant", "data"),
        "pfedprompt": ("PFedPrompt", 0.001, 5, 16, "cosine", "uniform"),
        "fedotp": ("FedOTP", 0.001, 1, 4, "constant", "data"),
    }
    from fedur.app.tables.grids import BASELINES, NEW_BASELINES

    assert set(expected) == set(BASELINES)  # the paper's baselines (a preset each: test_plugin_description.py)
    assert set(PRESETS) - set(expected) <= set(NEW_BASELINES)  # the later methods': demo grids, proxy Table 7
    assert {r.preset for r in own.rows} == set(expected) and all(c.presets == "presets" for c in own.columns)
    spec = {s.row.key: s for s in expand(own, [1], tmp_path) if s.column.key == "cifar10-beta0.1"}
    for key, (cls, lr, epochs, n_ctx, schedule, weighting) in expected.items():
        cmd = command(spec[f"{key}+codpl"], Inputs(data_root="/data"))
        assert cmd[cmd.index("--config") + 3] == str(config_path(f"presets/{key}.yaml"))  # after the column's config
        cfg = parse_config(cmd[cmd.index("--config"):])
        assert type(cfg.method).__name__ == cls and type(cfg.labeller).__name__ == "CoDPL"
        assert (cfg.optim.lr, cfg.federation.local_epochs, cfg.model.n_ctx, cfg.optim.schedule) == (lr, epochs, n_ctx, schedule)
        assert cfg.method.weighting == weighting and cfg.federation.num_clients == 10  # the column's clients
    assert spec["fedotp+codpl"].run_dir.is_relative_to(tmp_path / "table7-own")
    table1 = {s.row.key: s for s in expand(GRIDS["table1-own"], [1], tmp_path)}
    assert command(table1["fedur"], Inputs(data_root="/data")).count("--config") == 1
    assert command(table1["promptfl+fpl"], Inputs(data_root="/data")).count("--config") == 2
    same = command(expand(paper, [1], tmp_path)[-1], Inputs(data_root="/data"))
    assert same.count("--config") == 1  # the paper's protocol: no preset

    out = tmp_path / "tables"
    for s in expand(own, [1], out, rows=["promptfl+codpl"], columns=["cifar10-beta0.1"]):
        write_summary(s.run_dir, final_mean_accuracy=80.0, final_client_accuracy=[70.0, 90.0])
    assert cli.main(["table7-own", "--out", str(out), "--table-only", "--seeds", "1", "--rows", "promptfl+codpl",
                     "--columns", "cifar10-beta0.1"]) == 0
    markdown = (out / "table7-own" / "table.md").read_text()
    assert "Protocol: each baseline with settings of its own over the column's (configs/presets/: its published" in markdown
    assert "The presets: configs/presets/fedotp.yaml" in markdown


def test_the_demo_grids_have_the_later_baselines_with_their_demo_presets(tmp_path):
    """Every method of fedur's beside the paper's (FedPGP, FedTPG, PromptFolio, SCAFFOLD, ...: not in the paper's
    tables, found from the classes) is a row of the demo's and the proxy's Table 1 (FPL, CPL) and Table 7 (every
    labeller), after the paper's baselines; under the 'own' protocol each with a published preset runs with its demo
    preset on the demo (configs/presets/demo/, the learning rate benchmarks/results/demo_lr_sweep.md chose) and its
    published one on the proxy."""
    from fedur.app.cli import parse_config
    from fedur.app.tables.grids import NEW_BASELINES

    later = {"fedpgp": ("FedPGP", 0.002), "fedtpg": ("FedTPG", 0.01), "promptfolio": ("PromptFolio", 0.01)}  # demo lr
    assert set(later) <= set(NEW_BASELINES)  # (NEW_BASELINES from the classes: test_plugin_description.py)
    keys7, paper7 = [r.key for r in GRIDS["demo-table7"].rows], [r.key for r in GRIDS["table7"].rows]
    assert keys7 == [r.key for r in GRIDS["proxy-table7"].rows] and keys7[:len(paper7)] == paper7
    assert keys7[len(paper7):] == [f"{m}+{pl}" for m in NEW_BASELINES for pl in ("fpl", "cpl", "copl", "codpl")]
    keys1 = [r.key for r in GRIDS["demo-table1"].rows]
    assert keys1 == [r.key for r in GRIDS["proxy-table1"].rows]
    assert keys1 == [*[r.key for r in GRIDS["table1"].rows][:-2], *(f"{m}+{pl}" for m in NEW_BASELINES for pl in ("fpl", "cpl")),
                     "fedcopl", "fedur"]
    assert not {r.preset for g in ("table1", "table2", "table7") for r in GRIDS[g].rows} & set(later)  # the paper's grids
    specs = {s.row.key: s for s in expand(GRIDS["demo-table7-own"], [1], tmp_path)}
    for m in later:
        cmd = command(specs[f"{m}+codpl"], Inputs())
        assert cmd[cmd.index("--config") + 3] == str(config_path(f"presets/demo/{m}.yaml"))
        cfg = parse_config(cmd[cmd.index("--config"):])
        assert (type(cfg.method).__name__, cfg.optim.lr) == later[m] and type(cfg.labeller).__name__ == "CoDPL"
        assert command(expand(GRIDS["demo-table7"], [1], tmp_path, rows=[f"{m}+codpl"])[0], Inputs()).count("--config") == 1
        proxy = command(expand(GRIDS["proxy-table7-own"], [1], tmp_path, rows=[f"{m}+fpl"])[0], Inputs(data_root="/d"))
        assert proxy[proxy.index("--config") + 3] == str(config_path(f"presets/{m}.yaml"))


def test_the_worst_client_ignores_clients_without_test_images(tmp_path):
    from fedur.app.tables.render import collect

    grid = GRIDS["tiny"]
    spec = expand(grid, [1], tmp_path)[0]
    write_summary(spec.run_dir, final_mean_accuracy=60.0, final_client_accuracy=[70.0, None, 50.0])  # client 1: no test
    cell = collect(grid, [spec])[(spec.row.key, spec.column.key)]
    assert cell.worst == {1: 50.0}


def test_a_grid_ranks_its_runs_by_the_label_free_estimate_with_the_regret(tmp_path, capsys):
    """In a column and seed, the run whose kept models the estimate rates highest is the one a user without labels
    deploys; the regret is what that costs against the best run by test accuracy."""
    out = tmp_path / "tables"
    runs = {(s.row.key, s.column.key, s.seed): s for s in expand(GRIDS["table1"], [1, 2], out)}
    column = "dtd-beta0.1"
    write_summary(runs[("fedur", column, 1)].run_dir, final_mean_accuracy=62.0, final_client_accuracy=[60.0, 64.0],
                  final_estimated_mean=55.0)
    write_summary(runs[("fedcopl", column, 1)].run_dir, final_mean_accuracy=66.0, final_client_accuracy=[60.0, 72.0],
                  final_estimated_mean=50.0)
    write_summary(runs[("zeroshot", column, 1)].run_dir, final_mean_accuracy=40.0, final_client_accuracy=[30.0, 50.0],
                  label_free_choice={"chosen_estimate_mean": 57.0, "chosen_mean": 45.0})  # its choice's estimate wins
    write_summary(runs[("fedur", column, 2)].run_dir, final_mean_accuracy=63.0, final_client_accuracy=[60.0, 66.0],
                  final_estimated_mean=55.0)  # alone in seed 2: nothing to choose among
    assert cli.main(["table1", "--out", str(out), "--table-only", "--rows", "fedur,fedcopl,zeroshot",
                     "--columns", column]) == 0
    markdown = (out / "table1" / "table.md").read_text()
    assert "## Runs ranked without labels" in markdown
    assert "| dtd-beta0.1 | 1 | 3 | CLIP (zero-shot) / - | 57.00 | 45.00 | FedCoPL / CoPL | 66.00 | 21.00 |" in markdown
    assert "| dtd-beta0.1 | 2 |" not in markdown and "Mean regret over 1 column x seed choice(s): 21.00 points." in markdown


def test_the_async_grids_time_to_95_percent_reads_the_synchronous_runs_final_accuracy(tmp_path):
    """demo-async's time columns (Column.target) on hand-written runs of one row and spread: the virtual clock of the
    first line at or past 95% of the synchronous run's final personal accuracy (a step that did not evaluate skipped),
    n/a for a seed that never got there; and the accuracy-against-virtual-time figure of the spread."""
    from fedur.app.tables.render import render

    grid = GRIDS["demo-async"]
    columns = [c.key for c in grid.columns if c.key.startswith("demo-async-s1-")]
    specs = expand(grid, [1, 2], tmp_path, rows=["fedur"], columns=columns)
    curves = {  # (owner column, seed) -> [(virtual clock, personal accuracy or None)], the synchronous final: 80 and 70
        ("sync", 1): [(10.0, 60.0), (20.0, 75.0), (30.0, 80.0)], ("sync", 2): [(10.0, 50.0), (20.0, 66.5), (30.0, 70.0)],
        ("fedasync", 1): [(2.0, 70.0), (4.0, None), (6.0, 76.5), (8.0, 79.0)], ("fedasync", 2): [(2.0, 40.0), (4.0, 50.0)],
    }
    for spec in specs:
        key = spec.column.key.split("-s1-")[1]
        if spec.column.runs is not None or (key, spec.seed) not in curves:
            continue
        spec.run_dir.mkdir(parents=True)
        rows = [{"round": i + 1, "mean_accuracy": a, "virtual_clock": t} for i, (t, a) in enumerate(curves[key, spec.seed])]
        (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        final = [a for _, a in curves[key, spec.seed] if a is not None][-1]
        (spec.run_dir / "summary.json").write_text(json.dumps({
            "final_mean_accuracy": final, "final_client_accuracy": [final], "zero_shot_client_mean": 30.0,
            "system": {"virtual_seconds": curves[key, spec.seed][-1][0]}}))
    cells, files = render(grid, specs, [1, 2], tmp_path / "out")
    to95 = {column: cells[("fedur", f"demo-async-s1-{column}-to95")] for column in ("sync", "fedasync")}
    assert to95["sync"].value == {1: 30.0, 2: 20.0}  # 95% of 80 is 76 (reached at 30 s), of 70 is 66.5 (at 20 s)
    assert to95["fedasync"].value == {1: 6.0} and to95["fedasync"].absent == [2]  # seed 2 never reached 66.5: n/a
    whole = cells[("fedur", "demo-async-s1-fedasync-virtual")]
    assert whole.value == {1: 8.0, 2: 4.0}
    table = (tmp_path / "out" / "table.md").read_text()
    assert "## virtual seconds to 95% of the synchronous run's final accuracy, speed spread 1" in table
    assert "6.00 [1/2 seeds]" in table and "virtual seconds to reach a fraction" in table
    assert tmp_path / "out" / "accuracy-virtual-time-speed-spread-1.png" in files



def test_a_column_that_reads_another_columns_runs_is_not_ranked_again(tmp_path):
    """demo-async's time columns show other numbers of the sync column's runs: the ranking without labels chooses
    among a column's runs once, in the column that made them."""
    from fedur.app.tables.ranking import ranked

    specs = expand(GRIDS["demo-async"], [1], tmp_path, rows=["fedur", "fedcopl"])
    made = [s for s in specs if s.column.key == "demo-async-s1-sync"]
    for spec, estimate in zip(made, (70.0, 75.0)):
        write_summary(spec.run_dir, final_mean_accuracy=estimate - 5, final_estimated_mean=estimate)
    assert any(s.column.runs == "demo-async-s1-sync" for s in specs)  # the time columns read these runs
    assert [(r["column"], r["chosen"]) for r in ranked(specs)] == [("demo-async-s1-sync", "FedCoPL / CoPL")]
