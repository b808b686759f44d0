"""fedur-tables' protocol grids from hand-written summaries: a column showing another number of a run (Column.value),
columns reading one run (Column.runs: run once, shown many times), and a table that says what its cells show."""

import json
from pathlib import Path

from fedur.app.tables import cli
from fedur.app.tables.grids import ACCURACIES, GRIDS, expand


def write_summary(run_dir: Path, **values) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(values))


def test_base_to_novel_columns_read_one_run_and_show_base_novel_and_their_harmonic_mean(tmp_path, capsys):
    out, grid = tmp_path / "tables", GRIDS["demo-base2novel"]
    specs = [s for s in expand(grid, [1, 2], out) if s.row.key == "fedtpg"]
    assert len(specs) == 6 and len({s.run_dir for s in specs}) == 2  # three columns, one run per seed
    for seed, (base, novel) in ((1, (80.0, 60.0)), (2, (84.0, 70.0))):
        run = next(s.run_dir for s in specs if s.seed == seed)
        write_summary(run, final_mean_accuracy=base, final_client_accuracy=[base - 10, base + 10], new_clients=[],
                      final_novel_accuracy=novel, final_base_novel_harmonic=2 * base * novel / (base + novel))
    assert cli.main(["demo-base2novel", "--out", str(out), "--table-only", "--rows", "fedtpg", "--seeds", "1,2"]) == 0
    markdown = (out / "demo-base2novel" / "table.md").read_text()
    assert "seeds 1, 2: 2 of 2 runs finished" in markdown
    hm = (2 * 80 * 60 / 140 + 2 * 84 * 70 / 154) / 2
    assert f"| FedTPG | FPL | 82.00 ± 2.83 · worst 72.00 (70.00) | 65.00 ± 7.07 | {hm:.2f} ± " in markdown
    assert f"- novel: {ACCURACIES['final_novel_accuracy']}" in markdown  # the table says what the cells show
    capsys.readouterr()

    assert cli.main(["demo-base2novel", "--out", str(tmp_path / "dry"), "--rows", "fedtpg", "--seeds", "1", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("--evaluation.base_to_novel true") == 1  # the reading columns run nothing of their own


def test_a_nested_key_and_new_clients_left_out_of_the_worst_client(tmp_path):
    out, grid = tmp_path / "tables", GRIDS["demo-table3"]
    specs = [s for s in expand(grid, [1], out) if s.row.key == "fedur"]
    write_summary(specs[0].run_dir, final_domain_accuracy={"photo": 70.0, "sketch": 20.0, "mosaic": 30.0},
                  final_domain_mean=40.0, final_mean_accuracy=40.0, final_client_accuracy=[70.0, 20.0, 30.0])
    assert cli.main(["demo-table3", "--out", str(out), "--table-only", "--rows", "fedur", "--seeds", "1"]) == 0
    assert "| FedUR | CoDPL | 70.00 | 20.00 | 30.00 | 40.00 |" in (out / "demo-table3" / "table.md").read_text()

    specs = [s for s in expand(GRIDS["demo-protocols"], [1], out) if s.row.key == "fedur"]
    write_summary(specs[0].run_dir, final_mean_accuracy=60.0, final_client_accuracy=[50.0, 70.0, 60.0, 60.0, 5.0],
                  new_clients=[4], final_new_client_accuracy=5.0, new_client_adapted_accuracy=9.0,
                  final_global_accuracy=55.0, final_dual_accuracy=57.39, final_weighted_accuracy=61.0)
    assert cli.main(["demo-protocols", "--out", str(out), "--table-only", "--rows", "fedur", "--seeds", "1"]) == 0
    table = (out / "demo-protocols" / "table.md").read_text()
    assert "| FedUR | CoDPL | 60.00 · worst 50.00 (50.00) | 61.00 | 55.00 | 57.39 | 5.00 | 9.00 |" in table
