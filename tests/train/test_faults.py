"""The test-only fault injection (fedur/train/faults.py): parsed from FEDUR_FAULT, and under torchrun striking the
first attempt only, so that the workers torchrun restarts run on as after a real failure."""

import pytest

from fedur.errors import ConfigError
from fedur.train import faults


def test_a_fault_strikes_the_first_attempt_only(monkeypatch):
    monkeypatch.setenv(faults.ENV, "kill:train:2:1")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert faults.injected() == faults.Fault("kill", "train", 2, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert faults.injected() == faults.Fault("kill", "train", 2, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a worker torchrun restarted
    assert faults.injected() is None
    faults.point("train", 1, 1)  # round 2 on rank 1: nothing happens on a restarted worker


def test_a_malformed_fault_is_a_config_error(monkeypatch):
    monkeypatch.setenv(faults.ENV, "kill:train:two:1")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(ConfigError, match="expected <action>:<point>:<round>:<rank>"):
        faults.injected()
