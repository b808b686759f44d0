import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

# Tests never touch the network: open_clip's hub lookups fail at once instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Decoded-image caches of test runs go to a throwaway folder, not ~/.cache/fedur, removed at the end.
if "FEDUR_CACHE_DIR" not in os.environ:
    os.environ["FEDUR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedur-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FEDUR_CACHE_DIR"], ignore_errors=True)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ok_on_a_free_port(cmd: Callable[[int], list[str]], timeout: int = 300, tries: int = 3) -> subprocess.CompletedProcess:
    """run_ok of `cmd(port)`, a launch that binds a free port: another process may take the port between free_port()
    and the bind (the kernel hands out the same ephemeral ports to the gloo connections of the runs beside it), so a
    launch that fails with EADDRINUSE before any run started is tried again on another port."""
    for _ in range(tries - 1):
        result = subprocess.run(cmd(free_port()), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if result.returncode == 0 or "EADDRINUSE" not in result.stdout + result.stderr:
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            return result
    return run_ok(cmd(free_port()), timeout=timeout)


def run_ok(cmd: list[str], timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command in the repository, offline, and require that it succeeds (its output tail if not)."""
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                            env={**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def read_rounds(run_dir: Path) -> list[dict]:
    """metrics.jsonl, one dict per round."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def flat_tensors(obj, prefix: str = "") -> dict[str, torch.Tensor]:
    """{dotted name: tensor} of a nested payload, its numbers as tensors too (a chosen model's round and estimate)."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in flat_tensors(value, f"{prefix}{key}.").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in flat_tensors(value, f"{prefix}{i}.").items()}
    return {} if obj is None or isinstance(obj, str) else {prefix.rstrip("."): torch.as_tensor(obj)}


def assert_same_results(a: Path, b: Path, num_clients: int) -> None:
    """Two runs computed the same thing: every metric but timing, the summaries' accuracies, and every prompt
    file, bitwise."""
    strip = lambda row: {k: v for k, v in row.items() if k not in ("round_seconds", "phase_seconds")}  # noqa: E731
    assert [strip(r) for r in read_rounds(a)] == [strip(r) for r in read_rounds(b)]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (a, b)]
    for key in ("final_client_accuracy", "best_mean_accuracy", "zero_shot_client_accuracy", "zero_shot_global",
                "final_global_accuracy", "final_weighted_accuracy", "new_client_adapted_client_accuracy",
                "zero_shot_estimated_accuracy", "zero_shot_ece", "label_free_choice", "estimator_errors"):
        assert summaries[0].get(key) == summaries[1].get(key), key
    assert (a / "prompts" / "global.pt").exists() == (b / "prompts" / "global.pt").exists()  # none without shared pieces
    shared = ["global.pt"] if (a / "prompts" / "global.pt").exists() else []
    chosen = [f"chosen/client_{k:03d}.pt" for k in range(num_clients)] if (a / "prompts" / "chosen").is_dir() else []
    assert (a / "prompts" / "chosen").is_dir() == (b / "prompts" / "chosen").is_dir()  # the label-free choice's models
    for name in shared + chosen + [f"client_{k:03d}.pt" for k in range(num_clients)]:
        x = flat_tensors(torch.load(a / "prompts" / name, weights_only=True))
        y = flat_tensors(torch.load(b / "prompts" / name, weights_only=True))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


def tensorboard_events(log_dir: Path) -> dict[str, dict[str, list[int]]]:
    """kind (scalars, images, text, hparams) -> tag -> steps, from every event file under log_dir (Lightning
    writes hparams into the run's file, SummaryWriter.add_hparams into a subfolder: read them all)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                found[value.metadata.plugin_data.plugin_name or value.WhichOneof("value")][value.tag].append(event.step)
    return found


def scalar_curve(log_dir: Path, tag: str, digits: int | None = None) -> list[tuple[int, float]]:
    """(step, value) as TensorBoard shows them: EventAccumulator applies purge_step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir)).Reload().Scalars(tag)
    return [(e.step, e.value if digits is None else round(e.value, digits)) for e in events]


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> Path:
    """Every case of tests/shared_runs.py (each of fedur's methods, and one mechanism each) on 1 rank, run once for
    the session: what several test files compare their own runs with. Under pytest-xdist the workers share them,
    in shards: a worker that asks runs every shard no other worker has taken, then waits for the rest."""
    from filelock import FileLock, Timeout

    from .shared_runs import every_case, run_all

    session = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for every worker of a run
    if session is None:
        root = tmp_path_factory.mktemp("shared")
        run_all(every_case(), root)
        return root
    root = tmp_path_factory.getbasetemp().parent / f"shared-{session}"
    cases = list(every_case().items())
    shards = [dict(cases[i::SHARDS]) for i in range(SHARDS)]
    locks = [FileLock(f"{root}.{i}.lock") for i in range(SHARDS)]
    for i, (lock, shard) in enumerate(zip(locks, shards)):
        try:
            lock.acquire(timeout=0)  # taken: another worker runs it
        except Timeout:
            continue
        try:
            if not (root / f"finished-{i}").is_file():
                run_all(shard, root)
                (root / f"finished-{i}").touch()
        finally:
            lock.release()
    for i, lock in enumerate(locks):
        with lock:  # its runner is done (or died: then the assertion says so)
            assert (root / f"finished-{i}").is_file(), f"the shared runs' shard {i} did not finish (another worker failed)"
    return root


SHARDS = 2  # the shared runs in as many processes as CI's workers (a third shard would pay another start-up)


def pytest_collection_modifyitems(items):
    """The files that hold whole runs (a slow test) first, each in its order: under pytest-xdist (below) the longest
    work starts first and the quick files fill the workers' ends. A test that uses the shared runs is slow."""
    unmarked = [item.nodeid for item in items
                if "tiny_runs" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("slow")]
    if unmarked:  # the shared runs take half a minute: a fast-lane test that asks for them doubles the fast lane
        raise pytest.UsageError(f"mark these tests slow (they use the shared runs, tiny_runs): {', '.join(unmarked)}")
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the collection's order within each part


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist (the dev extras) not installed: one process
    pass
else:
    def pytest_xdist_make_scheduler(config, log):
        """`pytest -n N`: each test file to one worker, so that the runs a file's tests share (its module-scoped
        fixtures) are computed once, in the order above (not xdist's reordering by the number of tests)."""
        config.option.loadscopereorder = False
        return LoadFileScheduling(config, log)


class MainResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_main(capsys, monkeypatch):
    """The entry point in-process: `fedur/main.py ARGS` -> (exit code, stdout, stderr)."""
    from fedur.app.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def call(*args):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
        out = capsys.readouterr()
        return MainResult(code, out.out, out.err)

    return call
