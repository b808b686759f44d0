"""Run a grid's runs: skip the finished ones, resume the interrupted ones, one after another or several at once.

A run is finished when its `summary.json` exists. Every other run starts with `--run.resume auto`, which
continues from the last committed checkpoint in its directory when there is one and starts afresh
otherwise. Each run writes its output to `<cell>/seed<k>.log` (appended, so a resumed run keeps the
interrupted one's lines). A failed run is reported with its log and does not stop the others.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fedur.app.tables.grids import RunSpec, config_path, preset_config
from fedur.train import checkpoint
from fedur.train.run_dir import changed_settings

MAIN = Path(importlib.util.find_spec("fedur.main").origin)  # the script `fabric run` launches
# Launchers that take a script path (fabric run ... fedur/main.py); any other launcher (srun, mpirun,
# env ...) is followed by the python interpreter and the script.
SCRIPT_LAUNCHERS = {"fabric", "lightning", "torchrun"}
TINY_CLIP_ENV = "FEDUR_TINY_CLIP"
TINY_CLIP_NAME = "tinyclip-teacher-a"
EXTRA_MARK = "# fedur-tables flags after --: "  # the log line after a start line, when there were any


def extra_text(spec: RunSpec, inputs: Inputs) -> str:
    """The flags after `--` of this invocation for one run, as its log records them ({seed} filled in)."""
    return shlex.join(arg.replace("{seed}", str(spec.seed)) for arg in inputs.extra)


def extra_flags(log: Path) -> str:
    """The flags after `--` of the last start recorded in a run's log ('' for none or no log)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("# fedur-tables ") and not line.startswith(EXTRA_MARK)]
    if not starts or starts[-1] + 1 >= len(lines) or not lines[starts[-1] + 1].startswith(EXTRA_MARK):
        return ""
    return lines[starts[-1] + 1][len(EXTRA_MARK):]


@dataclass(frozen=True)
class Inputs:
    """What the runs read besides the grid: data and model folders, the launcher and extra flags."""

    data_root: str | None = None  # DIR, DIR with {dataset}, or "name=DIR,name=DIR"
    model_dir: str | None = None  # the tiny-clip folder (proxy grids)
    launcher: str | None = None
    extra: tuple[str, ...] = ()
    threads: int | None = None  # --run.threads for every run (parallel local runs)


def data_root_for(spec: RunSpec, data_root: str | None) -> str | None:
    """The --dataset.root of one run: DIR/<dataset> for a grid of several datasets, DIR for one dataset,
    a {dataset} template filled in, or the DIR given as dataset=DIR."""
    if not spec.grid.uses_data_root or not data_root:
        return None
    dataset = spec.column.dataset
    if "=" in data_root:
        pairs = dict(item.split("=", 1) for item in data_root.split(",") if item)
        return pairs.get(dataset)
    if "{dataset}" in data_root:
        return data_root.format(dataset=dataset)
    if len({c.dataset for c in spec.grid.columns}) > 1:
        return str(Path(data_root) / dataset)
    return data_root


def model_dir_for(model_dir: str | None) -> Path | None:
    """The tiny-clip folder: --model-dir, else $FEDUR_TINY_CLIP (None: neither is given)."""
    value = model_dir or os.environ.get(TINY_CLIP_ENV)
    return Path(value).expanduser().resolve() if value else None


def command(spec: RunSpec, inputs: Inputs) -> list[str]:
    """The command line of one run. Later flags win, so the grid's come before the extra ones and the
    run's own (seed, directory, resume) come last."""
    if inputs.launcher:
        launcher = shlex.split(inputs.launcher)
        beside_python = Path(sys.executable).parent / launcher[0]
        if shutil.which(launcher[0]) is None and beside_python.is_file():  # `fabric` of a venv that is not activated
            launcher[0] = str(beside_python)
        program = Path(launcher[0]).name
        head = [*launcher, str(MAIN)] if program in SCRIPT_LAUNCHERS else [*launcher, sys.executable, str(MAIN)]
    else:
        head = [sys.executable, "-m", "fedur.main"]
    own = preset_config(spec.row, spec.column) if spec.grid.protocol == "own" else None
    preset = ["--config", str(config_path(own))] if own else []
    grid_flags = [flag.replace("{seed}", str(spec.seed)) for flag in spec.grid.flags]  # e.g. a partition per seed
    cmd = [*head, "--config", str(config_path(spec.column.config)), *preset, *spec.column.flags, *grid_flags,
           *spec.row.flags]
    root = data_root_for(spec, inputs.data_root)
    if root:
        cmd += ["--dataset.root", root]
    folder = model_dir_for(inputs.model_dir)
    if spec.grid.uses_model_dir and folder is not None:
        cmd += ["--model.config_file", str(folder / f"{TINY_CLIP_NAME}.json"),
                "--model.pretrained", str(folder / f"{TINY_CLIP_NAME}.pt")]
    if inputs.threads and not any(arg.startswith("--run.threads") for arg in inputs.extra):
        cmd += ["--run.threads", str(inputs.threads)]
    extra = [arg.replace("{seed}", str(spec.seed)) for arg in inputs.extra]  # e.g. --federation.partition_seed {seed}
    cmd += [*extra, "--run.seed", str(spec.seed), "--run.output_dir", str(spec.run_dir),
            "--run.resume", "auto", "--run.progress", "false"]
    return cmd


def committed_round(run_dir: Path) -> int | None:
    """The number of rounds the newest committed checkpoint holds (None: nothing to resume from)."""
    try:
        committed = checkpoint.latest(run_dir)
    except checkpoint.CheckpointError:  # an unreadable marker: the run resumes, and says what is wrong with it
        return checkpoint.committed_rounds(run_dir)[-1][0]
    return None if committed is None else committed.round_idx + 1


def other_settings(specs: list[RunSpec], inputs: Inputs) -> list[tuple[RunSpec, dict]]:
    """Finished runs whose settings that change results (as their last checkpoint recorded them) differ from
    what this call would run: [(run, {key: (theirs, this call's)})]. Runs without a checkpoint (zero-shot)
    are not checked; launch settings (threads, devices, paths) and the precision never count."""
    clashes, parser = [], None
    for spec in specs:
        if status(spec) != "done":
            continue
        committed = checkpoint.latest(spec.run_dir)
        if committed is None:
            continue
        if parser is None:  # the parser imports the plugins (torch): only when there is a finished run to check
            from fedur.app.cli import build_parser, parse_config
            from fedur.config import result_settings

            parser = build_parser()
        cmd = command(spec, inputs)
        cfg = parse_config(cmd[cmd.index("--config"):], parser)
        diff = changed_settings(committed.marker.settings, result_settings(cfg.settings))
        diff.pop("fabric.precision", None)
        if diff:
            clashes.append((spec, diff))
    return clashes


def read_summary(run_dir: Path) -> dict | None:
    """A run's summary.json (None: the run has not finished, or the file is unreadable), with what fedur-attack
    measured of it as "attack" (RUN/attack/membership.json's "summary"), where it was attacked."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    try:
        summary["attack"] = json.loads((run_dir / "attack" / "membership.json").read_text())["summary"]
        leak = json.loads((run_dir / "attack" / "histograms.json").read_text())
        summary["attack"]["histogram_tv"] = leak.get("mean_tv")  # the server's estimate of each client's class shares
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        pass
    return summary


def status(spec: RunSpec) -> str:
    """'done' (summary.json), 'resume' (a committed checkpoint) or 'new'."""
    if (spec.run_dir / "summary.json").is_file():
        return "done"
    return "resume" if committed_round(spec.run_dir) is not None else "new"


@dataclass
class Outcome:
    spec: RunSpec
    ok: bool
    returncode: int | None
    seconds: float
    message: str  # the accuracy for a finished run, the last error line for a failed one


def last_error_line(log: Path) -> str:
    """The most telling line at the end of a log: fedur's own error, else the last non-empty line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[-200:] if line.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("fedur: error") or "Error" in line.split(":")[0]:
            return line[:300]
    return lines[-1][:300] if lines else ""


class Children:
    """The runs in progress, so that an interrupted fedur-tables stops them (they resume on the next call)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def start(self, cmd: list[str], log) -> subprocess.Popen | None:
        with self.lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.procs.add(proc)
            return proc

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every run (fedur stops at its next safe point), SIGKILL what is left after `grace` s."""
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()


def run_one(spec: RunSpec, inputs: Inputs, children: Children) -> Outcome:
    """Start one run with its output appended to its log; wait for it."""
    spec.cell_dir.mkdir(parents=True, exist_ok=True)
    cmd = command(spec, inputs)
    started = time.monotonic()
    with spec.log.open("a") as log:
        log.write(f"# fedur-tables {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(cmd)}\n")
        if inputs.extra:  # the table lists them: they change what the cell means
            log.write(f"{EXTRA_MARK}{extra_text(spec, inputs)}\n")
        log.flush()
        proc = children.start(cmd, log)
        if proc is None:
            return Outcome(spec, False, None, 0.0, "not started: fedur-tables was interrupted")
        returncode = proc.wait()
        with children.lock:
            children.procs.discard(proc)
    seconds = time.monotonic() - started
    summary = spec.run_dir / "summary.json"
    if returncode == 0 and summary.is_file():
        return Outcome(spec, True, returncode, seconds, "")
    if returncode == 0:  # stopped at a checkpoint (a signal): rerunning resumes it
        return Outcome(spec, False, returncode, seconds, "stopped before its last round (no summary.json); rerun to resume")
    return Outcome(spec, False, returncode, seconds, last_error_line(spec.log))


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def execute(specs: list[RunSpec], inputs: Inputs, jobs: int = 1, echo=print) -> list[Outcome]:
    """Run every spec (jobs at a time), printing which run, i of n, and its log as each starts and ends."""
    total = len(specs)
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    children = Children()

    def work(item: tuple[int, RunSpec]) -> Outcome:
        i, spec = item
        resume = committed_round(spec.run_dir)
        state = f"resuming after round {resume}" if resume is not None else "starting"
        with lock:
            echo(f"[{i}/{total}] {state}: {spec.name}  log {spec.log}")
        outcome = run_one(spec, inputs, children)
        if children.stopping:
            return outcome
        with lock:
            if outcome.ok:
                echo(f"[{i}/{total}] finished in {format_seconds(outcome.seconds)}: {spec.name}{result_text(spec)}")
            else:
                echo(f"[{i}/{total}] FAILED (exit {outcome.returncode}) after {format_seconds(outcome.seconds)}: "
                     f"{spec.name}\n    log {spec.log}\n    {outcome.message}")
            outcomes.append(outcome)
        return outcome

    items = list(enumerate(specs, start=1))
    pool = ThreadPoolExecutor(max_workers=max(jobs, 1))
    try:
        futures = [pool.submit(work, item) for item in items]
        for future in futures:
            future.result()
    except KeyboardInterrupt:
        echo("interrupted: stopping the runs in progress; the same command resumes them")
        children.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return outcomes


def summary_value(summary: dict, key: str):
    """summary.json's `key`; "a.b" reads summary["a"]["b"] (final_domain_accuracy.photo)."""
    value = summary
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def result_text(spec: RunSpec) -> str:
    summary = read_summary(spec.run_dir)
    if not summary:
        return ""
    value = summary_value(summary, spec.value)
    clients = summary.get("final_client_accuracy") or summary.get("zero_shot_client_accuracy") or []
    worst = f", worst client {min(clients):.2f}%" if clients else ""
    return f"  {value:.2f}%{worst}" if isinstance(value, (int, float)) else ""


def default_threads(jobs: int) -> int | None:
    """CPU threads per run when `jobs` runs share this machine (None: fedur's default, cores / ranks)."""
    if jobs <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // jobs)
