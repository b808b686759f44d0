"""The `fedur` command: parse the command line, run it, and report what stops it. Launchers that take a script
run it as fedur/main.py (`fabric run --devices 8 fedur/main.py --config configs/cub.yaml`), which calls `main` here.

The command line is fedur/app/cli.py's, running it fedur/app/run.py's. Here is the process's error policy: an error the
user can fix (fedur.errors.FedurError) is one line from rank 0 and exit status 2; a failure of the machine (a peer
that died, a full disk, device memory) is one line from the rank that met it and exit status 1, at once.
"""

from __future__ import annotations

import time

ENTERED = time.time()  # before any import of fedur's: where a process without /proc counts its start from

import errno  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

from fedur.errors import FedurError  # noqa: E402
from fedur.launch_env import LaunchEnv, Startup, stop_with_launcher  # noqa: E402

ERROR_GRACE_SECONDS = 5.0


def check_data(cfg) -> None:
    """`--check_data`: load the dataset as configured and print its counts; nothing is trained or written."""
    from fedur.data.inspect import dataset_report
    from fedur.train.setup import load_data

    print(dataset_report(load_data(cfg)))  # every dataset checks its layout first


def main(argv: list[str] | None = None, parser=None, entered: float | None = None) -> None:
    """`fedur ARGS`: one run. `parser`: one from fedur.app.cli.build_parser() to reuse across many calls in one process
    (tests/run_many.py), a third of a second each. `entered`: when the process began running Python (fedur/main.py's
    first line; None: when this module was imported)."""
    sys.stdout.reconfigure(line_buffering=True)  # progress lines reach log files as they happen
    env = LaunchEnv.read()
    stop_with_launcher()
    threading.excepthook = quiet_write_errors
    cfg, startup = None, Startup.now(ENTERED if entered is None else entered)
    try:
        from fedur.app.cli import parse_args
        from fedur.app.run import run
        from fedur.train import fit  # noqa: F401  (what a run imports, timed: summary.json's startup_seconds)

        startup.imported = time.time()
        cfg, namespace = parse_args(argv, parser)
        if namespace.check_data:
            return check_data(cfg)
        run(cfg, env, startup)
    except FedurError as err:
        if env.is_rank_zero:  # every rank meets the same error: print it once
            print(f"fedur: error: {err.one_line()}", file=sys.stderr, flush=True)
        else:  # the launcher stops every rank when the first one exits: let rank 0 print first
            time.sleep(ERROR_GRACE_SECONDS)
        sys.exit(2)
    except Exception as err:  # the machine's failures, each in one line of this rank's
        message = machine_failure(err, cfg)
        if message is None:
            raise
        fail(message)


def machine_failure(err: Exception, cfg) -> str | None:
    """The one line that reports a failure of the machine rather than of the settings (None: not one; its traceback
    says more): a broken process group, a file the run could not write, device memory, a kernel without a
    deterministic implementation."""
    import torch

    from fedur.federated.collectives import CollectiveError, first_line

    if isinstance(err, CollectiveError):
        return str(err)  # the process group is broken: do not wait in its teardown
    if isinstance(err, OSError):  # a file the run writes: a full disk, a quota, a read-only or vanished folder
        if err.errno is None:  # not the system's (an image library's, a re-raised worker's): its traceback says more
            return None
        return write_error(err, None if cfg is None else cfg.run.output_dir)
    if isinstance(err, torch.OutOfMemoryError):
        return (f"rank {os.environ.get('RANK', '0')} ran out of device memory ({first_line(err)}); a smaller "
                "optim.batch_size, optim.eval_batch_size or run.clients_per_step, or fewer clients per rank, need less")
    if isinstance(err, RuntimeError) and "deterministic" in str(err) and "use_deterministic_algorithms" in str(err):
        return (f"{first_line(err)} (run.deterministic true); --run.deterministic false runs without it, and results "
                "then vary in the last bits")
    return None


def fail(message: str) -> None:
    """A failure of this rank, in one line; exits at once (peers learn of it through the heartbeat)."""
    print(f"fedur: error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def write_error(err: OSError, output_dir: str | None) -> str:
    """A file the run could not write, what is intact, and how to go on."""
    space = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    writing = space or err.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
    what = f"{'could not write' if writing else 'failed on'} {err.filename or 'a file'} ({err.strerror or err})"
    committed = checkpoint_latest(output_dir)
    if committed is None:
        return f"{what}; no round is committed yet: fix that, then start again"
    fix = "free space (or move the run directory to where there is some)" if space else "fix that"
    return (f"{what}; the last committed round ({committed.round_idx + 1}) in {committed.folder.parent} is intact: "
            f"{fix} and continue it with --run.resume true")


def checkpoint_latest(output_dir: str | None):
    from fedur.train import checkpoint

    try:
        return None if output_dir is None else checkpoint.latest(Path(output_dir))
    except (OSError, FedurError):
        return None


def quiet_write_errors(args) -> None:
    """A thread that fails to write (TensorBoard's event writer on a full disk) says nothing: the main thread meets
    the same error at its next write and reports it in one line (`write_error`)."""
    if issubclass(args.exc_type, OSError):
        return
    threading.__excepthook__(args)


if __name__ == "__main__":
    main()
