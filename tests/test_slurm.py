"""The SLURM path: the entry point under the variables srun sets, and the sbatch scripts' layout."""

import json
import os
import re
import subprocess
import sys

import pytest

from fedur.federated.placement import clients_on_rank

from .conftest import REPO, free_port

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

LAUNCHER_VARIABLES = ("SLURM_", "LT_", "TORCHELASTIC_", "MASTER_", "PMI_", "OMPI_")  # what a shell may carry over


def srun_environment(rank: int, port: int, nodes: int) -> dict[str, str]:
    """What `srun` sets for task `rank` of a 2-task job on `nodes` nodes (--ntasks-per-node=2/nodes)."""
    per_node = 2 // nodes
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    return {
        **env,
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),  # this checkout's fedur
        "HF_HUB_OFFLINE": "1",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "fedur-test", "SLURM_NNODES": str(nodes),
        "SLURM_NODELIST": "localhost", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_CPUS_PER_TASK": "1", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NODEID": str(rank // per_node),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),  # else Lightning derives them from the job
    }


@pytest.mark.parametrize("nodes", [1, 2])
def test_srun_tasks_become_ranks_and_host_contiguous_client_blocks(tmp_path, nodes):
    """2 tasks on 1 node, and 1 task on each of 2 (simulated) nodes: node-major ranks, contiguous clients."""
    run_dir, port, per_node = tmp_path / "run", free_port(), 2 // nodes
    command = [  # the srun line of launch/slurm.sbatch, on CPU and without resume
        sys.executable, "fedur/main.py", "--config", "configs/tiny.yaml", "--federation.rounds", "1",
        "--run.output_dir", str(run_dir), "--run.threads", "1", "--fabric.accelerator", "cpu",
        "--fabric.num_nodes", str(nodes), "--fabric.devices", str(per_node),
    ]
    tasks = []
    for rank in range(2):
        out, err = open(tmp_path / f"out{rank}", "w"), open(tmp_path / f"err{rank}", "w")
        tasks.append(subprocess.Popen(command, cwd=REPO, env=srun_environment(rank, port, nodes), stdout=out, stderr=err))
    codes = []
    for task in tasks:
        try:
            codes.append(task.wait(timeout=300))
        finally:
            task.kill()
    stdout = [(tmp_path / f"out{r}").read_text() for r in range(2)]
    assert codes == [0, 0], stdout + [(tmp_path / f"err{r}").read_text()[-3000:] for r in range(2)]

    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["cluster_environment"] == "SLURMEnvironment" and placement["world_size"] == 2
    assert placement["ranks"] == [
        {"rank": 0, "node": 0, "local_rank": 0, "clients": [0, 1]},
        {"rank": 1, "node": 1 if nodes == 2 else 0, "local_rank": 0 if nodes == 2 else 1, "clients": [2, 3]},
    ]
    assert [r["clients"] for r in placement["ranks"]] == [clients_on_rank(4, 2, r) for r in range(2)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["placement"] == placement
    assert sorted(p.name for p in (run_dir / "prompts").glob("client_*.pt")) == [f"client_00{k}.pt" for k in range(4)]
    where = "node 1, local rank 0" if nodes == 2 else "node 0, local rank 1"
    assert f"rank 1 ({where}) hosts clients [2, 3]" in stdout[0] and "round   1/1" in stdout[0]
    assert stdout[1] == "", "only rank 0 prints"


SCRIPTS = ["slurm.sbatch", "slurm-2x8.sbatch"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_sbatch_scripts_ask_for_one_task_per_gpu_and_a_requeue_signal(name):
    text = (REPO / "launch" / name).read_text()
    options = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, flags=re.M))
    assert options["ntasks-per-node"] == options["gres"].removeprefix("gpu:"), "one rank per GPU"
    assert options["signal"] == "SIGUSR1@90" and "requeue" in options and options["open-mode"] == "append"
    assert subprocess.run(["bash", "-n", str(REPO / "launch" / name)]).returncode == 0


def test_generic_sbatch_launches_every_task_with_the_allocation_layout():
    text = (REPO / "launch" / "slurm.sbatch").read_text()
    srun = re.search(r"^srun .*?(?<!\\)\n", text, flags=re.M | re.S).group(0)
    for flag in ("--kill-on-bad-exit=1", "fedur/main.py", '--run.output_dir "runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}"',
                 "--run.resume auto", '--fabric.num_nodes "$SLURM_NNODES"', '--fabric.devices "$SLURM_NTASKS_PER_NODE"'):
        assert flag in srun
    assert re.search(r"#SBATCH --nodes=2\b", (REPO / "launch" / "slurm-2x8.sbatch").read_text())
