"""GPU first light: does fedur run, learn, reproduce and resume on a bare GPU machine, and what does it cost?

One command, self-contained and offline, under 8 minutes on one NVIDIA H200. It prints one verdict line per
step (`PASS demo-bf16: finishes, learns (zero-shot 55.30% -> 72.91%) ...` or `FAIL <step>: <reason>`) and
exits non-zero if any step failed. On the GPU machine, from the repository root, with the wheels of what its
Python lacks (open_clip_torch, jsonargparse with its `signatures` extra, ftfy and their needs) in .whl/:

    python3 benchmarks/gpu_first_light.py --wheels .whl --out $OUT --runs-dir /tmp/fl-runs

and here, on CPU, the same steps with tiny settings (a rehearsal of the script, not a measurement; a few
minutes on 2 cores):

    python benchmarks/gpu_first_light.py --cpu-rehearsal --out /tmp/fl

`--wheels DIR` first installs DIR/*.whl into --site (/tmp/site) with `pip install --no-index --no-deps
--target`, and every process started here gets `PYTHONPATH=<site>:<repository root>` (fedur is used from the
checkout, not installed). Then the imports are checked (torch with CUDA, lightning, open_clip, jsonargparse
with signatures support, fedur, fedur.app.cli parsing configs/smoke.yaml, fedur.plugins naming the methods); a
missing one stops the script with a FAIL line. `--check-imports-only` stops there.

Steps (every fedur run is `python3 fedur/main.py --config configs/smoke.yaml ...` in a subprocess with a
timeout; what is checked is read from the metrics.jsonl, summary.json and prompts/*.pt the runs write):

  demo-bf16          the demo at --fabric.precision bf16-mixed: finishes, and its final mean accuracy is at
                     least LEARNING_MARGIN points above the zero-shot client mean
  demo-fp32          the same at 32-true
  repeat-bf16        demo-bf16 again with the same settings: bitwise equal to it (every metric but the timings,
                     the summary's accuracies, every prompt file)
  resume-bf16        killed in round 3 (FEDUR_FAULT=kill:train:3:0: rounds 1 and 2 committed), then
                     --run.resume true on the same run directory: bitwise equal to demo-bf16
  methods            every one of fedur's methods (--method X; their names from fedur.plugins.builtin("method"),
                     read by the imports check in the runs' environment) for 2 rounds: finishes with finite
                     metrics (a method without rounds, ZeroShot, with its summary only)
  clients-per-step   one round with --run.clients_per_step 4 against 1 (bf16): the same pseudo-label counts
                     (within 2), mean accuracy within 1 point, prompts within a rounding tolerance (PROMPT_RTOL)
  round-cost         ViT-B/32, random init, generated images (benchmarks/round_cost.py's `round` part): each
                     phase's images per second, beside an 8192^3 bf16 matmul rate measured here; the evaluate
                     phase with the global model on against off (round_cost.py runs both)
  memory             peak GPU memory (torch.cuda.max_memory_allocated, fedur run in-process in a child process
                     through fedur.app.cli.parse_config + fedur.app.run.run) with 10 and 100 clients

The first six run side by side (--jobs fedur processes at once); round-cost and memory run alone afterwards.
Each step has its own time budget, the whole a global one (--budget); one failing step never stops the
others. `--steps a,b` reruns some of them (names as above).

--cpu-rehearsal: --fabric.accelerator cpu; the demo steps as on the GPU (the demo's tiny model at bf16 is only
~2x slower than at fp32 on a CPU), fedur-tiny instead of ViT-B/32 for round-cost and memory, a 1024^3 bf16
matmul, the process's peak RSS instead of GPU memory.

Results: --out (default $OUT, else a new temporary folder) gets first-light.log (every command and its whole
output), first-light.md (each step's verdict, figures and command lines: commit it under benchmarks/results/),
first-light.json and round_cost/ (round_cost.py's report). Run directories go to --runs-dir (default
<out>/runs; a new rerun-<time> folder inside it when it is not empty).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT_MARK = "FIRST_LIGHT_RESULT "  # a child process's last line: its figures as JSON
LEARNING_MARGIN = 5.0  # points of mean accuracy above zero-shot: FedUR's smallest gain on the demo is +10.2
# clients-per-step: 4 clients per step against one by one, after one round at bf16. The mean accuracy: a client's
# test set is ~100 images, so one near-tie prediction that bf16 rounding flips moves it by ~1 point (seen: 1.96),
# and their mean by a quarter of that (seen: 0.16).
ACCURACY_TOLERANCE = 1.0
# Prompts: the same math, but a grouped forward multiplies other batch shapes, whose bf16 matmuls accumulate in
# another order and round their outputs to 8 mantissa bits (2^-8 = 0.4% of an entry). Two local epochs of such
# gradients, through SGD with momentum, move each prompt tensor by under 1% of its largest entry (seen on CPU:
# 0.08% visual, 0.6% text): 5% leaves room for GPU kernels and still catches a prompt trained on another client's
# data or left untrained (those are tens of percent off).
PROMPT_RTOL = 0.05
SELECTED_TOLERANCE = 2  # pseudo-labels per client, see step_clients_per_step
MEMORY_GROWTH_LIMIT = 3.0  # peak with 100 clients over peak with 10: per-client state kept on the device
STEP_NAMES = ("demo-bf16", "demo-fp32", "repeat-bf16", "resume-bf16", "methods", "clients-per-step", "round-cost", "memory")


class StepFailure(Exception):
    """A step's check failed: its message is the verdict's reason."""


# ---------------------------------------------------------------- settings per machine


@dataclass(frozen=True)
class Profile:
    """What the steps run with: on the GPU, or the CPU rehearsal's tiny settings."""

    device: str
    budget: float  # seconds for the whole script
    budgets: dict  # seconds per step
    big_model: str  # round-cost and memory
    round_images: int
    round_clients: int
    memory_clients: tuple = (10, 100)
    memory_train_per_client: int = 20
    memory_test_per_client: int = 4
    matmul_n: int = 8192
    matmul_reps: int = 10
    floor_seconds: float = 0.5  # round_cost.py's timing of each floor cost: at least this long, at most floor_reps calls
    floor_reps: int = 10


# Budgets: the first six steps run side by side, so theirs count from the same start (waiting for a --jobs slot
# included); round-cost and memory follow, alone. On CPU (2 cores, 2 jobs) the rehearsal took ~190 s with 8 methods
# on an idle machine: the first six ~150 s (a demo run ~20-30 s, half of it process start), round-cost ~16 s, memory
# ~21 s; with 12 methods, round-cost's run twice (global model on and off), and another job on the cores, 419 s
# (methods 301 s, round-cost 53 s); on a quiet 2-core machine with native bf16 and round-cost's floors timed once
# (2 clients, 40 images), 133 s (methods 86 s, round-cost 20 s). On the H200 (not yet measured) a demo run should be mostly process start
# (~10-20 s): 19 runs over 6 jobs ~80 s, round-cost and memory ~60-90 s each. The global budget keeps the whole
# under 8 minutes whatever a step does.
GPU = Profile(
    device="cuda", budget=450,
    budgets={"imports": 90, "demo-bf16": 150, "demo-fp32": 150, "repeat-bf16": 180, "resume-bf16": 240, "methods": 270,
             "clients-per-step": 240, "round-cost": 180, "memory": 180},
    big_model="ViT-B-32", round_images=500, round_clients=10,
)
CPU = Profile(
    device="cpu", budget=900,
    budgets={"imports": 120, "demo-bf16": 240, "demo-fp32": 240, "repeat-bf16": 360, "resume-bf16": 480, "methods": 600,
             "clients-per-step": 480, "round-cost": 240, "memory": 240},
    big_model="fedur-tiny", round_images=40, round_clients=2, matmul_n=1024, matmul_reps=5, floor_seconds=0.0, floor_reps=1,
)


# ---------------------------------------------------------------- steps, their verdicts and their commands


@dataclass
class Step:
    name: str
    budget: float
    ok: bool | None = None
    message: str = ""
    figures: dict = field(default_factory=dict)
    commands: list = field(default_factory=list)
    started: float | None = None
    seconds: float = 0.0

    def verdict(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.message}"


class Context:
    """What every step shares: settings, folders, the log, the child processes' environment, the clock."""

    def __init__(self, args: argparse.Namespace, profile: Profile) -> None:
        self.args, self.profile = args, profile
        self.out, self.runs = Path(args.out), Path(args.runs_dir)
        self.started = time.monotonic()
        self.deadline = self.started + (args.budget or profile.budget)
        self.slots = threading.BoundedSemaphore(args.jobs)  # fedur processes at once
        self.lock = threading.Lock()
        self.log_file = (self.out / "first-light.log").open("w")
        paths = ([args.site] if args.wheels else []) + [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                    "FEDUR_CACHE_DIR": str(self.runs / "cache")}
        self.demo_done = threading.Event()  # set when demo-bf16 has finished, well or not
        self.demo_dir: Path | None = None  # demo-bf16's run, once it passed its own checks
        self.facts: dict = {}  # the import check's versions and device

    def log(self, text: str) -> None:
        with self.lock:
            self.log_file.write(text.rstrip("\n") + "\n")
            self.log_file.flush()

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log(line)

    def remaining(self, step: Step) -> float:
        return min(step.started + step.budget, self.deadline) - time.monotonic()

    def shown(self, cmd: list[str], env: dict | None = None) -> str:
        """A command line as one would type it from the repository root."""
        words = ["python3" if c == sys.executable else os.path.relpath(c, REPO) if c.startswith(str(REPO) + "/") else c
                 for c in cmd]
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
        return prefix + " ".join(shlex.quote(w) for w in words)

    def run(self, step: Step, cmd: list[str], env: dict | None = None, slot: bool = True) -> tuple[int, str, float]:
        """Run a command from the repository root within the step's time left (its process group killed past
        that): (exit code, its output, seconds). Holds one of the --jobs slots while it runs."""
        shown = self.shown(cmd, env)
        step.commands.append(shown)
        with self.slots if slot else contextlib.nullcontext():
            timeout = self.remaining(step)
            if timeout <= 1:
                raise StepFailure(f"no time left in its budget ({step.budget:.0f} s, or the script's) for `{shown}`")
            start = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=REPO, env={**self.env, **(env or {})}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started (round_cost's runs)
                output, _ = proc.communicate()
                seconds = time.monotonic() - start
                self.log(f"+ [{step.name}] {shown}\n{output}\n[killed after {seconds:.0f} s: over the time budget]")
                raise StepFailure(f"timed out after {seconds:.0f} s (budget): `{shown}`; last output: {tail(output)}") from None
            seconds = time.monotonic() - start
        self.log(f"+ [{step.name}] {shown}\n{output}\n[exit {proc.returncode} after {seconds:.1f} s]")
        return proc.returncode, output, seconds

    def run_ok(self, step: Step, cmd: list[str], env: dict | None = None, slot: bool = True) -> tuple[str, float]:
        code, output, seconds = self.run(step, cmd, env, slot)
        if code != 0:
            raise StepFailure(f"exit {code} after {seconds:.0f} s: {tail(output)}")
        return output, seconds

    def fedur(self, step: Step, run_dir: Path, *overrides: str, precision: str = "bf16-mixed",
              config: str = "configs/smoke.yaml", env: dict | None = None, check: bool = True):
        """`python3 fedur/main.py --config <config> ...` on this machine's device into run_dir."""
        cmd = [sys.executable, "fedur/main.py", "--config", config, "--fabric.accelerator", self.profile.device,
               "--fabric.devices", "1", "--fabric.precision", precision, "--run.progress", "false",
               "--run.output_dir", str(run_dir), *overrides]
        return self.run_ok(step, cmd, env) if check else self.run(step, cmd, env)


def tail(output: str, lines: int = 3) -> str:
    kept = [line.strip() for line in output.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:] or "(no output)"


def child_result(output: str) -> dict:
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise StepFailure(f"no result line from the child process: {tail(output)}")


def perform(ctx: Context, step: Step, fn: Callable[[Context, Step], str]) -> Step:
    """Run one step: its verdict, whatever goes wrong in it."""
    step.started = time.monotonic()
    try:
        step.message = fn(ctx, step)
        step.ok = True
    except StepFailure as err:
        step.ok, step.message = False, str(err)
    except Exception as err:  # a bug here or an unexpected output: still a verdict, and the other steps go on
        step.ok, step.message = False, f"{type(err).__name__}: {err}"
        ctx.log(traceback.format_exc())
    step.seconds = time.monotonic() - step.started
    return step


# ---------------------------------------------------------------- what the runs wrote


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.exists():
        raise StepFailure(f"{path} was not written")
    return json.loads(path.read_text())


def load_prompts(run_dir: Path) -> dict[str, dict]:
    import torch

    return {path.name: torch.load(path, map_location="cpu", weights_only=True)
            for path in sorted((run_dir / "prompts").glob("*.pt"))}


def same_results(a: Path, b: Path) -> list[str]:
    """What differs between two runs that should have computed the same thing (tests/conftest.py's
    assert_same_results): every metric but the timings, the summaries' accuracies, every prompt file, bitwise."""
    import torch

    problems = []
    strip = lambda row: {k: v for k, v in row.items() if k not in ("round_seconds", "phase_seconds")}  # noqa: E731
    rows_a, rows_b = [strip(r) for r in read_rows(a)], [strip(r) for r in read_rows(b)]
    if len(rows_a) != len(rows_b):
        problems.append(f"metrics.jsonl has {len(rows_a)} rows against {len(rows_b)}")
    for row_a, row_b in zip(rows_a, rows_b):
        keys = sorted(k for k in row_a.keys() | row_b.keys() if row_a.get(k) != row_b.get(k))
        if keys:
            problems.append(f"round {row_a.get('round')}: {', '.join(keys)}")
    summary_a, summary_b = read_summary(a), read_summary(b)
    for key in ("final_client_accuracy", "best_mean_accuracy", "zero_shot_client_accuracy", "zero_shot_global"):
        if summary_a.get(key) != summary_b.get(key):
            problems.append(f"summary.json {key}: {summary_a.get(key)} against {summary_b.get(key)}")
    prompts_a, prompts_b = load_prompts(a), load_prompts(b)
    if not prompts_a or prompts_a.keys() != prompts_b.keys():
        problems.append(f"prompt files {sorted(prompts_a)} against {sorted(prompts_b)}")
    for name in sorted(prompts_a.keys() & prompts_b.keys()):
        x, y = prompts_a[name], prompts_b[name]
        if x.keys() != y.keys() or not all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x):
            problems.append(f"prompts/{name}")
    return problems


def prompt_gap(a: Path, b: Path) -> tuple[float, str]:
    """The largest |x - y| over max |x| of any prompt tensor of two runs, and where."""
    import torch

    worst, where = 0.0, ""
    prompts_a, prompts_b = load_prompts(a), load_prompts(b)
    if not prompts_a or prompts_a.keys() != prompts_b.keys():
        raise StepFailure(f"prompt files {sorted(prompts_a)} against {sorted(prompts_b)}")
    for name, x in prompts_a.items():
        for key, value in x.items():
            p, q = torch.as_tensor(value).double(), torch.as_tensor(prompts_b[name][key]).double()
            if p.shape != q.shape:
                raise StepFailure(f"prompts/{name} {key}: shape {tuple(p.shape)} against {tuple(q.shape)}")
            gap = float((p - q).abs().max() / p.abs().max().clamp_min(1e-12)) if p.numel() else 0.0
            if gap > worst or not where:
                worst, where = gap, f"{name}:{key}"
    return worst, where


def non_finite(value, path: str = "") -> list[str]:
    """Paths of the NaN or infinite numbers in a JSON value (None is allowed: a metric a method has not)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "value"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite(v, f"{path}[{i}]")]
    return []


def learned(run_dir: Path, rounds: int) -> tuple[str, dict]:
    """A finished demo run that learned: its figures, or StepFailure."""
    summary = read_summary(run_dir)
    final, zero_shot, best = summary["final_mean_accuracy"], summary["zero_shot_client_mean"], summary["best_mean_accuracy"]
    figures = {"zero_shot_client_mean": zero_shot, "final_mean_accuracy": final, "best_mean_accuracy": best,
               "rounds_completed": summary["rounds_completed"], "wall_seconds": summary.get("wall_seconds")}
    if summary["rounds_completed"] != rounds:
        raise StepFailure(f"{summary['rounds_completed']} of {rounds} rounds completed")
    if non_finite([final, zero_shot, best]) or final - zero_shot < LEARNING_MARGIN:
        raise StepFailure(f"finishes but does not learn: zero-shot {zero_shot:.2f}% -> final {final:.2f}% "
                          f"(needs +{LEARNING_MARGIN:.0f} points)")
    return f"zero-shot {zero_shot:.2f}% -> {final:.2f}%, best {best:.2f}%", figures


# ---------------------------------------------------------------- the steps


def step_imports(ctx: Context, step: Step) -> str:
    """Install the wheels (--wheels), then import what the runs need in a child process with their environment."""
    args = ctx.args
    if args.wheels:
        wheels = sorted(Path(args.wheels).glob("*.whl"))
        if not wheels:
            raise StepFailure(f"no *.whl in {args.wheels}")
        ctx.run_ok(step, [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--upgrade", "--target", args.site, *map(str, wheels)], slot=False)
        sys.path.insert(0, args.site)
        step.figures["wheels"] = [w.name for w in wheels]
    output = ctx.run_ok(step, [sys.executable, __file__, "--child", "imports", ctx.profile.device], slot=False)[0]
    facts = child_result(output)
    ctx.facts = facts
    step.figures.update(facts)
    if facts["missing"]:
        raise StepFailure("missing or broken: " + "; ".join(facts["missing"]))
    installed = f"{len(step.figures['wheels'])} wheels into {args.site}, then " if args.wheels else ""
    note = f"; note, unmet: {'; '.join(facts['unmet_requirements'])}" if facts["unmet_requirements"] else ""
    return (f"{installed}torch {facts['torch']} on {facts['device_name']}, lightning {facts['lightning']}, "
            f"open_clip {facts['open_clip']}, jsonargparse {facts['jsonargparse']} (signatures), fedur.app.cli parses "
            f"configs/smoke.yaml, {len(facts['methods'])} methods{note}")


def step_demo_bf16(ctx: Context, step: Step) -> str:
    try:
        run_dir = ctx.runs / "demo-bf16"
        seconds = ctx.fedur(step, run_dir)[1]
        text, step.figures = learned(run_dir, 5)
        ctx.demo_dir = run_dir
    finally:
        ctx.demo_done.set()
    return f"finishes, learns ({text}; {seconds:.0f} s)"


def step_demo_fp32(ctx: Context, step: Step) -> str:
    run_dir = ctx.runs / "demo-fp32"
    seconds = ctx.fedur(step, run_dir, precision="32-true")[1]
    text, step.figures = learned(run_dir, 5)
    return f"finishes, learns ({text}; {seconds:.0f} s)"


def wait_for_demo(ctx: Context, step: Step) -> Path:
    if not ctx.demo_done.wait(timeout=max(0.0, ctx.remaining(step))) or ctx.demo_dir is None:
        raise StepFailure("demo-bf16 did not finish or did not pass: nothing to compare with")
    return ctx.demo_dir


def compare_with_demo(ctx: Context, step: Step, run_dir: Path) -> str:
    demo = wait_for_demo(ctx, step)
    problems = same_results(demo, run_dir)
    step.figures["differences"] = problems
    if problems:
        raise StepFailure(f"differs from demo-bf16 in {len(problems)} place(s): {'; '.join(problems[:4])}")
    return f"{len(read_rows(run_dir))} metrics rows, summary and {len(load_prompts(run_dir))} prompt files bitwise equal to demo-bf16"


def step_repeat_bf16(ctx: Context, step: Step) -> str:
    run_dir = ctx.runs / "repeat-bf16"
    seconds = ctx.fedur(step, run_dir)[1]
    return f"{compare_with_demo(ctx, step, run_dir)} ({seconds:.0f} s)"


def step_resume_bf16(ctx: Context, step: Step) -> str:
    run_dir = ctx.runs / "resume-bf16"
    # Rounds count from 1: the kill comes while round 3 trains, after rounds 1 and 2 were committed.
    code, output, _ = ctx.fedur(step, run_dir, env={"FEDUR_FAULT": "kill:train:3:0"}, check=False)
    if code != -signal.SIGKILL or "injected fault" not in output:
        raise StepFailure(f"the injected kill did not happen as planned (exit {code}): {tail(output)}")
    committed = sorted(int(p.parent.name.split("_")[-1]) for p in run_dir.glob("checkpoints/round_*/COMMITTED.json"))
    step.figures["committed_before_resume"] = committed
    if not committed or committed[-1] != 2:
        raise StepFailure(f"after the kill the committed rounds are {committed}, not up to round 2")
    ctx.fedur(step, run_dir, "--run.resume", "true")
    return f"killed in round 3 (rounds {committed} committed), resumed: {compare_with_demo(ctx, step, run_dir)}"


def step_methods(ctx: Context, step: Step) -> str:
    # fedur's own methods and their rounds, from the imports check (fedur.plugins in the runs' environment: this
    # process imports nothing of fedur, which may need the wheels installed first)
    methods = ctx.facts["methods"]

    def one(method: str) -> tuple[str, str | None, float | None]:
        """(method, what is wrong or None, final mean accuracy)."""
        run_dir = ctx.runs / f"method-{method}"
        try:
            ctx.fedur(step, run_dir, "--method", method, "--federation.rounds", "2")
            summary, rows = read_summary(run_dir), read_rows(run_dir)
        except StepFailure as err:
            return method, str(err), None
        expected = methods[method]  # a method without rounds (ZeroShot): its summary only
        if len(rows) != expected or summary["rounds_completed"] != expected:
            return method, f"{len(rows)} metrics rows, {summary['rounds_completed']} rounds completed (expected {expected})", None
        bad = non_finite(rows) + non_finite({k: summary.get(k) for k in ("final_mean_accuracy", "final_client_accuracy",
                                                                       "zero_shot_client_mean", "best_mean_accuracy")})
        if summary.get("final_mean_accuracy") is None or bad:
            return method, f"non-finite or missing: {', '.join(bad[:5]) or 'final_mean_accuracy'}", None
        return method, None, summary["final_mean_accuracy"]

    with ThreadPoolExecutor(len(methods)) as pool:  # the --jobs slots bound how many run at once
        results = list(pool.map(one, methods))
    step.figures = {m: {"final_mean_accuracy": acc, "problem": problem} for m, problem, acc in results}
    failed = [f"{m}: {problem}" for m, problem, _ in results if problem]
    if failed:
        raise StepFailure(f"{len(failed)} of {len(methods)} failed: " + "; ".join(failed))
    finals = ", ".join(f"{m} {acc:.1f}" for m, _, acc in results)
    return f"all {len(methods)} finish 2 rounds with finite metrics (final mean %: {finals})"


def step_clients_per_step(ctx: Context, step: Step) -> str:
    """One round of the demo (bf16) with its 4 clients one by one and all 4 per step. One round, because the
    refresh at the start of every later round makes discrete choices (top-u per class, median filters) that
    turn bf16 rounding into other pseudo-labels, after which the runs legitimately part: on CPU, after 5
    rounds, 1.2 points of mean accuracy and 2.9 of one client's (at 32-true they stay identical)."""
    def one(group: int) -> Path:
        run_dir = ctx.runs / f"clients-per-step-{group}"
        ctx.fedur(step, run_dir, "--run.clients_per_step", str(group), "--federation.rounds", "1")
        return run_dir

    with ThreadPoolExecutor(2) as pool:
        alone, together = pool.map(one, (1, 4))
    (row_1,), (row_4,) = read_rows(alone), read_rows(together)
    mean_gap = abs(row_1["mean_accuracy"] - row_4["mean_accuracy"])
    client_gap = max(abs(a - b) for a, b in zip(row_1["client_accuracy"], row_4["client_accuracy"]))
    loss_gap = max(abs(a - b) / abs(a) for a, b in zip(row_1["loss"], row_4["loss"]))
    gap, where = prompt_gap(alone, together)
    step.figures = {"mean_accuracy": {"1": row_1["mean_accuracy"], "4": row_4["mean_accuracy"]},
                    "client_accuracy": {"1": row_1["client_accuracy"], "4": row_4["client_accuracy"]},
                    "selected": {"1": row_1["selected"], "4": row_4["selected"]}, "largest_loss_gap_relative": loss_gap,
                    "largest_prompt_gap_relative": gap, "prompt": where, "prompt_rtol": PROMPT_RTOL}
    # Both start from the same zero-shot CLIP's pseudo-labels; bf16 rounding may flip a near-tie or two among a
    # client's ~250 images (on CPU none flipped), a different selection would move many.
    selected_gap = max(abs(a - b) for a, b in zip(row_1["selected"], row_4["selected"]))
    if selected_gap > SELECTED_TOLERANCE or len(row_1["selected"]) != len(row_4["selected"]):
        raise StepFailure(f"other pseudo-labels from the same zero-shot CLIP: selected {row_1['selected']} "
                          f"against {row_4['selected']}")
    if mean_gap > ACCURACY_TOLERANCE:
        raise StepFailure(f"mean accuracy {row_1['mean_accuracy']:.2f}% one by one against {row_4['mean_accuracy']:.2f}% "
                          f"4 per step (> {ACCURACY_TOLERANCE} point)")
    if gap > PROMPT_RTOL:
        raise StepFailure(f"prompts differ by {gap:.2e} of their largest entry at {where} (> {PROMPT_RTOL})")
    same = "same pseudo-label counts" if selected_gap == 0 else f"pseudo-label counts within {selected_gap}"
    return (f"1 round, 4 per step vs one by one: {same}, mean accuracy {row_1['mean_accuracy']:.2f}% / "
            f"{row_4['mean_accuracy']:.2f}% (largest client gap {client_gap:.2f} points), losses within {loss_gap:.1e}, "
            f"prompts within {gap:.1e} of their largest entry (tolerance {PROMPT_RTOL})")


def step_round_cost(ctx: Context, step: Step) -> str:
    p = ctx.profile
    matmul = child_result(ctx.run_ok(step, [sys.executable, __file__, "--child", "matmul", p.device, str(p.matmul_n),
                                            str(p.matmul_reps)])[0])
    step.figures["matmul"] = matmul
    out = ctx.out / "round_cost"
    cmd = [sys.executable, str(REPO / "benchmarks" / "round_cost.py"), "--device", p.device, "--precision", "bf16",
           "--parts", "round", "--models", p.big_model, "--round-models", p.big_model, "--round-images", str(p.round_images),
           "--round-clients", str(p.round_clients), "--round-shared", "on", "--round-rounds", "2",
           "--min-seconds", str(p.floor_seconds), "--max-reps", str(p.floor_reps), "--out", str(out)]
    if p.device == "cpu":
        cmd += ["--threads", "1"]
    ctx.run_ok(step, cmd)
    results = json.loads((out / f"{p.device}.json").read_text())
    # One configuration, run with the global model on (fedur's default) and off: the verdict's figures are the first's.
    (key, run), = ((k, r) for k, r in results["round"].items() if not k.endswith("|global-off"))
    failed = [r for r in results["round"].values() if "error" in r]
    if failed:
        raise StepFailure(f"round_cost.py's run failed: {tail(failed[0]['error'])}")
    rows = []
    for r in run["rounds"]:
        ph = r.get("phase_seconds") or {}
        images = {"refresh": run["train_images"] if r.get("refreshed") else 0, "train": r["trained_images"],
                  "evaluate": run["test_images"]}
        rates = {phase: n / ph[phase] for phase, n in images.items() if n and ph.get(phase)}
        rows.append({"round": r["round"], "round_seconds": r["round_seconds"], "phase_seconds": ph, "images": images,
                     "images_per_s": rates, "floor_seconds": r["floor_seconds"]})
        if set(rates) != {phase for phase, n in images.items() if n} or non_finite(rates):
            raise StepFailure(f"round {r['round']}: phase times missing or not finite: {ph}")
    global_evaluation = results.get("global_evaluation", {}).get(key) or []
    step.figures.update({"run": key, "command": run["command"], "model": run["model"], "clients": run["clients"],
                         "train_images": run["train_images"], "test_images": run["test_images"], "rounds": rows,
                         "global_evaluation": global_evaluation, "startup_seconds": run.get("startup_seconds"),
                         "round_cost_matmul_flops_per_s": results["matmul"]["flops_per_s"]})
    last = rows[-1]
    rates = ", ".join(f"{phase} {rate:,.0f} img/s" for phase, rate in last["images_per_s"].items())
    ratio = global_evaluation[-1]["on_over_off"] if global_evaluation else None
    evaluate = f"; evaluate x{ratio:.2f} with the global model on than off" if ratio else ""
    return (f"{run['model']}, {run['clients']} clients, {run['train_images']} train / {run['test_images']} test images, "
            f"round {last['round']}: {rates} (round {last['round_seconds']:.2f} s, floor {last['floor_seconds']:.2f} s{evaluate}); "
            f"{matmul['dtype']} {matmul['n']}^3 matmul {flop_rate(matmul['median_flops_per_s'])} "
            f"(median of {matmul['reps']}, best {flop_rate(matmul['best_flops_per_s'])})")


def flop_rate(flops_per_s: float) -> str:
    """TFLOP/s on a GPU; GFLOP/s where that would read 0.0 (the CPU rehearsal's bf16 matmul)."""
    return f"{flops_per_s / 1e12:,.1f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:,.1f} GFLOP/s"


def step_memory(ctx: Context, step: Step) -> str:
    p = ctx.profile
    peaks = {}
    for clients in p.memory_clients:
        run_dir = ctx.runs / f"memory-{clients}"
        args = ["--config", "configs/tiny.yaml", "--model.name", p.big_model, "--model.pretrained", "null",
                "--model.n_ctx", "16", "--dataset", "Synthetic", "--dataset.classes", "10",
                "--dataset.train_per_class", str(clients * p.memory_train_per_client // 10),
                "--dataset.test_per_class", str(clients * p.memory_test_per_client // 10),
                "--federation.num_clients", str(clients), "--federation.partition", "iid", "--federation.rounds", "1",
                "--federation.local_epochs", "1", "--federation.refresh_every", "1", "--optim.batch_size", "64",
                "--fabric.accelerator", p.device, "--fabric.devices", "1", "--fabric.precision", "bf16-mixed",
                "--run.progress", "false", "--run.output_dir", str(run_dir)]
        output, seconds = ctx.run_ok(step, [sys.executable, __file__, "--child", "memory", *args])
        peaks[clients] = {**child_result(output), "seconds": seconds}
    step.figures = {str(k): v for k, v in peaks.items()}
    few, many = (peaks[k]["peak_bytes"] for k in p.memory_clients)
    kind = peaks[p.memory_clients[0]]["kind"]
    shown = ", ".join(f"{k} clients {v['peak_bytes'] / 2**30:.2f} GiB" for k, v in peaks.items())
    if many > MEMORY_GROWTH_LIMIT * few:
        raise StepFailure(f"{kind}: {shown}: grows x{many / few:.1f} with the clients (> x{MEMORY_GROWTH_LIMIT})")
    return (f"{p.big_model}, {p.memory_train_per_client} train images per client, 1 round: {shown} "
            f"(x{many / few:.2f}; {kind})")


STEPS: dict[str, Callable[[Context, Step], str]] = {
    "demo-bf16": step_demo_bf16, "demo-fp32": step_demo_fp32, "repeat-bf16": step_repeat_bf16,
    "resume-bf16": step_resume_bf16, "methods": step_methods, "clients-per-step": step_clients_per_step,
    "round-cost": step_round_cost, "memory": step_memory,
}
ALONE = ("round-cost", "memory")  # timings and memory peaks: nothing else running


# ---------------------------------------------------------------- child processes


def child(argv: list[str]) -> None:
    """`--child imports|matmul|memory ...`: the parts that run in their own process; the last line printed is
    RESULT_MARK + their figures as JSON."""
    kind, rest = argv[0], argv[1:]
    result = {"imports": child_imports, "matmul": child_matmul, "memory": child_memory}[kind](rest)
    print(RESULT_MARK + json.dumps(result), flush=True)


def child_imports(argv: list[str]) -> dict:
    import importlib

    device, missing, facts = argv[0], [], {}
    for name in ("torch", "lightning", "torchvision", "open_clip", "jsonargparse", "docstring_parser", "typeshed_client",
                 "ftfy", "fedur", "fedur.main"):
        try:
            module = importlib.import_module(name)
            facts[name] = getattr(module, "__version__", "ok")
        except Exception as err:  # what a broken install raises varies
            missing.append(f"{name} ({type(err).__name__}: {err})")
    if "torch" in facts:
        import torch

        facts["cuda"] = torch.version.cuda
        if device == "cuda" and not torch.cuda.is_available():
            missing.append("CUDA (torch.cuda.is_available() is False)")
        facts["device_name"] = (torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available()
                                else f"{platform.machine()} CPU, {os.cpu_count()} cores")
    if "jsonargparse" in facts:
        from jsonargparse import _optionals

        for flag in ("docstring_parser_support", "typeshed_client_support"):
            if not getattr(_optionals, flag, True):
                missing.append(f"jsonargparse signatures support ({flag} is False)")
    if "fedur.main" in facts:
        try:
            from fedur.app.cli import parse_config

            parse_config(["--config", "configs/smoke.yaml"])
        except Exception as err:
            missing.append(f"fedur.app.cli.parse_config(configs/smoke.yaml) ({type(err).__name__}: {err})")
        try:  # what the methods step runs: every one of fedur's methods, and the rounds each has of 2
            from fedur import plugins

            facts["methods"] = {cls.__name__: cls().rounds(2) for cls in plugins.builtin("method")}
        except Exception as err:
            missing.append(f"fedur.plugins.builtin('method') ({type(err).__name__}: {err})")
    facts["python"] = platform.python_version()
    facts["executable"] = sys.executable
    return {**facts, "missing": missing, "unmet_requirements": unmet_requirements()}


def unmet_requirements() -> list[str]:
    """What the carried packages require (jsonargparse with its `signatures` extra) that is absent or of another
    version here: a note, since an older timm, say, may still do for what fedur uses of open_clip."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:
        return ["(packaging is missing: requirements not checked)"]
    unmet = []
    for dist, extra in (("open_clip_torch", None), ("jsonargparse", "signatures"), ("ftfy", None), ("typeshed_client", None)):
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue  # reported as a missing import
        for text in requires:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": extra or ""}):
                continue
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{dist} needs {req} (absent)")
                continue
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                unmet.append(f"{dist} needs {req} (found {version})")
    return unmet


def child_matmul(argv: list[str]) -> dict:
    import torch

    device, n, reps = torch.device(argv[0]), int(argv[1]), int(argv[2])
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):  # warm-up: cuBLAS picks its kernel, the clocks rise
        a @ b
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - start)
    flops = 2 * n**3
    times.sort()
    return {"n": n, "dtype": "bf16", "reps": reps, "device": str(device), "seconds": times,
            "median_flops_per_s": flops / times[len(times) // 2], "best_flops_per_s": flops / times[0]}


def child_memory(argv: list[str]) -> dict:
    """fedur in this process (fedur.app.cli.parse_config + fedur.app.run.run, as tests/train/test_fit.py does), then its
    peak memory: torch.cuda.max_memory_allocated on CUDA, the process's peak RSS on CPU."""
    import torch

    from fedur.app.cli import parse_config
    from fedur.app.run import run

    cfg = parse_config(argv)
    cuda = cfg.fabric.accelerator == "cuda"
    run(cfg)  # nothing was on the GPU before it: the process's peak is the run's
    if cuda:
        return {"kind": "torch.cuda.max_memory_allocated, fedur in-process", "peak_bytes": torch.cuda.max_memory_allocated(),
                "reserved_bytes": torch.cuda.max_memory_reserved()}
    return {"kind": "process peak RSS (ru_maxrss), fedur in-process",
            "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---------------------------------------------------------------- report


def write_report(ctx: Context, steps: list[Step], command: str) -> None:
    facts, total = ctx.facts, time.monotonic() - ctx.started
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    device = facts.get("device_name", "device unknown (imports failed)")
    lines = [
        f"# fedur first light: {device}", "",
        f"`{command}` on {datetime.date.today().isoformat()}, {total:.0f} s in all; fedur {commit or '(not a git checkout)'}, "
        f"Python {facts.get('python', '?')}, torch {facts.get('torch', '?')} (CUDA {facts.get('cuda')}), lightning "
        f"{facts.get('lightning', '?')}, open_clip {facts.get('open_clip', '?')}, jsonargparse {facts.get('jsonargparse', '?')}.",
        "",
        f"Every command ran from the repository root with `PYTHONPATH={ctx.env['PYTHONPATH']} HF_HUB_OFFLINE=1 "
        f"FEDUR_CACHE_DIR={ctx.env['FEDUR_CACHE_DIR']}`; run directories in `{ctx.runs}`, the whole log in "
        "`first-light.log`.", "",
        "| step | verdict | seconds |", "| --- | --- | --- |",
    ]
    lines += [f"| {s.name} | {'PASS' if s.ok else 'FAIL'}: {s.message.replace('|', '/')} | {s.seconds:.0f} |" for s in steps]
    for s in steps:
        lines += ["", f"## {s.name}", "", s.verdict(), "", f"Budget {s.budget:.0f} s, took {s.seconds:.0f} s.", ""]
        if s.figures:
            lines += ["```json", json.dumps(s.figures, indent=1, default=str), "```", ""]
        if s.commands:
            lines += ["Commands:", ""] + [f"- `{c}`" for c in s.commands]
    (ctx.out / "first-light.md").write_text("\n".join(lines) + "\n")
    (ctx.out / "first-light.json").write_text(json.dumps(
        {"command": command, "seconds": total, "facts": facts,
         "steps": [{"name": s.name, "ok": s.ok, "message": s.message, "seconds": s.seconds, "figures": s.figures,
                    "commands": s.commands} for s in steps]}, indent=1, default=str))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--cpu-rehearsal", action="store_true", help="the same steps with tiny settings on CPU")
    parser.add_argument("--wheels", help="install DIR/*.whl into --site first (pip --no-index --no-deps --target)")
    parser.add_argument("--site", default="/tmp/site", help="where --wheels installs to (default /tmp/site)")
    parser.add_argument("--check-imports-only", action="store_true", help="install the wheels, check the imports, stop")
    parser.add_argument("--out", default=os.environ.get("OUT") or None, help="log and summary (default $OUT, else a temp dir)")
    parser.add_argument("--runs-dir", help="the runs' directories (default <out>/runs)")
    parser.add_argument("--jobs", type=int, help="fedur processes at once in the first six steps (GPU 6, CPU 2)")
    parser.add_argument("--budget", type=float, help="seconds for the whole script (GPU 450, CPU 900)")
    parser.add_argument("--steps", help=f"only these steps, comma-separated: {','.join(STEP_NAMES)}")
    args = parser.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="first-light-")
    args.runs_dir = args.runs_dir or str(Path(args.out) / "runs")
    args.jobs = args.jobs or (2 if args.cpu_rehearsal else 6)
    args.steps = args.steps.split(",") if args.steps else list(STEP_NAMES)
    unknown = sorted(set(args.steps) - set(STEP_NAMES))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {','.join(STEP_NAMES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return 0
    args = parse_args(argv)
    profile = CPU if args.cpu_rehearsal else GPU
    out, runs = Path(args.out), Path(args.runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    if runs.exists() and any(runs.iterdir()):  # a rerun: fedur never writes a new run into a used directory
        runs = runs / time.strftime("rerun-%Y%m%d-%H%M%S")
        args.runs_dir = str(runs)
    runs.mkdir(parents=True, exist_ok=True)
    ctx = Context(args, profile)
    command = "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *argv])
    ctx.say(f"first light: {command}; log and summary in {out}, runs in {runs}")
    steps = [perform(ctx, Step("imports", profile.budgets["imports"]), step_imports)]
    ctx.say(steps[0].verdict())
    if steps[0].ok and not args.check_imports_only:
        chosen = [name for name in STEP_NAMES if name in args.steps]
        together = [name for name in chosen if name not in ALONE]
        if "demo-bf16" not in together:
            ctx.demo_done.set()  # nothing to wait for: the comparisons say so
        with ThreadPoolExecutor(max(1, len(together))) as pool:
            futures = [pool.submit(perform, ctx, Step(name, profile.budgets[name]), STEPS[name]) for name in together]
            for future in futures:  # verdicts in step order, each as soon as it is known
                steps.append(future.result())
                ctx.say(steps[-1].verdict())
        for name in (n for n in chosen if n in ALONE):
            steps.append(perform(ctx, Step(name, profile.budgets[name]), STEPS[name]))
            ctx.say(steps[-1].verdict())
    write_report(ctx, steps, command)
    failed = [s.name for s in steps if not s.ok]
    ctx.say(f"first light: {len(steps) - len(failed)} of {len(steps)} steps passed in {time.monotonic() - ctx.started:.0f} s"
            + (f"; failed: {', '.join(failed)}" if failed else "") + f"; summary {out / 'first-light.md'}, log {out / 'first-light.log'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
