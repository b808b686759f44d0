"""A grid as a SLURM job array: task i runs run i of the grid (`fedur-tables GRID --task i ...`).

The array lists only the runs that are not finished; a task whose run finished meanwhile exits at once.
Each run is launched with `srun` inside its task, so SLURM's `--signal=SIGUSR1@90` reaches fedur, which
checkpoints and requeues the task; the requeued task runs the same `--task i` and resumes the run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fedur.app.tables.grids import RunSpec

SRUN = "srun --kill-on-bad-exit=1"
# Appended to every run's flags inside a task: the layout and threads follow the allocation.
ALLOCATION_FLAGS = ('--run.threads "${SLURM_CPUS_PER_TASK:-1}" --fabric.num_nodes "$SLURM_NNODES" '
                    '--fabric.devices "$SLURM_NTASKS_PER_NODE"')


@dataclass(frozen=True)
class SlurmOptions:
    gpus: int = 1  # GPUs (= ranks) per task, on one node
    cpus_per_task: int = 8
    time: str = "24:00:00"
    parallel: int | None = None  # at most this many tasks at once (%P)
    options: tuple[str, ...] = ()  # further #SBATCH options, e.g. --partition=gpu


def array_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    parts: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = i
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


def task_command(grid: str, task_args: list[str], extra: list[str]) -> str:
    """The command every array task runs; $SLURM_ARRAY_TASK_ID picks the run."""
    head = [sys.executable, "-m", "fedur.app.tables.cli", grid, "--task"]
    tail = shlex.join(task_args) + " -- " + (shlex.join(extra) + " " if extra else "")
    return shlex.join(head) + ' "$SLURM_ARRAY_TASK_ID" ' + tail + ALLOCATION_FLAGS


def script(grid: str, todo: list[RunSpec], total: int, folder: Path, task_args: list[str], extra: list[str],
           options: SlurmOptions, invocation: str) -> str:
    array = array_ranges([s.index for s in todo]) + (f"%{options.parallel}" if options.parallel else "")
    resources = [f"--ntasks-per-node={max(options.gpus, 1)}", f"--cpus-per-task={options.cpus_per_task}"]
    if options.gpus > 0:
        resources.append(f"--gres=gpu:{options.gpus}")
    sbatch = [f"--job-name=fedur-{grid}", f"--array={array}", "--nodes=1", *resources, f"--time={options.time}",
              "--signal=SIGUSR1@90", "--requeue", "--open-mode=append", f"--output={folder}/slurm/%A_%a.out",
              *options.options]
    lines = [
        "#!/bin/bash",
        f"# fedur-tables {grid}: {len(todo)} of the grid's {total} runs, one per array task (the others are finished).",
        f"# Written by: {invocation}",
        f"# Submit: sbatch {folder / f'{grid}-array.sbatch'}   (paths are absolute; runs.tsv maps task ids to runs)",
        "# Task i runs run i of the grid with `--run.resume auto`; a task whose run finished meanwhile exits at once.",
        "# Requeue: SIGUSR1 90 s before the time limit reaches fedur through srun; it checkpoints and requeues",
        "# the task, which resumes the run. Render the table any time: fedur-tables ... --table-only.",
        *(f"#SBATCH {opt}" for opt in sbatch),
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",  # where fedur-tables was called (every path here is absolute)
        task_command(grid, task_args, extra),
        "",
    ]
    return "\n".join(lines)


def index_tsv(specs: list[RunSpec], statuses: dict[int, str]) -> str:
    lines = ["task\tstatus\trow\tcolumn\tseed\trun_dir\tlog"]
    for s in specs:
        lines.append(f"{s.index}\t{statuses[s.index]}\t{s.row.key}\t{s.column.key}\t{s.seed}\t{s.run_dir}\t{s.log}")
    return "\n".join(lines) + "\n"


def submit(path: Path, render_command: str, folder: Path, options: SlurmOptions) -> str:
    """sbatch the array, then a small job that renders the table once every task has ended."""
    out = subprocess.run(["sbatch", str(path)], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)", out)
    if not match:
        return out.strip()
    job = match.group(1)
    render = subprocess.run(
        ["sbatch", f"--dependency=afterany:{job}", f"--job-name=fedur-table-{path.stem}", "--ntasks=1",
         "--cpus-per-task=1", "--time=00:30:00", f"--output={folder}/slurm/table-%j.out", *options.options,
         f"--wrap={render_command}"],
        capture_output=True, text=True, check=True).stdout
    return f"{out.strip()} (array); {render.strip()} (renders the table after it)"
