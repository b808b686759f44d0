"""fedur-report on two hand-written run directories (one finished, one stopped), and the PIL plots."""

import json
import subprocess
import sys

import numpy as np
from PIL import Image

from fedur.plots import TAB10, chw, colormap, heatmap, line_plot, nice_ticks
from fedur.report import main

from .conftest import REPO


def write_run(folder, accuracy, zero_shot, summary: bool, partition="dirichlet"):
    """A run directory as fedur writes it: `accuracy` (rounds, clients) in %."""
    folder.mkdir()
    settings = {"data": {"name": "cifar10"}, "federation": {"partition": partition, "beta": 0.1, "num_clients": 2, "rounds": 3}}
    rows = [
        {"round": r, "mean_accuracy": sum(acc) / 2, "client_accuracy": acc, "selected": [40 + r, 30], "round_seconds": 60.0}
        for r, acc in enumerate(accuracy)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "partition.json").write_text(json.dumps({"train": [[100, 20], [5, 75]], "test": [[10, 2], [1, 7]]}))
    zero = {"zero_shot_client_mean": sum(zero_shot) / 2, "zero_shot_client_accuracy": zero_shot}
    if summary:
        (folder / "summary.json").write_text(json.dumps({**zero, "wall_seconds": 200.0, "settings": settings}))
    else:  # still running: the config and zero-shot files are there, the summary is not
        (folder / "zero_shot.json").write_text(json.dumps(zero))
        (folder / "config.yaml").write_text(
            "data:\n  name: cifar10\nfederation:\n  partition: iid\n  num_clients: 2\n  rounds: 3\n"
        )


def test_report_of_a_finished_and_a_running_run(tmp_path, capsys):
    write_run(tmp_path / "fedur-s1", [[50.0, 70.0], [80.0, 70.0], [70.0, 74.0]], [40.0, 60.0], summary=True)
    write_run(tmp_path / "fedcopl-s1", [[45.0, 55.0]], [40.0, 60.0], summary=False)
    out = tmp_path / "report"
    main([str(tmp_path / "fedur-s1"), str(tmp_path / "fedcopl-s1"), "--out", str(out)])

    text = (out / "report.md").read_text()
    assert "| fedur-s1 | cifar10 | dirichlet (beta 0.1) | 2 | 3/3 | 50.00 | 72.00 | 75.00 @ 2 | 3m20s | complete |" in text
    assert "| fedcopl-s1 | cifar10 | iid | 2 | 1/3 | 50.00 | 50.00 | 50.00 @ 1 | 1m00s so far | incomplete |" in text
    assert "## fedcopl-s1 (incomplete: no summary.json yet)" in text
    assert "| 0 | 120 | 40.00 | 70.00 | 80.00 @ 2 | 42 |" in text  # client 0 of fedur-s1
    assert "| 1 | 80 | 60.00 | 74.00 | 74.00 @ 3 | 30 |" in text
    pngs = ["accuracy_mean.png", "accuracy_clients_fedur-s1.png", "accuracy_clients_fedcopl-s1.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(pngs + ["report.md"])
    for name in pngs:
        assert f"]({name})" in text
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.width > 600
            colours = {c for _, c in image.convert("RGB").getcolors(1 << 20)}
            assert TAB10[0] in colours and TAB10[1] in colours  # two lines: two runs, or two clients
    printed = capsys.readouterr().out
    assert printed.startswith("# fedur runs") and f"wrote {out / 'report.md'}, {out / pngs[0]}" in printed


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "prompts").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "fedur.report", str(tmp_path / "prompts"), "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert f"fedur-report: error: {tmp_path / 'prompts'} is not a fedur run directory" in result.stderr
    assert "neither metrics.jsonl nor summary.json" in result.stderr and not (tmp_path / "out").exists()


def test_heatmap_colours_each_cell_by_its_share_of_the_maximum():
    image = heatmap(np.array([[0, 2], [4, 1]]), ["a", "b"], ["x", "y"], "t")
    colours = {c for _, c in image.getcolors(1 << 20)}
    assert {colormap(0.0), colormap(0.5), colormap(1.0), colormap(0.25)} <= colours
    rows = heatmap(np.array([[0, 2], [4, 1]]), ["a", "b"], ["x", "y"], "t", normalize_rows=True)
    row_colours = {c for _, c in rows.getcolors(1 << 20)}
    assert colormap(0.5) not in row_colours and colormap(1.0) in row_colours  # 2 is its row's maximum
    array = chw(image)
    assert array.dtype == np.uint8 and array.shape == (3, image.height, image.width)
    assert tuple(array[:, 0, 0]) == (255, 255, 255)


def test_colormap_and_ticks():
    assert colormap(0.0) == (68, 1, 84) and colormap(1.0) == (253, 231, 37) and colormap(2.0) == colormap(1.0)
    assert colormap(0.125) == (64, 42, 112)  # halfway between the first two stops
    assert nice_ticks(0, 100, 6) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(15.8, 62.3, 6) == [10, 20, 30, 40, 50, 60, 70]
    assert nice_ticks(3.0, 3.0) == [3.0, 3.5, 4.0]


def test_line_plot_breaks_lines_at_missing_values():
    both = line_plot({"a": ([0, 1, 2], [1.0, 2.0, 3.0])}, "t", "x", "y")
    broken = line_plot({"a": ([0, 1, 2], [1.0, None, 3.0])}, "t", "x", "y")
    count = lambda image: sum(n for n, c in image.getcolors(1 << 20) if c == TAB10[0])  # noqa: E731
    assert count(broken) < count(both) / 2  # two dots and the legend, no line


def test_line_plot_of_no_or_one_point():
    count = lambda image: sum(n for n, c in image.getcolors(1 << 20) if c == TAB10[0])  # noqa: E731
    empty = line_plot({"a": ([], [])}, "t", "x", "y")  # a run stopped before its first round
    single = line_plot({"a": ([0], [1.0])}, "t", "x", "y")
    assert 0 < count(empty) < count(single)  # the legend; then also the dot


def test_report_of_real_runs_written_by_fedur(tmp_path):
    """Two smoke runs written by fedur itself (so the report follows the run format), reported through
    `python -m fedur.report`, the module the `fedur-report` console script runs."""
    from fedur.main import parse_config, run

    for name, extra in (("fedur", []), ("fedcopl", ["--fedur.class_weights", "none", "--fedur.negatives", "none"])):
        cfg, config_yaml = parse_config(["--config", "configs/smoke.yaml", "--federation.rounds", "2",
                                         "--run.output_dir", str(tmp_path / name), *extra])
        run(cfg, config_yaml)
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "fedur.report", str(tmp_path / "fedur"), str(tmp_path / "fedcopl"),
                             "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    markdown = (out / "report.md").read_text()
    assert "| fedur | synthetic | dirichlet (beta 0.5) | 4 | 2/2 |" in markdown
    assert "| fedcopl | synthetic |" in markdown and markdown.count("| complete |") == 2
    assert sorted(p.name for p in out.glob("*.png")) == [
        "accuracy_clients_fedcopl.png", "accuracy_clients_fedur.png", "accuracy_mean.png",
    ]
