"""Real federated data end to end: clients' own folders (the generated shapes written as files) with labelled
test images per client and with no label at all, on 1 and 2 ranks and resumed after a killed rank; and a
split written by one run (partition.json, or a CSV made from it) read by another on 2 ranks, bitwise the same."""

import csv
import json
import sys
from pathlib import Path

import pytest

from fedur import plugins

from .conftest import free_port, run_ok, tensorboard_events
from .own_data import write_client_folders
from .test_resume import SMOKE, final_state, launch, metrics, timed_output

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

LAYOUTS = ("own", "unlabelled")  # labelled test images per client; no label anywhere
QUIET = ["--run.progress", "false"]
CLASSES = {cls.__name__: cls for cls in plugins.builtin("method")}
METHODS = [name for name in CLASSES if name != "FedUR"]  # every other: FedUR's the default


def own_args(data: Path, layout: str) -> list[str]:
    return ["--dataset", "ClientFolders", "--dataset.root", str(data / layout), "--data.classnames_file",
            str(data / layout / "classnames.txt"), "--federation.partition", "clients"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own-data")
    for layout in LAYOUTS:
        write_client_folders(root / layout, clients=3, classes=4, train_per_client=40, test_per_client=12, test=layout)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data) -> tuple[Path, dict]:
    """{name: stdout}: own-1, unlabelled-1, drawn-1 (the tiny synthetic run, Dirichlet) on 1 rank; "killed": (exit
    status, output) of the unlabelled run killed on 2 ranks in its second round; then on 2 ranks in one `fabric run`
    that run resumed (its first run, "killed" stays its directory), own-2, unlabelled-2, replay-2 (own's split read
    back from own-1's partition.json) and csv-2 (drawn-1's split as CSV)."""
    root = tmp_path_factory.mktemp("own-runs")
    one = {f"{layout}-1": [*SMOKE, *QUIET, *own_args(data, layout)] for layout in LAYOUTS}
    one["drawn-1"] = [*SMOKE, *QUIET]
    for method in METHODS:  # every other method on unlabelled own folders, 2 rounds
        one[f"{method}-unlabelled-1"] = [*SMOKE, *QUIET, *own_args(data, "unlabelled"), "--method", method,
                                         "--federation.rounds", "2"]
    out = {"one": run_ok([sys.executable, "tests/run_many.py", *runs_argv(one, root)], timeout=600).stdout}
    write_csv(root / "drawn-1" / "partition.json", root / "split.csv")
    killed = launch([*QUIET, *own_args(data, "unlabelled"), "--run.output_dir", str(root / "killed")], fabric_ranks=2,
                    fault="kill:train:2:1")
    output, _ = timed_output(killed)
    out["killed"] = (killed.returncode, output)
    two = {"killed": [*SMOKE, *QUIET, *own_args(data, "unlabelled"), "--run.resume", "true"]}  # resumed, as launched
    two.update({f"{layout}-2": [*SMOKE, *QUIET, *own_args(data, layout)] for layout in LAYOUTS})
    two["replay-2"] = [*SMOKE, *QUIET, *own_args(data, "own")[:-2], "--federation.partition", "file",
                       "--federation.partition_file", str(root / "own-1" / "partition.json")]
    two["csv-2"] = [*SMOKE, *QUIET, "--federation.partition", "file", "--federation.partition_file", str(root / "split.csv")]
    fabric = str(Path(sys.executable).parent / "fabric")
    out["two"] = run_ok([fabric, "run", "--accelerator", "cpu", "--devices", "2", "--main-port", str(free_port()),
                         "tests/run_many.py", *runs_argv(two, root)], timeout=600).stdout
    return root, out


def runs_argv(argv: dict[str, list[str]], root: Path) -> list[str]:
    return [json.dumps([*args, "--run.output_dir", str(root / name)]) for name, args in argv.items()]


def write_csv(partition: Path, target: Path) -> None:
    """A run's split as the CSV form: client, image, split."""
    split = json.loads(partition.read_text())
    with open(target, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["client", "image", "split"])
        for name in ("train", "test"):
            for k, ids in enumerate(split[f"{name}_ids"]):
                writer.writerows([k, image, name] for image in ids)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def predictions(run: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run / "predictions").glob("*.csv"))}


def assert_same(a: Path, b: Path) -> None:
    """The same rounds (timings aside), final prompts and last checkpoint (every tensor bitwise), accuracies
    and predictions per image."""
    assert metrics(a) == metrics(b)
    got, want = final_state(a), final_state(b)
    assert got.keys() == want.keys() and [k for k in want if not got[k].equal(want[k])] == []
    for key in ("final_client_accuracy", "zero_shot_client_accuracy", "zero_shot_global"):
        assert summary(a)[key] == summary(b)[key], key
    assert predictions(a) == predictions(b)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_own_folders_on_two_ranks_equal_one(runs, layout):
    root, _ = runs
    assert summary(root / f"{layout}-2")["world_size"] == 2 and summary(root / f"{layout}-2")["num_clients"] == 3
    assert_same(root / f"{layout}-1", root / f"{layout}-2")


def test_own_folders_with_test_labels_report_accuracy_but_no_pseudo_label_accuracy(runs):
    root, out = runs
    run = root / "own-1"
    s = summary(run)
    assert s["train_labels"] is False and s["test_labels"] is True and s["settings"]["federation"]["num_clients"] == 3
    assert all(isinstance(a, float) for a in s["final_client_accuracy"]) and (run / "confusion.json").is_file()
    assert all(r["pseudo_label_accuracy"] == [None] * 3 for r in metrics(run))
    split = json.loads((run / "partition.json").read_text())
    assert split["client_names"] == ["site_00", "site_01", "site_02"] and split["train"] is None
    assert split["train_ids"][1][0] == "clients/site_01/train/img_0000.png" and len(split["train_ids"][1]) == 40
    assert sum(map(sum, split["test"])) == 36  # the test images' classes, from their class folders
    runs_out = out["one"].split("fedur: clientfolders")[1:]  # each run's output on its own folders, in order
    assert len(runs_out) == 2 + len(METHODS)
    assert all(text.count("no train labels: pseudo-label accuracy is not reported") == 1 for text in runs_out)  # once
    assert "no test labels" not in runs_out[0]
    assert "num_clients: 3" in (run / "config.yaml").read_text()


def test_without_any_label_what_needs_labels_is_absent_and_the_rest_reported(runs):
    root, out = runs
    run = root / "unlabelled-1"
    s = summary(run)
    assert s["test_labels"] is False and s["final_client_accuracy"] == [None] * 3
    assert s["final_mean_accuracy"] is None and s["zero_shot_global"] is None and not (run / "confusion.json").exists()
    rows = metrics(run)
    assert all(r["client_accuracy"] == [None] * 3 and r["mean_accuracy"] is None for r in rows)
    assert all(sum(r["selected"]) > 0 for r in rows) and rows[2]["selection"] is not None  # refreshed at round 2
    agreement = rows[2]["pseudo_label_agreement"]  # vs the refresh at round 0 (None: no image selected both times)
    assert rows[0]["pseudo_label_agreement"] == [None] * 3 and any(a is not None for a in agreement)
    assert all(a is None or 0 <= a <= 100 for a in agreement)
    segment = out["one"].split("fedur: clientfolders")[2].split("fedur: synthetic")[0]  # this run's lines
    assert segment.count("no test labels: test accuracy (per client and mean)") == 1
    round_lines = [line for line in segment.splitlines() if line.startswith("round")]
    assert len(round_lines) == 3 and all("selected" in line and "acc" not in line for line in round_lines)
    assert "client  selected" in segment and "final mean accuracy" not in segment  # the table without accuracy
    tags = set(tensorboard_events(run / "tensorboard")["scalars"])
    assert "pseudo_labels/selected_total" in tags and "pseudo_labels/agreement_mean" in tags
    assert not any(t.startswith("accuracy/") or t.startswith("pseudo_labels/accuracy") for t in tags)
    files = predictions(run)
    assert list(files) == ["client_000.csv", "client_001.csv", "client_002.csv"]
    lines = list(csv.reader(files["client_001.csv"].splitlines()))
    assert lines[0] == ["split", "image", "predicted", "class", "confidence"] and len(lines) == 1 + 40 + 12
    assert {line[0] for line in lines[1:]} == {"train", "test"}
    assert all(line[1].startswith(f"clients/site_01/{line[0]}/") and line[3] in ("circle", "square", "triangle", "star")
               for line in lines[1:])


def test_a_split_read_back_on_two_ranks_equals_the_run_that_wrote_it(runs):
    root, _ = runs
    assert summary(root / "replay-2")["settings"]["federation"]["partition"] == "file"
    assert_same(root / "own-1", root / "replay-2")  # paths, from partition.json
    for name in ("train_ids", "test_ids"):
        assert json.loads((root / "csv-2" / "partition.json").read_text())[name] == \
            json.loads((root / "drawn-1" / "partition.json").read_text())[name]
    assert metrics(root / "drawn-1") == metrics(root / "csv-2")  # indices, from a CSV
    got, want = final_state(root / "csv-2"), final_state(root / "drawn-1")
    assert [k for k in want if not got[k].equal(want[k])] == []


def test_unlabelled_own_folders_killed_on_two_ranks_then_resumed_equal_the_uninterrupted_run(runs):
    root, out = runs
    code, killed = out["killed"]
    assert code != 0 and "injected fault: kill at train of round 2 on rank 1" in killed, killed[-2000:]
    header = "fedur: clientfolders"  # each run's first line: the resumed run's lines end where own-2's begin
    resumed = out["two"][:out["two"].index(header, out["two"].index(header) + 1)]
    assert "resumed from" in resumed, resumed[-3000:]  # and it exited 0 with the runs after it (run_ok)
    assert_same(root / "killed", root / "unlabelled-1")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_on_unlabelled_own_folders(runs, method):
    root, _ = runs
    run = root / f"{method}-unlabelled-1"
    s = summary(run)
    assert s["method"] == method.lower() and s["final_client_accuracy"] == [None] * 3
    assert s["rounds_completed"] == (2 if CLASSES[method]().rounds(1) else 0)  # zero-shot CLIP has none
    files = predictions(run)
    assert sorted(files) == ["client_000.csv", "client_001.csv", "client_002.csv"]
    assert all(len(text.splitlines()) == 1 + 40 + 12 for text in files.values())


def test_a_run_that_skipped_unreadable_images_replays_from_its_partition_json(tmp_path):
    names = write_client_folders(tmp_path / "data", clients=3, classes=4, train_per_client=40, test_per_client=12)
    (tmp_path / "data" / "clients" / "site_01" / "train" / "img_0045.png").write_bytes(b"not an image")
    (tmp_path / "data" / "clients" / "site_02" / "test" / "circle").mkdir(exist_ok=True)
    (tmp_path / "data" / "clients" / "site_02" / "test" / "circle" / "broken.png").write_bytes(b"not an image")
    base = [*SMOKE, *QUIET, "--dataset", "ClientFolders", "--dataset.root", str(tmp_path / "data"),
            "--data.classnames_file", str(names), "--data.corrupt_images", "skip"]
    # one process: the replay starts after the run whose partition.json it reads has finished
    both = {"drawn": [*base, "--federation.partition", "clients"],
            "replay": [*base, "--federation.partition", "file", "--federation.partition_file",
                       str(tmp_path / "drawn" / "partition.json")]}
    out = run_ok([sys.executable, "tests/run_many.py", *runs_argv(both, tmp_path)], timeout=300).stdout
    said = out[:out.index("fedur: clientfolders", out.index("fedur: clientfolders") + 1)]  # up to the replay's first line
    assert said.count("2 unreadable image(s) left out (data.corrupt_images skip), e.g. ") == 1  # said once, and where
    assert f"skipped_ids in {tmp_path / 'drawn' / 'partition.json'}" in said
    written = json.loads((tmp_path / "drawn" / "partition.json").read_text())
    assert written["skipped_ids"] == {"train": ["clients/site_01/train/img_0045.png"],
                                      "test": ["clients/site_02/test/circle/broken.png"]}
    assert_same(tmp_path / "drawn", tmp_path / "replay")
