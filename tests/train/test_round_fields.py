"""The fields of a round (metrics.jsonl's row), each declared once in fedur/train/round_fields.py: what the recorder,
TensorBoard, the round line and fedur-report make of them."""

import json
import re
from pathlib import Path

import pytest
import torch

from fedur.app import report
from fedur.train.recorder import Recorder
from fedur.train.round_fields import FIELD, FIELDS, OTHER_TAGS, Scalars, round_line, scalars
from fedur.train.round_metrics import RoundOutcome, round_record
from fedur.train.run_dir import RunDir

from ..conftest import tensorboard_events
from .recorded_outputs import RECORDED, bare_rows, full_rows, old_rows, record, step_rows


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("recorded")
    return record(folder), folder


def test_the_recorder_and_the_report_write_what_was_recorded(recorded):
    """Every output of hand-written rounds that hold every field (tests/train/recorded_outputs.py), as recorded."""
    got, want = recorded[0], json.loads(RECORDED.read_text())
    assert got.keys() == want.keys()
    for name in want:
        if isinstance(want[name], dict):
            for part in want[name]:
                assert got[name][part] == want[name][part], f"{name}: {part} (python -m tests.train.recorded_outputs records it)"
        else:
            assert got[name] == want[name], name


def pattern(tag: str) -> re.Pattern:
    """A declared tag as a regular expression: XXX a client id, CCC a class index, NAME a name."""
    return re.compile(re.escape(tag).replace("XXX", r"\d{3}").replace("CCC", r"\d{3}").replace("NAME", r"\w+") + "$")


DECLARED = [s.tag for f in FIELDS for s in f.tensorboard] + [f.image for f in FIELDS if f.image] + list(OTHER_TAGS)
WRITTEN_BY_TENSORBOARD = {"config/text_summary": "config", "_hparams_/experiment": None,  # TensorBoard's own names for
                          "_hparams_/session_start_info": None, "_hparams_/session_end_info": None}  # text and hparams


def test_every_tag_the_recorder_writes_is_declared_and_every_declared_tag_is_written(recorded):
    """Over the hand-written rounds with every field: TensorBoard holds only declared tags, each declared one at least
    once, and one field's tags are no other's."""
    assert len(DECLARED) == len(set(DECLARED))
    written = set()
    for name in ("full", "bare", "steps"):
        written |= {tag for kind in tensorboard_events(recorded[1] / name / "tensorboard").values() for tag in kind}
    matched = {tag: [d for d in DECLARED if pattern(d).match(tag)] for tag in written - set(WRITTEN_BY_TENSORBOARD)}
    assert not [tag for tag, found in matched.items() if not found], "tags the recorder writes that no Field declares"
    for row in full_rows() + bare_rows() + step_rows():  # no two fields write one tag
        tags = [tag for f in FIELDS for tag in f.scalars(row)]
        assert len(tags) == len(set(tags))
    used = {d for found in matched.values() for d in found} | {"config"}
    assert set(DECLARED) - used == set(), "declared tags the hand-written rounds never wrote: add them to recorded_outputs.py"


SEEN: set[str] = set()


class Reads(dict):
    """A row that notes every key read from it (in SEEN)."""

    def __getitem__(self, key):
        SEEN.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        SEEN.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        SEEN.add(key)
        return super().__contains__(key)


def test_the_recorder_and_fedur_report_read_only_declared_keys(tmp_path):
    """Every key of a row the recorder (scalars, round line, summary) and fedur-report (its tables and curves) read is
    a declared field: a key read by its literal name elsewhere would be a second declaration of it."""
    SEEN.clear()
    for name, rows in (("full", full_rows()), ("bare", bare_rows()), ("steps", step_rows())):
        (tmp_path / name).mkdir()
        recorder = Recorder(RunDir(tmp_path / name), enabled=True, figures=False)
        recorder.record_zero_shot(torch.tensor([[1, 4]] * len(rows[0]["client_accuracy"])))
        for row in rows:
            recorder.record_round(Reads(row))
        recorder.finish({}, {})
    runs = [report.Run(tmp_path / name, name, [Reads(r) for r in rows], {}, {"system": {}}, {})
            for name, rows in (("full", full_rows()), ("bare", bare_rows()), ("old", old_rows()), ("steps", step_rows()))]
    report.markdown(runs, [])
    for run in runs:
        report.protocol_series(run)
    report.virtual_time_series(runs)
    assert len(SEEN) > 20 and SEEN <= set(FIELD), sorted(SEEN - set(FIELD))


def test_a_field_is_declared_once_with_what_it_is():
    assert len(FIELD) == len(FIELDS)
    assert all(f.doc and f.key == f.key.strip() for f in FIELDS)


def test_how_a_value_becomes_scalars():
    rounds = [{"bytes_sent": [1, 2]}, {"bytes_sent": [3, 4]}]
    assert Scalars("comm/bytes_cumulative", "so far").of([5, 6], [r["bytes_sent"] for r in rounds]) == {"comm/bytes_cumulative": 21}
    assert Scalars("a/b", "sum").of([1, None]) == {"a/b": None} and Scalars("a/b", "sum").of([1, 2]) == {"a/b": 3}
    assert Scalars("a/b", "mean").of([1.0, None, 3.0]) == {"a/b": 2.0} and Scalars("a/b", "mean").of(None) == {"a/b": None}
    assert Scalars("a/c_XXX", "per client").of([0.5, None]) == {"a/c_000": 0.5, "a/c_001": None}
    assert Scalars("w/c_CCC", "per class").of(None) == {}
    assert Scalars("d/NAME", "per name").of({"text": {"x": 1.0}, "domain:photo": 2.0}) == {"d/text_x": 1.0, "d/domain_photo": 2.0}
    assert Scalars("clients/late", "count").of([3, 1]) == {"clients/late": 2}
    assert scalars({"mean_accuracy": 50.0, "client_accuracy": [40.0, 60.0]}) == {
        "accuracy/mean": 50.0, "accuracy/client_000": 40.0, "accuracy/client_001": 60.0}


def test_the_round_line_is_its_fields_pieces_in_order():
    row = full_rows()[1]
    assert round_line(row) == ["acc 65.00%", "global 47.50%", "new clients 32.00%", "novel 22.00%", "domain:photo 31.00%",
                               "est 40.83% (mano)", "ece 12.25", "pseudo-label acc 63.75%", "selected 14", "loss 0.8750",
                               "lr 0.0250", "taken 1/2 (global kept)",
                               "eps 3.00", "14.5s"]
    assert round_line(row, test_labels=False)[:3] == ["est 40.83% (mano)", "pseudo-label acc 63.75%", "selected 14"]  # no
    # accuracy (nor calibration) without labels; the estimate needs none


def outcome(refreshed: bool) -> RoundOutcome:
    """A round of 2 clients and 3 classes, with a refresh or without."""
    from fedur.train.refresh import Refresh

    counts = torch.tensor([[2, 1, 0], [0, 1, 3]])
    refresh = Refresh(estimated=counts, quotas=counts, selected=counts, label_hits=torch.tensor([[2, 3], [3, 4]]),
                      class_weights=torch.tensor([1.0, 0.5, 2.0]))
    return RoundOutcome(round_idx=0, rounds=2, refreshed=refreshed, refresh=refresh, joined=torch.ones(2, dtype=torch.bool),
                        weights=torch.ones(2), accuracy=torch.tensor([[3, 4], [1, 4]]), losses=torch.ones(2, 4),
                        uploads=torch.tensor([10, 10]), seconds=1.0, phase_seconds={"train": 1.0})


@pytest.mark.parametrize("refreshed", [True, False], ids=["refresh", "no refresh"])
def test_round_record_writes_declared_keys_and_every_unconditional_one(refreshed):
    row = round_record(outcome(refreshed))
    assert set(row) <= set(FIELD)
    always = {f.key for f in FIELDS if not f.when}
    assert always <= set(row), sorted(always - set(row))


@pytest.mark.slow
def test_every_declared_field_is_in_a_real_run(tiny_runs):
    """Over every shared run (each method, privacy, clients that drop and lag, attackers, held-out sets): every line
    holds every unconditional field and only declared ones, and every declared field is in some line."""
    seen = set()
    always = {f.key for f in FIELDS if not f.when}
    for metrics in tiny_runs.glob("*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            assert always <= set(row) <= set(FIELD), (metrics.parent.name, sorted(set(row) ^ always))
            seen |= set(row)
    assert seen == set(FIELD), sorted(set(FIELD) - seen)
