"""The fields of a round (metrics.jsonl's row), each declared once in fedur/train/round_fields.py: what the recorder,
TensorBoard, the round line and fedur-report make of them."""

import json

from .recorded_outputs import RECORDED, record


def test_the_recorder_and_the_report_write_what_was_recorded(tmp_path):
    """Every output of hand-written rounds that hold every field (tests/train/recorded_outputs.py), as recorded."""
    got, want = record(tmp_path), json.loads(RECORDED.read_text())
    assert got.keys() == want.keys()
    for name in want:
        if isinstance(want[name], dict):
            for part in want[name]:
                assert got[name][part] == want[name][part], f"{name}: {part} (python -m tests.train.recorded_outputs records it)"
        else:
            assert got[name] == want[name], name
