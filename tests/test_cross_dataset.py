"""fedur-cross-dataset: a finished run's server model on another dataset's test split (docs/protocols.md). On the
run's own dataset it must give the run's own global accuracy, which the round loop measured the same way."""

import json

import pytest

from fedur.app.cli import parse_config
from fedur.app.cross_dataset import main as cross_dataset_main
from fedur.app.run import run

pytestmark = pytest.mark.slow  # a whole fedur run

TINY = ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--run.progress", "false"]
TARGET = ["--dataset", "Synthetic", "--dataset.classes", "5", "--dataset.train_per_class", "60", "--dataset.test_per_class", "20"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    runs = {}
    for name, flags in {"fedur": [], "mean": ["--method.global_text", "mean", "--evaluation.new_clients", "1"],
                        "gdau": ["--method", "GDAU"], "zeroshot": ["--method", "ZeroShot"]}.items():
        run_dir = tmp_path_factory.mktemp(name) / "run"
        cfg = parse_config([*TINY, *flags, "--run.output_dir", str(run_dir)])
        run(cfg)
        runs[name] = run_dir
    return runs


@pytest.mark.parametrize("name", ["fedur", "mean", "gdau", "zeroshot"])
def test_on_its_own_dataset_it_gives_the_runs_own_global_accuracy(finished, name, capsys):
    run_dir = finished[name]
    assert cross_dataset_main([str(run_dir), *TARGET]) == 0
    (written,) = (run_dir / "cross_dataset").glob("synthetic-*.json")
    result, summary = json.loads(written.read_text()), json.loads((run_dir / "summary.json").read_text())
    if name == "mean":  # client 3 is new: the run's global protocol covers the training clients' test images only
        assert result["test_images"] == 100 and result["same_classes"]
    elif name == "zeroshot":  # no rounds, no checkpoint: its server model is zero-shot CLIP
        assert result["accuracy"] == result["zero_shot_accuracy"] == pytest.approx(summary["zero_shot_global"], abs=1e-9)
    else:  # the tiny split's test sets partition the test set: the same images, the same model
        assert result["accuracy"] == pytest.approx(summary["final_global_accuracy"], abs=1e-9)
        assert result["zero_shot_accuracy"] == pytest.approx(summary["zero_shot_global"], abs=1e-9)
    assert f"tested on synthetic (5 classes, 100 test images): {result['accuracy']:.2f}%" in capsys.readouterr().out


def test_other_classes_are_classified_among_their_own_names(finished):
    run_dir = finished["gdau"]  # its fitted classifier covers the training classes only: on others, zero-shot CLIP
    assert cross_dataset_main([str(run_dir), "--dataset", "SyntheticDomains", "--dataset.classes", "3",
                               "--dataset.domains", "[sketch]", "--dataset.test_per_class", "10"]) == 0
    (written,) = (run_dir / "cross_dataset").glob("synthetic_domains-*.json")
    result = json.loads(written.read_text())
    assert result["classes"] == 3 and result["test_images"] == 30 and not result["same_classes"]
    assert result["accuracy"] == result["zero_shot_accuracy"]


def test_an_unfinished_run_or_no_target_is_refused(tmp_path, finished, capsys):
    with pytest.raises(SystemExit):
        cross_dataset_main([str(finished["fedur"])])
    assert "name the target dataset" in capsys.readouterr().err
    assert cross_dataset_main([str(tmp_path), *TARGET]) == 2
    assert "holds no config.yaml" in capsys.readouterr().err
