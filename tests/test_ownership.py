"""Who owns a run directory, and what the machine's failures leave of a run: real processes, real mounts.

- a live run holds its directory: a second run or a resume into it is refused naming the owner's pid, and a
  SIGKILLed run leaves no stale lock (the resume after it equals the uninterrupted run);
- every node must see the directory rank 0 claimed (two launchers on one machine stand in for two nodes);
- under `fabric run` a rank dies with its launcher, and a resume then equals the uninterrupted run;
- a full disk ends the run in one line, and after freeing space the resume equals the uninterrupted run;
- a run directory (or a folder of it) that cannot be written is refused before any compute, changing nothing.

Every run is a subprocess of `python fedur/main.py` or `fabric run`; the uninterrupted references run in the
background while the tests start. The mount tests need root (CAP_SYS_ADMIN) and are skipped without it.
"""

import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, assert_same_results, free_port

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

ROOT = REPO  # the checkout whose fedur/main.py the runs start (and whose package they import)
FABRIC = str(Path(sys.executable).parent / "fabric")
TIMEOUT = 180  # seconds any one run may take
# The mechanics config (no learning needed) and the demo (long enough rounds to be caught mid-run).
TINY = ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--run.progress", "false"]
SMOKE = ["--config", "configs/smoke.yaml", "--federation.rounds", "6", "--run.progress", "false"]
CLIENTS = 4  # both configs


def fedur(*args) -> list[str]:
    return [sys.executable, "fedur/main.py", *map(str, args)]


def fabric(*launcher, args) -> list[str]:
    return [FABRIC, "run", "--accelerator", "cpu", *map(str, launcher), "fedur/main.py", *map(str, args)]


class Process:
    """A background run in a session (process group) of its own, its stdout and stderr in files."""

    def __init__(self, cmd: list[str], log: Path, env: dict | None = None) -> None:
        self.out, self.err = log.with_suffix(".out"), log.with_suffix(".err")
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.popen = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=err, start_new_session=True,  # what `setsid` does
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env or {})},
            )
        self.pid = self.popen.pid

    def wait(self, timeout: float = TIMEOUT) -> int:
        return self.popen.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def tail(self) -> str:
        return f"exit {self.popen.poll()}\n--- stdout\n{self.stdout[-2000:]}\n--- stderr\n{self.stderr[-3000:]}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=30)


def pids_naming(text: str) -> list[int]:
    """The processes whose command line contains `text` (a run's directory)."""
    found = subprocess.run(["pgrep", "-f", re.escape(text)], capture_output=True, text=True, timeout=30)
    return [int(pid) for pid in found.stdout.split()]


class Processes:
    """Starts runs; kills every one it started, and any rank left naming `folder`, at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.started, self.count = folder, [], 0

    def start(self, cmd: list[str], env: dict | None = None) -> Process:
        self.count += 1
        process = Process(cmd, self.folder / f"process-{self.count}", env)
        self.started.append(process)
        return process

    def run(self, cmd: list[str], env: dict | None = None) -> Process:
        """A run to its end (TIMEOUT at most)."""
        process = self.start(cmd, env)
        process.wait()
        return process

    def close(self) -> None:
        for process in self.started:
            process.kill()
        for pid in pids_naming(str(self.folder)):  # ranks that outlived their launcher
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def procs(tmp_path):
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The uninterrupted 1-rank runs of TINY and SMOKE, started at once in the background: `references[name]`
    waits for one and returns its directory."""
    root = tmp_path_factory.mktemp("references")
    processes = Processes(root)
    started = {name: processes.start(fedur(*args, "--run.output_dir", root / name))
               for name, args in (("tiny", TINY), ("smoke", SMOKE))}

    class Done(dict):
        def __missing__(self, name):
            assert started[name].wait() == 0, started[name].tail()
            self[name] = root / name
            return self[name]

    try:
        yield Done()
    finally:
        processes.close()


def wait_for(path: Path, process: Process, timeout: float = 120) -> None:
    """Until `path` exists; fails if `process` ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.popen.poll() is None, f"the run ended before {path} appeared:\n{process.tail()}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s:\n{process.tail()}"
        time.sleep(0.02)


def wait_for_output(process: Process, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in process.stdout:
        assert process.popen.poll() is None, f"the run ended before printing {text!r}:\n{process.tail()}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{process.tail()}"
        time.sleep(0.02)


def error_line(process: Process) -> str:
    """The run's stderr, which must be one line."""
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{process.tail()}"
    return lines[0]


def snapshot(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every folder and file under `folder` (but the top-level names in `skip`): size, mtime, content hash."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder)
        if name.parts[0] in skip:
            continue
        stat = path.stat()
        found[str(name)] = ("folder",) if path.is_dir() else (stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def committed(run_dir: Path) -> list[str]:
    return sorted(p.parent.name for p in (run_dir / "checkpoints").glob("round_*/COMMITTED.json"))


def mount(*args) -> None:
    """`mount ARGS`, or skip the test: mounting needs root or CAP_SYS_ADMIN."""
    result = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"cannot mount (needs root or CAP_SYS_ADMIN): mount {' '.join(map(str, args))}: {result.stderr.strip()}")


def unmount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True, timeout=30).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)  # still busy: detach it


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` read-only for the block, through a read-only bind mount of itself."""
    mount("--bind", folder, folder)
    try:
        mount("-o", "remount,bind,ro", folder)
        yield
    finally:
        unmount(folder)


def test_a_live_run_owns_its_directory_and_a_killed_one_leaves_no_stale_lock(tmp_path, procs, references):
    run_dir = tmp_path / "run"
    # The first run commits round 1, then hangs in round 2's training: alive, holding its directory.
    first = procs.start(fedur(*TINY, "--run.output_dir", run_dir), env={"FEDUR_FAULT": "hang:train:2:0"})
    wait_for(run_dir / "checkpoints" / "round_00001" / "COMMITTED.json", first)
    wait_for_output(first, "injected fault: hang at train of round 2 on rank 0")
    before = snapshot(run_dir, skip=("tensorboard",))  # the writer thread may flush on its own clock

    second = procs.start(fedur(*TINY, "--run.output_dir", run_dir))
    resume = procs.start(fedur(*TINY, "--run.output_dir", run_dir, "--run.resume", "true"))
    owner = f"fedur: error: run.output_dir={run_dir} is in use by process {first.pid} on host {socket.gethostname()} (started "
    for process in (second, resume):
        assert process.wait() == 2, process.tail()
        assert error_line(process).startswith(owner), process.tail()
    assert snapshot(run_dir, skip=("tensorboard",)) == before  # the refused runs changed nothing
    assert first.popen.poll() is None

    first.kill()  # SIGKILL: no cleanup, the lock file stays behind, unheld
    assert (run_dir / "fedur.lock").exists() and committed(run_dir) == ["round_00001"]
    resumed = procs.run(fedur(*TINY, "--run.output_dir", run_dir, "--run.resume", "true"))
    assert resumed.popen.returncode == 0, resumed.tail()
    assert_same_results(run_dir, references["tiny"], CLIENTS)


def test_every_node_must_see_the_directory_rank_0_claimed(tmp_path, procs, references):
    """Two launchers on one machine play two nodes of one job (1 rank each)."""

    def nodes(*dirs: Path) -> list[Process]:
        port = free_port()
        return [procs.start(fabric("--devices", 1, "--num-nodes", 2, "--node-rank", rank, "--main-address", "127.0.0.1",
                                   "--main-port", port, args=[*TINY, "--run.output_dir", folder]))
                for rank, folder in enumerate(dirs)]

    a, b, shared = tmp_path / "A", tmp_path / "B", tmp_path / "shared"
    apart = nodes(a, b)  # each node's run.output_dir is a directory of its own
    together = nodes(shared, shared)  # meanwhile, one directory both nodes see
    codes = [node.wait() for node in apart]
    output = "\n".join(node.tail() for node in apart)
    assert all(code != 0 for code in codes), output
    errors = [line for node in apart for line in (node.stdout + node.stderr).splitlines() if "fedur: error:" in line]
    assert len(errors) == 1, output
    assert errors[0].startswith(f"fedur: error: run.output_dir={a} is not the same directory on every node: node 1 "
                                f"({socket.gethostname()}, ranks 1) cannot see what rank 0 wrote there; put "
                                "run.output_dir on storage every node shares"), output
    for folder in (a, b):  # nothing trained
        assert not list(folder.rglob("*.pt")) and not list(folder.rglob("metrics.jsonl")), sorted(folder.rglob("*"))

    for node in together:
        assert node.wait() == 0, node.tail()
    assert_same_results(shared, references["tiny"], CLIENTS)  # == 1 rank


def test_a_rank_dies_with_its_launcher(tmp_path, procs, references):
    run_dir = tmp_path / "launcher-killed"
    launcher = procs.start(fabric("--devices", 2, "--main-port", free_port(), args=[*SMOKE, "--run.output_dir", run_dir]))
    wait_for(run_dir / "checkpoints" / "round_00002" / "COMMITTED.json", launcher)
    os.killpg(launcher.pid, signal.SIGKILL)  # what a terminal or a job runner does to the launcher's group
    launcher.wait(30)
    deadline = time.monotonic() + 10
    while pids_naming(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = pids_naming(str(run_dir))
    assert not left, f"ranks outlived their launcher by 10 s: {left}; committed {committed(run_dir)}"
    assert not (run_dir / "checkpoints" / "round_00004").exists() and not (run_dir / "summary.json").exists()

    resumed = procs.run(fedur(*SMOKE, "--run.output_dir", run_dir, "--run.resume", "true"))
    assert resumed.popen.returncode == 0, resumed.tail()
    assert_same_results(run_dir, references["smoke"], CLIENTS)  # 2 ranks then 1 == 1 rank throughout


def fill(path: Path) -> None:
    """Zeros into `path` until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)


def test_a_full_disk_ends_the_run_in_one_line_and_the_resume_equals_the_uninterrupted_run(tmp_path, procs, references):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", disk)
    try:
        run_dir = disk / "run"
        process = procs.start(fedur(*SMOKE, "--run.output_dir", run_dir))
        wait_for(run_dir / "checkpoints" / "round_00002" / "COMMITTED.json", process)
        os.kill(process.pid, signal.SIGSTOP)
        fill(disk / "filler")
        os.kill(process.pid, signal.SIGCONT)
        assert process.wait() != 0, process.tail()
        assert "Traceback" not in process.stderr, process.tail()
        line = error_line(process)
        found = re.fullmatch(r"fedur: error: could not write (.+?) \(No space left on device\); the last committed round "
                             r"\((\d+)\) in (.+?) is intact: free space .*--run\.resume true", line)
        assert found, line
        assert found[1].startswith(str(run_dir)), line
        assert found[3] == str(run_dir / "checkpoints"), line
        assert f"round_{int(found[2]):05d}" == committed(run_dir)[-1], (line, committed(run_dir))  # counted from 1

        (disk / "filler").unlink()
        resumed = procs.run(fedur(*SMOKE, "--run.output_dir", run_dir, "--run.resume", "true"))
        assert resumed.popen.returncode == 0, resumed.tail()
        assert_same_results(run_dir, references["smoke"], CLIENTS)
    finally:
        procs.close()  # nothing may hold the mount
        unmount(disk)


def test_a_run_directory_that_cannot_be_written_is_refused_before_any_compute(tmp_path, procs, references):
    parent = tmp_path / "parent"  # a new run into a read-only folder
    parent.mkdir()
    finished = tmp_path / "finished"  # a finished run whose checkpoints/ is read-only, resumed for one more round
    shutil.copytree(references["tiny"], finished)
    before = snapshot(finished)
    with read_only(parent), read_only(finished / "checkpoints"):
        new = procs.start(fedur(*TINY, "--run.output_dir", parent / "run"))
        resume = procs.start(fedur(*TINY, "--federation.rounds", 3, "--run.output_dir", finished, "--run.resume", "true"))
        assert new.wait() == 2, new.tail()
        assert error_line(new).startswith(f"fedur: error: run.output_dir={parent / 'run'} cannot be written "
                                          "(Read-only file system)"), new.tail()
        assert resume.wait() == 2, resume.tail()
        assert error_line(resume).startswith(f"fedur: error: run.output_dir={finished} has folders or files fedur cannot "
                                             f"write: {finished / 'checkpoints'}"), resume.tail()
        for process in (new, resume):  # before any compute
            assert "zero-shot" not in process.stdout and "round" not in process.stdout, process.tail()
    assert list(parent.iterdir()) == []
    assert snapshot(finished) == before


def test_the_lock_ends_with_its_owner_not_with_the_processes_it_forked(tmp_path):
    """flock belongs to the open file, which forked children (loader workers) share: a SIGKILLed owner's workers
    kept the lock for seconds. A child forked from an owner closes its copy at once."""
    from fedur.train.ownership import claim

    run_dir = tmp_path / "run"
    script = (
        "import multiprocessing as mp, sys, time\n"
        "from fedur.train.ownership import claim\n"
        "def work(ready):\n"
        "    ready.set()\n"
        "    time.sleep(60)\n"
        f"held = claim({str(run_dir)!r}, create=True)\n"
        "context = mp.get_context('fork')\n"
        "ready = context.Event()\n"
        "child = context.Process(target=work, args=(ready,), daemon=False)\n"
        "child.start()\n"
        "ready.wait(60)  # the child runs, as a loader worker at work: the fork handler has run in it\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(owner.stdout.readline())
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        mine = claim(run_dir, create=False)  # at once: the forked child, still alive, holds no lock
        assert mine.fd is not None
        mine.release()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_directory_from_before_the_lock_with_a_stray_file_is_locked_too(tmp_path):
    """Run directories written before fedur.lock have none, and one stray file (a notebook's checkpoint folder, an
    NFS .nfsXXXX) must not leave a resume unlocked: the first claim locks, the second is refused; a refused claim
    leaves the directory as it was."""
    from fedur.train.ownership import claim
    from fedur.train.run_dir import RunDirError

    run_dir = tmp_path / "old-run"
    (run_dir / "checkpoints" / "round_00001").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    (run_dir / ".ipynb_checkpoints").mkdir()
    first = claim(run_dir, create=False)
    try:
        assert first.fd is not None
        with pytest.raises(RunDirError, match="is in use by process"):
            claim(run_dir, create=False)
    finally:
        first.release()  # not kept (as a refused resume): the lock file it made goes again
    assert sorted(p.name for p in run_dir.iterdir()) == [".ipynb_checkpoints", "checkpoints", "metrics.jsonl"]
