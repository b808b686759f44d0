"""FedUR learns: on the demo CLIP (configs/smoke.yaml), whose zero-shot text side is wrong in a structured
way, the final mean client accuracy ends clearly above zero-shot, under `fabric run` on 2 ranks and
identically on 1 rank; FedCoPL (no class weights, no negatives) learns too, and so does GDA-U (training-free,
a Gaussian discriminant fitted by federated EM on the demo's well-separated image features).

The margins come from `benchmarks/demo_learning.py` (benchmarks/results/demo_learning.md): each is at
most half the smallest gain measured over seeds 1-5, and FedUR's at least 5 points.
"""

import json
import sys
from pathlib import Path

import pytest

from .conftest import assert_same_results, free_port, read_rounds, run_ok

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

FEDUR_MARGIN = 5.0  # smallest FedUR gain over seeds 1-5: 10.41 points
FEDCOPL_MARGIN = 4.0  # smallest FedCoPL gain over seeds 1-5: 8.93 points
GDAU_MARGIN = 15.0  # smallest GDA-U gain over seeds 1-5: 33.79 points
FEDCOPL = ["--method", "FedCoPL"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The README's two smoke commands, and FedCoPL on 1 rank."""
    root = tmp_path_factory.mktemp("demo")
    fabric = str(Path(sys.executable).parent / "fabric")
    smoke = ["fedur/main.py", "--config", "configs/smoke.yaml", "--run.progress", "false"]
    run_ok([fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()),
            *smoke, "--run.output_dir", str(root / "two")])
    run_ok([sys.executable, *smoke, "--run.output_dir", str(root / "one")])
    run_ok([sys.executable, *smoke, *FEDCOPL, "--run.output_dir", str(root / "fedcopl")])
    run_ok([sys.executable, *smoke, "--method", "GDAU", "--run.output_dir", str(root / "gdau")])
    return {name: root / name for name in ("two", "one", "fedcopl", "gdau")}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_fedur_beats_zero_shot_on_two_ranks(runs):
    s = summary(runs["two"])
    assert s["world_size"] == 2
    assert s["final_mean_accuracy"] >= s["zero_shot_client_mean"] + FEDUR_MARGIN, s
    accuracy = [r["mean_accuracy"] for r in read_rounds(runs["two"])]
    assert accuracy[-1] > accuracy[0], f"rounds improve: {accuracy}"


def test_one_rank_is_identical(runs):
    assert_same_results(runs["two"], runs["one"], num_clients=4)


def test_fedcopl_learns_too(runs):
    s = summary(runs["fedcopl"])
    assert s["settings"]["method"]["class_path"].endswith(".FedCoPL") and s["method"] == "fedcopl" and s["labeller"] == "copl"
    assert s["final_mean_accuracy"] >= s["zero_shot_client_mean"] + FEDCOPL_MARGIN, s


def test_gdau_learns_without_training(runs):
    s = summary(runs["gdau"])
    assert (s["method"], s["labeller"]) == ("gdau", None)
    assert s["final_mean_accuracy"] >= s["zero_shot_client_mean"] + GDAU_MARGIN, s
    rows = read_rounds(runs["gdau"])
    assert all(r["lr"] is None and r["selected_per_class"] is None for r in rows)  # nothing trained, no pseudo-labels
    # each client uploads its sufficient statistics in float64: counts (C), sums (C x D), second moment (D x D), n
    from fedur.model.clip import load_clip

    classes, dim = 10, load_clip("fedur-demo", None).model.text_projection.shape[1]
    assert rows[0]["bytes_sent"] == [8 * (classes + classes * dim + dim * dim + 1)] * 4
