import os
import tempfile
from pathlib import Path

import pytest
import torch

# Tests never touch the network: open_clip's hub lookups fail at once instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Decoded-image caches of test runs go to a throwaway folder, not ~/.cache/fedur.
os.environ.setdefault("FEDUR_CACHE_DIR", tempfile.mkdtemp(prefix="fedur-test-cache-"))
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_ENV = "FEDUR_SHARED_DIR"


@pytest.fixture(scope="session")
def tiny_clip():
    """The package's random-init tiny CLIP, seeded."""
    from fedur.model.clip import load_clip

    torch.manual_seed(0)
    return load_clip("fedur-tiny", None)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (tiny-clip, CIFAR-10 JPEGs): set FEDUR_SHARED_DIR to run the tests that need it."""
    value = os.environ.get(SHARED_ENV)
    if not value:
        pytest.skip(f"{SHARED_ENV} is not set")
    path = Path(value)
    if not (path / "assets" / "tiny-clip").is_dir():
        pytest.skip(f"{SHARED_ENV}={value} has no assets/tiny-clip")
    return path
