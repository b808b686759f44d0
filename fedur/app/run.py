"""Running a Config: settle it, launch Fabric, own the run directory (a new run, a restart, a resume), run the
rounds, and release the directory. A refused command leaves the run directory as it found it, its lock file
included: the claim is kept only once every check of the run has passed (fedur/train/ownership.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fedur.app.settle import settle
from fedur.config import Config, new_client_count, result_settings
from fedur.federated.collectives import Collectives
from fedur.launch_env import LaunchEnv, Startup, deterministic_environment, make_fabric, set_determinism, set_threads
from fedur.train import ownership
from fedur.train import run_dir as run_dirs
from fedur.train.preemption import StopRequest


def attack_after(root: Path, fabric) -> None:
    """evaluation.membership_attack: fedur-attack on the finished run, in this process (one rank)."""
    if fabric.world_size > 1:
        print(f"fedur: evaluation.membership_attack runs on one rank; attack this run with `fedur-attack {root}`")
        return
    from fedur.app.attack import attack, table

    members, leak = attack(root, device=str(fabric.device.type))
    print(table(members, leak))


def run(cfg: Config, env: LaunchEnv | None = None, startup: Startup | None = None):
    """Train `cfg`'s federation (settled here, `fedur.app.settle`) and return the round loop's FitResult; None when the
    run directory holds a finished run (nothing to resume). `startup`: this process's clock from its start (the
    entry point's; None: from now). Every rank calls this."""
    from fedur.train.fit import fit

    env, startup = env or LaunchEnv.read(), startup or Startup(time.time())
    settle(cfg, env)
    run = cfg.run
    deterministic_environment(run.deterministic)
    fabric = make_fabric(cfg.fabric, env, run.wait_timeout)
    set_threads(fabric, run.threads)
    set_determinism(run.deterministic, fabric.device)
    root = run_dirs.target(run.output_dir, run.resume)
    if root is None and run.resume is not False:
        raise run_dirs.RunDirError("run.resume needs run.output_dir: the directory of the run to continue (a requeued job "
                                   "names the same one every time, e.g. runs/<job name>-<job id>)")
    if root is None:  # a new run directory, named by rank 0's clock
        root = fabric.broadcast(os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")), src=0)
    run.output_dir = root  # what an error message names
    claim = on_rank_zero(fabric, lambda: ownership.claim(root, create=run.resume in (False, "auto")),
                         ownership.Claim(Path(root)))
    if fabric.world_size > 1:  # every rank looks for rank 0's nonce
        claim.nonce = fabric.broadcast(claim.nonce, src=0)
    try:
        if fabric.world_size > 1 and claim.nonce:  # every node must see the directory rank 0 holds
            ownership.check_shared(Collectives(fabric), root, claim.nonce, fabric.node_rank)
        settings = result_settings(cfg.settings)  # the file settings' digests read once, for the resume and the markers
        run_dir, resume = run_dirs.resolve(root, run.resume, run.force_resume, cfg.federation.num_clients, settings)
        training = cfg.federation.num_clients - new_client_count(cfg.evaluation.new_clients, cfg.federation.num_clients)
        rounds = cfg.server.run_steps(cfg.method.rounds(cfg.federation.rounds), training, cfg.federation.join_rate)
        if resume is not None and resume.round_idx + 1 >= rounds and run_dir.path("summary.json").is_file():
            if fabric.is_global_zero:
                unit = "round(s)" if cfg.server.mode == "sync" else "server step(s)"
                print(f"fedur: {run_dir.root} is finished: all {rounds} {unit} are committed and its summary.json is written; "
                      f"nothing to resume (a larger --federation.rounds trains on from round {resume.round_idx + 2})")
            Collectives(fabric).end_of_run()
            return None
        if run.resume == "auto" and resume is None and run_dir.root.is_dir():  # a job that died before its first commit
            removed = on_rank_zero(fabric, run_dir.clear_without_commit, [])
            if removed and fabric.is_global_zero:
                print(f"fedur: {run_dir.root} holds no committed round; starting over (removed {', '.join(removed)})")
        requeue_on = tuple(run.requeue_on) if fabric.is_global_zero else ()
        with StopRequest(requeue_on=requeue_on, requeue_deadline=run.requeue_deadline) as stop:  # stop after a commit
            result = fit(fabric, cfg, run_dir, resume, stop, settings, checked=claim.keep, startup=startup)
        Collectives(fabric).end_of_run()
        if cfg.evaluation.membership_attack and result.summary is not None and fabric.is_global_zero:
            attack_after(run_dir.root, fabric)
        return result
    finally:
        claim.release()


def on_rank_zero(fabric, action, others):
    """`action()` on rank 0, its result (`others` on the other ranks) or its error raised on every rank: an error
    met on rank 0 alone is then printed once, and no rank waits for the others in a collective."""
    result, error = others, None
    if fabric.is_global_zero:
        try:
            result = action()
        except (run_dirs.RunDirError, OSError) as err:
            error = str(err)
    if fabric.world_size > 1:
        error = fabric.broadcast(error, src=0)
    if error is not None:
        raise run_dirs.RunDirError(error)
    return result
