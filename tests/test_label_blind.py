"""Training never sees a true train label, for every method and every pseudo-labeller.

Each case runs twice on the generated shapes: once as drawn (a Dirichlet split by label), once with the train
labels scrambled (a permutation of the label values, then shuffled across the images:
tests/own_data.py::ScrambledSynthetic) and the split read back from the first run's partition.json
(federation.partition=file). Every selection, prompt, checkpoint and test accuracy must be bitwise the
same; only the monitoring may differ (pseudo-label accuracy, the class counts of the split). Structurally,
the rank's train split holds no labels once the split is made (fedur/train/setup.py), so this guards that
no path brings them back. The second run is also the proof that a split written by one run and read by
another gives the same results bitwise (the unscrambled replay is checked in tests/test_own_data.py on 2
ranks).
"""

import json

import numpy as np
import pytest
import torch

from fedur.app.main import main

from .conftest import read_rounds
from .own_data import ScrambledSynthetic
from .shared_runs import LABEL_FREE, SHARED, SPECIAL, method_cases, runs_rounds
from .test_resume import tensors_of

pytestmark = pytest.mark.slow  # whole (tiny) runs

MONITORING = {"pseudo_label_accuracy", "round_seconds", "phase_seconds"}  # what may differ, and timing
CASES = {**method_cases(), **LABEL_FREE}  # every one of fedur's methods, every labeller at least once, and a validation
# split with the label-free choice (tests/shared_runs.py)
CASES.update({name: SPECIAL[name] for name in ("fedur-fedbuff", "promptfl-fedasync")})  # the asynchronous servers: each
# client's refresh as it starts, with the others' last histograms
SYNTHETIC = ["--dataset.classes", "5", "--dataset.train_per_class", "60", "--dataset.test_per_class", "20"]  # tiny's
PERMUTATION_SEED = 3  # [3 4 1 0 2]: no label keeps its value


@pytest.fixture(scope="module")
def runs(tiny_runs, tmp_path_factory):
    """<case>-drawn: the session's shared run; <case>-scrambled: the same on scrambled train labels, its split read
    back from the drawn run's partition.json."""
    root = tmp_path_factory.mktemp("blind")
    for name, extra in CASES.items():
        drawn, scrambled = root / f"{name}-drawn", root / f"{name}-scrambled"
        drawn.symlink_to(tiny_runs / name)
        main([*SHARED, *extra, "--dataset", "tests.own_data.ScrambledSynthetic", *SYNTHETIC,
              "--dataset.permutation_seed", str(PERMUTATION_SEED), "--federation.partition", "file",
              "--federation.partition_file", str(drawn / "partition.json"), "--run.output_dir", str(scrambled)])
    return root


def test_the_scramble_changes_every_label_value():
    permutation = ScrambledSynthetic(classes=5, permutation_seed=PERMUTATION_SEED).permutation()
    assert sorted(permutation.tolist()) == list(range(5)) and (permutation != np.arange(5)).all()


@pytest.mark.parametrize("name", list(CASES))
def test_scrambled_train_labels_change_nothing_but_the_monitoring(runs, name):
    drawn, scrambled = runs / f"{name}-drawn", runs / f"{name}-scrambled"
    split = [json.loads((run / "partition.json").read_text()) for run in (drawn, scrambled)]
    assert split[0]["train_ids"] == split[1]["train_ids"] and split[0]["test_ids"] == split[1]["test_ids"]
    assert split[0].get("validation_ids") == split[1].get("validation_ids")  # (the label-free cases': read back)
    assert split[0]["train"] != split[1]["train"] and split[0]["test"] == split[1]["test"]  # the labels did change

    summaries = [json.loads((run / "summary.json").read_text()) for run in (drawn, scrambled)]
    for key in ("final_client_accuracy", "zero_shot_client_accuracy", "zero_shot_global", "best_mean_accuracy",
                "zero_shot_estimated_accuracy", "label_free_choice"):
        assert summaries[0].get(key) == summaries[1].get(key), key  # (a key absent from both: the choice where not asked)
    if not runs_rounds(CASES[name]):  # zero-shot CLIP: no rounds, nothing trained
        return
    rows = [read_rounds(run) for run in (drawn, scrambled)]
    strip = lambda row: {k: v for k, v in row.items() if k not in MONITORING}  # noqa: E731
    assert [strip(r) for r in rows[0]] == [strip(r) for r in rows[1]]  # selections, losses, accuracies, uploads
    if rows[0][0]["selection"] is not None:  # a labeller: its monitoring saw the scramble
        assert [r["pseudo_label_accuracy"] for r in rows[0]] != [r["pseudo_label_accuracy"] for r in rows[1]]

    for name_pt in sorted(p.relative_to(drawn / "prompts") for p in (drawn / "prompts").rglob("*.pt")):  # chosen/ too
        a, b = (tensors_of(torch.load(run / "prompts" / name_pt, weights_only=True)) for run in (drawn, scrambled))
        assert a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)
    for round_dir in sorted((drawn / "checkpoints").iterdir()):
        for file in sorted(round_dir.glob("*.pt")):
            other = scrambled / "checkpoints" / round_dir.name
            a, b = (tensors_of(torch.load(d / file.name, weights_only=False)) for d in (round_dir, other))
            differing = [k for k in a if not torch.equal(a[k], b[k])]
            assert a.keys() == b.keys() and differing in ([], ["refresh.label_hits"]), (file, differing)


def test_the_rank_holds_no_train_label(tmp_path):
    """The structural half: after the split, the train split a rank trains from carries no labels, and what the
    rank predicts on its train images comes with none (-1); the true labels stay with the monitoring."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run
    from fedur.train.host import UNLABELLED

    cfg = parse_config([*SHARED, "--federation.rounds", "1", "--run.output_dir", str(tmp_path / "run")])
    result = run(cfg)
    assert result.host.dataset.train.labels is None and result.host.dataset.test.labels is not None
    _, labels = result.host.predict("train")[0]
    assert len(labels) == len(result.clients[0].train_indices) > 0 and (labels == UNLABELLED).all()
    assert json.loads((tmp_path / "run" / "partition.json").read_text())["train"] is not None  # monitoring had them
