"""fedur-report on two hand-written run directories (one finished, one stopped), and the matplotlib figures."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fedur.app.report import main
from fedur.plots import heatmap, line_plot, save

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


def test_report_of_a_run_without_labels_leaves_accuracy_empty(tmp_path):
    """Clients' own folders without test labels: accuracies are null, partition.json has sizes, no class counts."""
    run = tmp_path / "unlabelled"
    run.mkdir()
    rows = [{"round": r, "mean_accuracy": None, "client_accuracy": [None, None], "selected": [40 + r, 30],
             "round_seconds": 60.0} for r in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "partition.json").write_text(json.dumps({"train": None, "test": None, "train_sizes": [40, 30]}))
    settings = {"federation": {"partition": "clients", "num_clients": 2, "rounds": 2}}
    (run / "summary.json").write_text(json.dumps({"zero_shot_client_mean": None, "zero_shot_client_accuracy": [None, None],
                                                  "dataset": "clientfolders", "wall_seconds": 120.0, "settings": settings}))
    main([str(run), "--out", str(tmp_path / "report")])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| unlabelled | clientfolders | clients | 2 | 2/2 |  |  |  | 2m00s | complete |" in text
    assert "| 0 | 40 |  |  |  | 41 |" in text and "| 1 | 30 |  |  |  | 30 |" in text
    assert sorted(p.name for p in (tmp_path / "report").glob("*.png")) == ["accuracy_mean.png"]  # no empty client plot


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
            assert FIRST in colours and SECOND in colours  # two lines: two runs, or two clients
    printed = capsys.readouterr().out
    assert printed.startswith("# fedur runs") and f"wrote {out / 'report.md'}, {out / pngs[0]}" in printed


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    """In this process (`python -m fedur.app.report` itself: test_report_of_real_runs_written_by_fedur): exit status 2."""
    (tmp_path / "prompts").mkdir()
    with pytest.raises(SystemExit) as exit:
        main([str(tmp_path / "prompts"), "--out", str(tmp_path / "out")])
    assert exit.value.code == 2
    stderr = capsys.readouterr().err
    assert f"fedur-report: error: {tmp_path / 'prompts'} is not a fedur run directory" in stderr
    assert "neither metrics.jsonl nor summary.json" in stderr and not (tmp_path / "out").exists()


FIRST, SECOND = (31, 119, 180), (255, 127, 14)  # matplotlib's first two line colours (tab10)


def test_heatmap_shows_counts_coloured_by_value_or_by_row_share(tmp_path):
    counts = np.array([[0, 2], [4, 1]])
    fig = heatmap(counts, ["a", "b"], ["x", "y"], "t")
    ax = fig.axes[0]
    assert np.array_equal(ax.images[0].get_array(), counts)
    assert [t.get_text() for t in ax.texts] == ["0", "2", "4", "1"]  # small matrices carry their counts
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"] and ax.get_title() == "t"
    rows = heatmap(counts, ["a", "b"], ["x", "y"], "t", normalize_rows=True)
    assert np.allclose(rows.axes[0].images[0].get_array(), [[0, 1], [0.8, 0.2]])  # colour: share of the row
    save(fig, tmp_path / "h.png")
    with Image.open(tmp_path / "h.png") as image:
        assert image.format == "PNG"


def test_a_large_heatmap_thins_its_labels_and_drops_the_counts():
    """CUB: 5 clients x 200 classes stays readable: every 4th class named, no numbers in the cells."""
    fig = heatmap(np.arange(1000).reshape(5, 200), [f"client {k}" for k in range(5)], [f"c{i}" for i in range(200)], "t")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:3] == ["c0", "c4", "c8"] and len(labels) == 50 and not ax.texts


def test_line_plot_breaks_lines_at_missing_values():
    fig = line_plot({"a": ([0, 1, 2], [1.0, None, 3.0]), "b": ([0, 1], [2.0, 2.5])}, "t", "x", "y")
    ax = fig.axes[0]
    a, b = ax.get_lines()
    assert np.isnan(a.get_ydata()[1]) and list(b.get_xdata()) == [0, 1]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]


def test_line_plot_of_no_or_one_point(tmp_path):
    empty = line_plot({"a": ([], [])}, "t", "x", "y")  # a run stopped before its first round
    single = line_plot({"a": ([0], [1.0])}, "t", "x", "y")
    assert len(empty.axes[0].get_lines()[0].get_xdata()) == 0 and len(single.axes[0].get_lines()[0].get_xdata()) == 1
    save(empty, tmp_path / "empty.png")
    save(single, tmp_path / "single.png")


@pytest.mark.slow
def test_report_of_real_runs_written_by_fedur(tmp_path):
    """Two smoke runs written by fedur itself (so the report follows the run format), reported through
    `python -m fedur.app.report`, the module the `fedur-report` console script runs."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    for name, extra in (("fedur", []), ("fedcopl", ["--method", "FedCoPL"])):
        cfg = parse_config(["--config", "configs/tiny.yaml", "--federation.rounds", "2",
                                         "--run.output_dir", str(tmp_path / name), *extra])
        run(cfg)
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "fedur.app.report", str(tmp_path / "fedur"), str(tmp_path / "fedcopl"),
                             "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    markdown = (out / "report.md").read_text()
    assert "| fedur | synthetic | dirichlet (beta 0.5) | 4 | 2/2 |" in markdown
    assert "| fedcopl | synthetic |" in markdown and markdown.count("| complete |") == 2
    assert sorted(p.name for p in out.glob("*.png")) == [  # the protocols' curves: personal, global, dual
        "accuracy_clients_fedcopl.png", "accuracy_clients_fedur.png", "accuracy_mean.png",
        "accuracy_protocols_fedcopl.png", "accuracy_protocols_fedur.png",
    ]


def test_report_of_the_evaluation_protocols(tmp_path):
    """A run with a new client, the global model and base-to-novel: their table and their curves."""
    run = tmp_path / "protocols"
    write_run(run, [[60.0, 80.0, 30.0], [70.0, 90.0, 35.0]], [50.0, 70.0, 40.0], summary=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, (personal, global_acc, novel) in zip(rows, ((70.0, 65.0, 55.0), (80.0, 76.0, 60.0))):
        row.update(mean_accuracy=personal, selected=[40, 30, 0], weighted_accuracy=personal + 1, global_accuracy=global_acc,
                   dual_accuracy=2 * personal * global_acc / (personal + global_acc), new_clients=[2],
                   new_client_accuracy=row["client_accuracy"][2], held_out_accuracy={"novel": novel},
                   base_novel_harmonic=2 * personal * novel / (personal + novel))
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "zero_shot_global": 58.0, "zero_shot_new_clients": 40.0,
                                                  "new_client_adapted_accuracy": 45.0, "zero_shot_held_out": {"novel": 50.0}}))
    main([str(run), "--out", str(tmp_path / "report")])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| 2 (new) |" in text
    assert "| personal | mean over the 2 training client(s), each on its own test set with its own model |" in text
    assert "| global | the server's model on the 2 training client(s)' test images together | 58.00 | 76.00 | 76.00 @ 2 |" in text
    assert "| new clients, as they arrive | clients [2], held out of every round | 40.00 | 35.00 | 35.00 @ 2 |" in text
    assert "| new clients, adapted | after adapting alone on their own train images |  | 45.00 |  |" in text
    assert "| novel | the server's model on the novel classes, with their names | 50.00 | 60.00 | 60.00 @ 2 |" in text
    assert "| base-novel harmonic |" in text
    with Image.open(tmp_path / "report" / "accuracy_protocols_protocols.png") as image:
        assert image.format == "PNG" and image.width > 600
