"""The plugins a user copies (examples/), run from there: the dataset here, the methods and the labeller in
tests/test_plugins.py, tests/test_methods.py, tests/test_resume.py and tests/train/test_method_api_runs.py; and every
example is one of them."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedur import plugins
from fedur.data import synthetic

from .conftest import REPO
from .own_data import write_images

EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.py") if p.name != "__init__.py")


def test_every_example_is_a_plugin_the_tests_run_by_its_import_path():
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    for path in EXAMPLES:
        classes = re.findall(r"^class (\w+)\((\w+)\)", path.read_text(), flags=re.M)
        assert classes, f"{path.name} defines no plugin class"
        for name, _ in classes:
            assert f"examples.{path.stem}.{name}" in tests or f"from examples.{path.stem} import {name}" in tests, (
                f"no test runs examples/{path.name}'s {name}")
    assert {"server_momentum", "feature_adapter", "confident", "listed_images"} <= {p.stem for p in EXAMPLES}


def listed(folder: Path, per_class: int = 6) -> Path:
    """Three generated shapes as PNG files under folder/photos/, and images.csv listing them (train and test)."""
    images, labels = synthetic.generate(3, 2 * per_class, 32, seed=(0, 0))
    rows = []
    for i, (image, label) in enumerate(zip(images, labels)):
        write_images(folder / "photos", image[None], start=i)
        rows.append((f"photos/img_{i:04d}.png", synthetic.CLASSNAMES[label], "train" if i % 2 else "test"))
    with open(folder / "images.csv", "w", newline="") as f:
        csv.writer(f).writerows([("path", "class", "split"), *rows])
    return folder / "images.csv"


@pytest.mark.slow  # a whole (tiny) run
def test_a_dataset_listed_in_a_csv_file_runs(tmp_path):
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    listing = listed(tmp_path / "data")
    run_dir = tmp_path / "run"
    run(parse_config(["--config", "configs/tiny.yaml", "--dataset", "examples.listed_images.ListedImages",
                      "--dataset.file", str(listing), "--federation.num_clients", "2", "--federation.rounds", "1",
                      "--federation.min_train_per_client", "1", "--run.output_dir", str(run_dir), "--run.progress", "false"]))
    partition = json.loads((run_dir / "partition.json").read_text())
    assert partition["classnames"] == [synthetic.CLASSNAMES[c] for c in dict.fromkeys(synthetic.generate(3, 12, 32, seed=(0, 0))[1])]
    assert sum(partition["train_sizes"]) == 18 and np.array(partition["test"]).sum() == 18
    assert json.loads((run_dir / "summary.json").read_text())["dataset"] == "listed_images"


def test_a_listed_dataset_refuses_a_missing_list_in_one_line(tmp_path, run_main):
    result = run_main("--config", "configs/tiny.yaml", "--dataset", "examples.listed_images.ListedImages",
                      "--dataset.file", str(tmp_path / "none.csv"), "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.count("fedur: error:") == 1 and "none.csv does not exist" in result.stderr
    assert not (tmp_path / "run").exists()
    assert "ListedImages" not in plugins.names("dataset")  # a user's class is not one of fedur's
