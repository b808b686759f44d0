"""Checkpoints and exact resume: crashes at the worst moments, SIGKILL, SIGTERM/SIGUSR1, and dead peers.

The reference is one uninterrupted in-process run (1 rank). Every interrupted run, on 1 or 2 ranks, must
end with the same metrics lines (timings aside), the same final prompts, and the same last checkpoint
(prompts, optimizer state, pseudo-labels and negatives, class weights) as that run, compared with torch.equal.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedur import plugins
from fedur.app.cli import parse_config
from fedur.app.run import run
from fedur.train import checkpoint
from fedur.train.faults import ENV as FAULT_ENV
from fedur.train.faults import InjectedFault
from fedur.train.run_dir import RunDirError

from .conftest import REPO, free_port, read_rounds, scalar_curve
from .shared_runs import SHARED, every_case, method_cases

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

ROUNDS = 3
# Each client keeps its SGD momentum across rounds, so the checkpoints carry optimizer state that
# a resume must restore exactly.
SMOKE = [
    "--config", "configs/tiny.yaml", "--federation.rounds", str(ROUNDS), "--run.keep_checkpoints", "5",
    "--optim.optimizer_state", "client",
]
TIMING = {"round_seconds", "phase_seconds", "wall_seconds"}


def run_in_process(run_dir: Path, *overrides: str, fault: str | None = None):
    """One run in this process; `fault`: a FEDUR_FAULT to inject (fedur/train/faults.py)."""
    cfg = parse_config([*SMOKE, "--run.output_dir", str(run_dir), *overrides])
    with pytest.MonkeyPatch.context() as patch:
        if fault is not None:
            patch.setenv(FAULT_ENV, fault)
        return run(cfg)


def launch(args: list[str], fabric_ranks: int = 0, timeout: int = 300, fault: str | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **popen.pop("env", {})}
    if fault is not None:
        env[FAULT_ENV] = fault
    if fabric_ranks:
        fabric = str(Path(sys.executable).parent / "fabric")
        cmd = [fabric, "run", "--accelerator", "cpu", "--devices", str(fabric_ranks), "--main-port", str(free_port()), "fedur/main.py"]
    else:
        cmd = [sys.executable, "fedur/main.py"]
    return subprocess.Popen([*cmd, *SMOKE, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def tensors_of(obj) -> dict[str, torch.Tensor]:
    """Flat {dotted name: tensor} of a nested checkpoint payload."""
    if isinstance(obj, torch.Tensor):
        return {"": obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {f"{key}.{name}".rstrip("."): t for key, value in items for name, t in tensors_of(value).items()}


def timed_output(process: subprocess.Popen, timeout: float = 300) -> tuple[str, list[tuple[float, str]]]:
    """Read the process's output to its end: (output, [(arrival time, line)])."""
    lines, deadline = [], time.monotonic() + timeout
    for line in process.stdout:
        lines.append((time.monotonic(), line))
        assert time.monotonic() < deadline, "".join(text for _, text in lines)[-2000:]
    process.wait(timeout=60)
    return "".join(text for _, text in lines), lines


def seconds_between(lines: list[tuple[float, str]], first: str, then: str | None = None) -> float:
    """Seconds from the line containing `first` to the line containing `then` (None: to the end of the job)."""
    start = next(t for t, text in lines if first in text)
    end = time.monotonic() if then is None else next(t for t, text in lines if then in text)
    return end - start


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the final prompts and of the last committed checkpoint."""
    tensors = {}
    for path in sorted((run_dir / "prompts").rglob("*.pt")):  # chosen/: the label-free choice's models
        name = path.relative_to(run_dir / "prompts").as_posix()
        tensors.update({f"prompts/{name}:{k}": v for k, v in tensors_of(torch.load(path, weights_only=True)).items()})
    last = checkpoint.latest(run_dir)
    for path in sorted(last.folder.glob("*.pt")):
        tensors.update({f"{last.folder.name}/{path.name}:{k}": v for k, v in tensors_of(checkpoint.load(path)).items()})
    return tensors


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert metrics(run_dir) == metrics(reference)
    curves = [scalar_curve(d / "tensorboard", "accuracy/mean") for d in (run_dir, reference)]
    assert curves[0] == curves[1]  # the same TensorBoard run, continued
    got, want = final_state(run_dir), final_state(reference)
    assert got.keys() == want.keys()
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, f"tensors differ from the uninterrupted run: {different[:5]}"
    summary, ref_summary = (json.loads((d / "summary.json").read_text()) for d in (run_dir, reference))
    for key in ("final_client_accuracy", "final_mean_accuracy", "best_mean_accuracy", "zero_shot_client_accuracy",
                "final_global_accuracy", "new_client_adapted_client_accuracy", "label_free_choice", "estimator_errors"):
        assert summary.get(key) == ref_summary.get(key), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_in_process(run_dir)
    return run_dir


def test_every_round_is_committed_and_old_ones_pruned(reference, tmp_path):
    assert [r for r, _ in checkpoint.committed_rounds(reference)] == [1, 2, 3]  # round_00001: after round 1
    marker = checkpoint.latest(reference).marker
    assert marker.round_idx == 2 and marker.number == 3 and marker.format == checkpoint.FORMAT
    assert marker.num_clients == 4 and marker.settings["federation.beta"] == 0.5
    assert marker.settings["method"] == "fedur.methods.fedur.FedUR" and marker.settings["labeller"] is None
    client = checkpoint.load(checkpoint.client_file(checkpoint.latest(reference).folder, 3))
    assert set(client) >= {"prompts", "optimizer_state", "pseudo_labels", "train_indices", "extra"}
    assert set(client["prompts"]) == {"visual", "text_ctx"}
    assert client["pseudo_labels"]["mask"].dtype == torch.bool  # CoDPL: the negative pseudo-labels
    assert client["optimizer_state"][0]["momentum_buffer"].abs().sum() > 0  # the SGD momentum, compared after every resume
    shared = checkpoint.load(checkpoint.latest(reference).folder / "global.pt")
    assert shared["refresh"]["class_weights"].shape == (5,)

    run_in_process(tmp_path / "pruned", "--federation.rounds", "2", "--run.keep_checkpoints", "1")
    assert [r for r, _ in checkpoint.committed_rounds(tmp_path / "pruned")] == [2]  # the last of 2 rounds


def test_crash_before_the_commit_marker_resumes_from_the_round_before(reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(InjectedFault):
        run_in_process(run_dir, fault="raise:commit:2:0")
    folder = checkpoint.round_folder(run_dir, 2)
    assert (checkpoint.client_file(folder, 0)).exists() and not (folder / checkpoint.MARKER).exists()
    assert checkpoint.latest(run_dir).round_idx == 0
    assert len(metrics(run_dir)) == 2  # round 1 was logged, then the crash: resuming must drop that line

    capsys.readouterr()
    run_in_process(run_dir, "--run.resume", "true")
    assert "round_00001 (round 2 of 3 is next)" in capsys.readouterr().out
    assert_same_run(run_dir, reference)


@pytest.mark.parametrize("point", ["train", "commit"])
def test_sigkill_on_two_ranks_then_resume_equals_the_uninterrupted_run(reference, tmp_path, point):
    """SIGKILL of rank 1 in the middle of round 2's training, or after it wrote its clients' checkpoint
    files of round 2 but before rank 0's commit marker: the resume continues after round 1."""
    run_dir = tmp_path / "run"
    killed = launch(["--run.output_dir", str(run_dir)], fabric_ranks=2, fault=f"kill:{point}:2:1")
    out, lines = timed_output(killed)
    assert killed.returncode != 0 and f"injected fault: kill at {point} of round 2 on rank 1" in out, out[-2000:]
    seconds = seconds_between(lines, "injected fault: kill")
    print(f"dead peer (SIGKILL at {point}): the job exited {seconds:.1f} s later, code {killed.returncode}")
    assert seconds < 60  # the survivors do not wait for a timeout (slack for a loaded CI machine)
    assert checkpoint.latest(run_dir).round_idx == 0
    if point == "commit":
        assert checkpoint.client_file(checkpoint.round_folder(run_dir, 2), 3).exists()  # rank 1 had written its files

    if point == "train":  # resume on 2 ranks again
        resumed = launch(["--run.output_dir", str(run_dir), "--run.resume", "true"], fabric_ranks=2)
        out, _ = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, out[-3000:]
    else:  # client files do not depend on placement: resume all 4 clients on 1 rank
        run_in_process(run_dir, "--run.resume", "true")
    assert_same_run(run_dir, reference)  # == the uninterrupted 1-rank run


def wait_for_rounds(process: subprocess.Popen, run_dir: Path, rounds: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= rounds:
            return
        assert process.poll() is None, process.communicate()[0][-2000:]
        time.sleep(0.02)
    raise AssertionError("the run did not reach the round in time")


@pytest.mark.parametrize("case", ["SIGTERM", "SIGUSR1", "SIGUSR1, round too long"])
def test_stop_signal_checkpoints_exits_0_and_resumes_identically(reference, tmp_path, case):
    """SIGUSR1 also requeues the SLURM job (a fake `scontrol` on PATH records the call): after the round's
    commit, or at run.requeue_deadline when the round has not ended by then."""
    sig = case.split(",")[0]
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    run_dir = tmp_path / "run"
    late = ["--run.requeue_deadline", "0.001"] if "too long" in case else []
    process = launch(["--run.output_dir", str(run_dir), *late], env=env)
    wait_for_rounds(process, run_dir, 1)
    process.send_signal(getattr(signal, sig))
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out[-2000:]
    assert f"received {sig}" in out and "the checkpoint is committed" in out
    assert not (run_dir / "summary.json").exists()
    stopped_at = checkpoint.latest(run_dir).round_idx
    assert stopped_at < ROUNDS - 1
    if sig == "SIGUSR1":
        assert calls.read_text().split() == ["requeue", "4242"]  # exactly once
        assert ("did not end within run.requeue_deadline" in out) == ("too long" in case)
    else:  # scancel also sends SIGTERM: not requeued unless run.requeue_on lists it
        assert not calls.exists()

    run_in_process(run_dir, "--run.resume", "auto")
    assert_same_run(run_dir, reference)


def test_a_stuck_peer_fails_the_run_within_the_wait_timeout(tmp_path):
    run_dir = tmp_path / "run"
    process = launch(["--run.output_dir", str(run_dir), "--run.wait_timeout", "8"], fabric_ranks=2, fault="hang:commit:2:1")
    out, lines = timed_output(process)
    assert process.returncode != 0, out[-3000:]
    error = "a peer died, or did not arrive within run.wait_timeout"
    assert "failed on rank 0: " + error in out, out[-3000:]
    survivor = seconds_between(lines, "injected fault: hang at commit of round 2 on rank 1", error)
    job = seconds_between(lines, "injected fault: hang")
    print(f"stuck peer: rank 0 failed {survivor:.1f} s after the hang (wait_timeout 8 s); the job ended after {job:.1f} s")
    assert survivor < 8 + 60  # far below the collective library's 30-minute default; slack for a loaded CI machine
    assert checkpoint.latest(run_dir).round_idx == 0  # the committed round survives


def test_resume_auto_starts_over_after_a_crash_before_the_first_commit(reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(InjectedFault):
        run_in_process(run_dir, fault="raise:commit:1:0")
    assert checkpoint.latest(run_dir) is None and (run_dir / "metrics.jsonl").exists()
    run_in_process(run_dir, "--run.resume", "auto")  # a requeued job: nothing to resume, so it starts over
    assert "holds no committed round; starting over" in capsys.readouterr().out
    assert_same_run(run_dir, reference)

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="holds notes.txt"):
        run_in_process(tmp_path / "other", "--run.resume", "auto")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


# Every one of fedur's methods (each with its own labeller: every labeller's state is among them), and the mechanisms
# whose state a resume must carry (CPL's GRIP pools, SCAFFOLD's control variates, GDA-U's server state with clients
# sitting out, a plugin's own piece, new clients, privacy's ledger and adaptive clip, the virtual clock, attackers):
# each crashed before its second commit and resumed must equal its uninterrupted run, the session's shared one
# (tests/shared_runs.py).
RESUMED = [*(name for name in method_cases() if "+" not in name and plugins.by_key("method")[name]().rounds(2) == 2),
           "promptprox-grip", "gdau-join", "scaffold-join", "adapter", "fedur-new-clients",
           "fedur-private-central", "scaffold-private-local",  # ZeroShot has no round; privacy: its ledger and clip
           "fedur-stragglers", "fedcopl-attacked",  # the virtual clock, lost uploads, an attacker's stream
           "promptfl-flipped-krum", "fedur-scaled-clipped",  # the other attacks' and aggregators' kinds
           "fedur-label-free", "fedotp-label-free",  # the chosen models with their pieces, zero-shot's predictions
           "fedur-fedbuff", "promptfl-fedasync"]  # an asynchronous server, killed with jobs in flight


@pytest.mark.parametrize("name", RESUMED)
def test_every_method_resumes_exactly_after_a_crash(tiny_runs, tmp_path, name):
    flags = [*SHARED, *every_case()[name]]
    cfg = lambda *more: parse_config([*flags, "--run.output_dir", str(tmp_path / "run"), *more])  # noqa: E731
    with pytest.MonkeyPatch.context() as patch, pytest.raises(InjectedFault):
        patch.setenv(FAULT_ENV, "raise:commit:2:0")
        run(cfg())
    assert checkpoint.latest(tmp_path / "run").round_idx == 0
    run(cfg("--run.resume", "true"))
    assert_same_run(tmp_path / "run", tiny_runs / name)
    if name == "pfedprompt":  # the cache is part of what was compared
        assert "extra.cache_keys" in {k.split(":")[1] for k in final_state(tmp_path / "run") if "client_000" in k}


def test_a_resume_may_change_how_many_clients_train_per_step(reference, tmp_path):
    """run.clients_per_step changes float rounding only, like run.threads: a run crashed with clients one by
    one continues with all four per step (its momenta carry over), close to the uninterrupted run."""
    run_dir = tmp_path / "run"
    with pytest.raises(InjectedFault):
        run_in_process(run_dir, fault="raise:commit:2:0")
    run_in_process(run_dir, "--run.resume", "true", "--run.clients_per_step", "4")
    got, want = final_state(run_dir), final_state(reference)
    assert got.keys() == want.keys()
    floats = [name for name in want if want[name].is_floating_point()]
    assert floats and all(torch.allclose(got[name], want[name], atol=1e-4) for name in floats)


def test_a_resume_compares_the_class_names_files_content_not_its_path(tmp_path):
    """The docs' own layout keeps classnames.txt in the data folder: a moved folder must resume (the path changed,
    not the names); a file whose names changed must not."""
    names = ["disc", "box", "wedge", "asterisk", "plus"]
    first = tmp_path / "old-place" / "classnames.txt"
    first.parent.mkdir()
    first.write_text("\n".join(names) + "\n")
    run_dir = tmp_path / "run"
    run_in_process(run_dir, "--federation.rounds", "1", "--data.classnames_file", str(first))
    moved = tmp_path / "new-place" / "classnames.txt"
    moved.parent.mkdir()
    first.rename(moved)
    run_in_process(run_dir, "--federation.rounds", "2", "--run.resume", "true", "--data.classnames_file", str(moved))
    assert [r["round"] for r in read_rounds(run_dir)] == [1, 2]
    moved.write_text("\n".join(reversed(names)) + "\n")
    with pytest.raises(RunDirError, match="data.classnames_file: the file's content differs from the checkpoint's"):
        run_in_process(run_dir, "--federation.rounds", "3", "--run.resume", "true", "--data.classnames_file", str(moved))


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, "--federation.rounds", "1")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_in_process(run_dir, "--federation.rounds", "1", "--run.resume", "true") is None
    said = capsys.readouterr().out
    assert f"{run_dir} is finished: all 1 round(s) are committed" in said and "next" not in said
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def as_written_before_rounds_counted_from_1(run_dir: Path) -> None:
    """A run directory as fedur wrote it when files counted rounds from 0: metrics rows and best_round one lower,
    checkpoint folders round_0000(r-1), markers of format 1."""
    rows = read_rounds(run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**r, "round": r["round"] - 1}) + "\n" for r in rows))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["best_round"] -= 1
    del summary["first_round"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for number, folder in checkpoint.committed_rounds(run_dir):
        marker = json.loads((folder / checkpoint.MARKER).read_text())
        (folder / checkpoint.MARKER).write_text(json.dumps({**marker, "format": 1, "round": number - 1}))
        folder.rename(checkpoint.round_folder(run_dir, number - 1))


def test_a_run_from_before_rounds_counted_from_1_is_read_and_resumed_in_its_own_numbering(tmp_path):
    from fedur.app.report import load_run

    old, new = tmp_path / "old", tmp_path / "new"
    run_in_process(old, "--federation.rounds", "2")
    as_written_before_rounds_counted_from_1(old)
    assert load_run(old).curve([1, 2, 3])[0] == [0, 1, 2]  # rounds completed, whatever the numbering
    assert checkpoint.latest(old).round_idx == 1 and checkpoint.latest(old).marker.format == 1
    run_in_process(old, "--run.resume", "true")  # ROUNDS (3): one more round, written as that run writes them
    assert [r["round"] for r in read_rounds(old)] == [0, 1, 2]
    assert [n for n, _ in checkpoint.committed_rounds(old)] == [0, 1, 2]
    summary = json.loads((old / "summary.json").read_text())
    assert summary["first_round"] == 0 and summary["rounds_completed"] == 3
    run_in_process(new)  # the same computation, numbered from 1
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("round", "rounds")} for r in rows]  # noqa: E731
    assert strip(metrics(old)) == strip(metrics(new))
    assert scalar_curve(old / "tensorboard", "accuracy/mean") == scalar_curve(new / "tensorboard", "accuracy/mean")
    unnumbered = lambda state: {k.split("/", 1)[1] if k.startswith("round_") else k: v for k, v in state.items()}  # noqa: E731
    got, want = unnumbered(final_state(old)), unnumbered(final_state(new))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_crash_while_new_clients_adapt_resumes_to_the_uninterrupted_result(tmp_path, capsys):
    """The adaptation comes after the last commit: a run that dies there has every round committed and no
    summary.json, and its resume adapts the new clients again from the last checkpoint, to the same result."""
    flags = ["--evaluation.new_clients", "2"]
    run_in_process(tmp_path / "uninterrupted", *flags)
    run_dir = tmp_path / "run"
    with pytest.raises(InjectedFault):
        run_in_process(run_dir, *flags, fault=f"raise:adapt:{ROUNDS + 1}:0")  # after client 2 adapted, before client 3
    assert checkpoint.latest(run_dir).round_idx == ROUNDS - 1 and not (run_dir / "summary.json").exists()
    run_in_process(run_dir, *flags, "--run.resume", "true")
    assert_same_run(run_dir, tmp_path / "uninterrupted")
    adapted = json.loads((run_dir / "summary.json").read_text())["new_client_adapted_client_accuracy"]
    assert set(adapted) == {"2", "3"}
