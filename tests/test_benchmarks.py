"""The benchmark scripts fail loudly: a benchmark whose part or run failed exits non-zero (a GPU script reported
success on a failed run before)."""

import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # starts a benchmark process


def test_a_round_cost_benchmark_with_a_failed_part_exits_non_zero_and_still_writes_its_report(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/round_cost.py", "--quick", "--models", "no-such-model", "--parts",
                           "text", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "part(s) or run(s) failed" in done.stderr and "Unknown open_clip model 'no-such-model'" in done.stderr
    assert any(tmp_path.glob("*.md"))  # the report is written all the same
