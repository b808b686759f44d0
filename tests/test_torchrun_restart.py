"""torchrun's restarts: `torchrun --max-restarts N fedur/main.py ... --run.resume auto` heals a job whose rank died.

A 2-process torchrun job on configs/tiny.yaml has one rank SIGKILLed, from outside and at a random moment of its
life (its imports, the launch, the run directory's claim, any round, the final files); torchrun restarts both
workers, they resume from the last committed round (or start over when none is committed), and the run ends as the
uninterrupted 2-process run: the same metrics lines (timings aside) and the same tensors in every prompt file and
in the last checkpoint. `FEDUR_TORCHRUN_KILL="<rank>:<seconds>"` repeats one case (the test prints the one it drew).

Before fedur made its process groups on keys of their own attempt (launch_env.attempt_process_group), a restarted
rank could read the killed attempt's addresses from torchrun's store and fail to connect (gloo: "Connection refused")
or hang; the fast tests here check where the keys go and when fedur refuses restarts.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fedur.errors import ConfigError
from fedur.launch_env import attempt_process_group
from fedur.train import checkpoint

from .conftest import REPO

LAUNCHER_VARIABLES = ("SLURM_", "LT_", "TORCHELASTIC_", "MASTER_", "PMI_", "OMPI_", "FEDUR_FAULT")
TIMING = {"round_seconds", "phase_seconds", "wall_seconds"}
RUN = ["--config", "configs/tiny.yaml", "--federation.rounds", "3", "--run.threads", "1", "--run.resume", "auto"]
KILL_ENV = "FEDUR_TORCHRUN_KILL"


def torchrun(run_dir: Path, log: Path, restarts: int, env: dict | None = None) -> subprocess.Popen:
    """`torchrun --standalone --nproc-per-node 2 --max-restarts N fedur/main.py ...` (--standalone: torchrun's own
    rendezvous on a free local port)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        environ.pop(name, None)
    environ.update({"PYTHONPATH": os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1",
                    **(env or {})})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(restarts), "fedur/main.py", *RUN, "--run.output_dir", str(run_dir)]
    return subprocess.Popen(command, cwd=REPO, env=environ, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # so that a failed test can end the job and its workers


def worker(agent: int, rank: int) -> int | None:
    """The pid of the first attempt's worker of `rank` that torchrun's process `agent` started (None: not yet)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            environ = dict(v.split("=", 1) for v in (entry / "environ").read_text().split("\0") if "=" in v)
        except (OSError, ValueError, IndexError):
            continue
        if environ.get("RANK") == str(rank) and environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            return int(entry.name)
    return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (not ended, not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def finish(job: subprocess.Popen, timeout: float) -> int:
    try:
        return job.wait(timeout=timeout)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def tensors_of(obj, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {name: t for key, value in items for name, t in tensors_of(value, f"{prefix}.{key}").items()}


def prompt_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the final prompt files and of the last committed checkpoint's files."""
    last = checkpoint.latest(run_dir)
    files = sorted((run_dir / "prompts").glob("*.pt")) + sorted(last.folder.glob("*.pt"))
    return {f"{path.relative_to(run_dir)}{name}": t for path in files
            for name, t in tensors_of(torch.load(path, weights_only=True, map_location="cpu")).items()}


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert metrics(run_dir) == metrics(reference)
    got, want = prompt_tensors(run_dir), prompt_tensors(reference)
    assert got.keys() == want.keys() and got
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, f"tensors differ from the uninterrupted run: {different[:5]}"


def agent_environment(port: int, **changes: str) -> dict[str, str]:
    """What torchrun's agent sets for rank 1 of 2 on one node in its third attempt (the store shared, its default)."""
    return {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **changes}


def test_under_torchruns_shared_store_every_key_of_the_process_group_is_the_attempts_own(monkeypatch):
    """The agent's store outlives every attempt: the group is made on fedur/attempt_<restart count>/..., which no
    earlier attempt wrote, and not on the names every attempt shares."""
    agent = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))  # the agent's store
    made = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: made.update(backend=backend, **kwargs))
    assert attempt_process_group(torch.device("cpu"), timedelta(seconds=5), agent_environment(agent.port))
    assert (made["backend"], made["rank"], made["world_size"], made["timeout"]) == ("gloo", 1, 2, timedelta(seconds=5))
    made["store"].set("default_pg/0", "127.0.0.1:4242")  # what a group publishes, through the store it was given
    assert agent.check(["fedur/attempt_2/default_pg/0"]) and not agent.check(["default_pg/0"])


def test_a_store_of_the_attempts_own_or_a_run_without_restarts_on_several_nodes_needs_nothing_and_else_is_refused(
        monkeypatch):
    made = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: made.append(backend))
    monkeypatch.setattr(dist, "TCPStore", lambda *args, **kwargs: dist.HashStore())
    cpu, timeout = torch.device("cpu"), timedelta(seconds=5)
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch makes a store per attempt, Fabric's launch makes the group
    assert not attempt_process_group(cpu, timeout, agent_environment(1, TORCHELASTIC_USE_AGENT_STORE="False"))
    two_nodes = agent_environment(1, WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    with pytest.raises(ConfigError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --rdzv-backend c10d"):
        attempt_process_group(cpu, timeout, two_nodes)  # each node's agent counts its own restarts
    assert made == []
    assert attempt_process_group(cpu, timeout, {**two_nodes, "TORCHELASTIC_MAX_RESTARTS": "0"})  # no second attempt
    assert made == ["gloo"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, float]:
    """The uninterrupted 2-process torchrun job, and its first worker's life in seconds."""
    folder = tmp_path_factory.mktemp("torchrun-reference")
    job = torchrun(folder / "run", folder / "log", restarts=0)
    started, pid = time.monotonic(), None
    while pid is None and job.poll() is None:
        pid = worker(job.pid, 0)
        time.sleep(0.01)
    while pid is not None and alive(pid):
        time.sleep(0.05)
    life = time.monotonic() - started
    assert finish(job, 300) == 0, (folder / "log").read_text()[-3000:]
    return folder / "run", life


@pytest.mark.slow  # whole fedur runs under torchrun: not in the fast lane
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")
def test_a_rank_killed_at_a_random_moment_is_restarted_and_the_run_ends_as_the_uninterrupted_one(reference, tmp_path):
    run_ref, life = reference
    drawn = os.environ.get(KILL_ENV) or f"{random.randrange(2)}:{random.uniform(0, 0.95 * life):.2f}"
    rank, delay = int(drawn.split(":")[0]), float(drawn.split(":")[1])
    case = f"{KILL_ENV}={drawn} (SIGKILL of rank {rank} {delay:.2f} s after it started; a worker lives {life:.1f} s)"
    print(case)
    log, began = tmp_path / "log", time.monotonic()
    job = torchrun(tmp_path / "run", log, restarts=1)
    pid = None
    while pid is None and job.poll() is None:
        pid = worker(job.pid, rank)
        time.sleep(0.005)
    assert pid is not None, f"{case}: no worker of rank {rank} seen\n{log.read_text()[-3000:]}"
    time.sleep(delay)
    struck = alive(pid)
    with contextlib.suppress(ProcessLookupError):  # it ended (and torchrun reaped it) in the meantime
        os.kill(pid, signal.SIGKILL)
    code = finish(job, 240)
    seconds = time.monotonic() - began
    print(f"killed {'while it ran' if struck else 'after it ended'}; the job exited {code} after {seconds:.1f} s")
    out = log.read_text()
    assert code == 0, f"{case}\n{out[-4000:]}"
    if struck:  # the first attempt failed, and torchrun restarted the job
        assert "failed (exitcode: " in out, f"{case}\n{out[-4000:]}"
    assert_same_run(tmp_path / "run", run_ref)
