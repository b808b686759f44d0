"""What a run directory contains, who owns it, and what a new run, a restart and a resume do with it.

Every file or folder a run writes is declared in LAYOUT, and every writer gets its path from
`RunDir.path`, which refuses an undeclared name. So the rules below always cover every output:

- a run directory has one owner, the process that holds its fedur.lock (fedur/train/ownership.py);
- a new run only starts in a directory that does not exist or is empty (but for an unheld fedur.lock);
- `run.resume auto` in a directory without a committed round (a job that died before its first commit)
  clears what fedur wrote there (LAYOUT's entries) and starts over; anything else there stops it;
- a resume continues from the newest committed round (`checkpoints/`, see checkpoint.py) and reads back
  the rest of what it needs: the metrics rows of the committed rounds (metrics.jsonl is cut back to
  them, so that it ends as an uninterrupted run's would) and the zero-shot results (zero_shot.json).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

from fedur.config import DIGEST, FILE_SETTINGS, GROUPS, RESULT_NEUTRAL, file_digest, plugin_described, renamed
from fedur.errors import FedurError
from fedur.evaluation.estimators import DEFAULT as DEFAULT_ESTIMATOR
from fedur.train import checkpoint

LAYOUT: dict[str, str] = {
    "config.yaml": "the resolved settings",
    "config.resumed-at-round-*.yaml": "the settings of a resumed session",
    "metrics.jsonl": "one line per round",
    "summary.json": "final and best accuracies, zero-shot, placement, settings (a finished run)",
    "placement.json": "which rank and node hosts each client",
    "partition.json": "each client's class histogram (train and test) and image ids (federation.partition=file reads it)",
    "partition_train.png": "client x class heatmap of the train split",
    "partition_test.png": "client x class heatmap of the test split",
    "zero_shot.json": "zero-shot CLIP per client and on the whole test set",
    "confusion.json": "the final round's confusion matrix",
    "reliability.png": "the last round's reliability diagram: personal models, the server's, zero-shot CLIP (with test labels)",
    "accuracy_virtual_time.png": "accuracy against the virtual clock (clock.speeds, deadline, drop_rate ...)",
    "tensorboard": "TensorBoard events",
    "csv": "run.loggers csv: scalars.csv, the figures, settings.json",
    "wandb": "run.loggers wandb: the Weights & Biases run (offline unless WANDB_MODE says otherwise)",
    "mlruns": "run.loggers mlflow: the MLflow file store (unless MLFLOW_TRACKING_URI names another)",
    "prompts": "the final prompts: global.pt and client_XXX.pt; chosen/client_XXX.pt, each client's label-free choice",
    "predictions": "data without labels: each client's predicted class per image, client_XXX.csv",
    checkpoint.CHECKPOINTS: "a committed checkpoint after each round",
    "fedur.lock": "the run's owner: held (locked) by the process running it; who that is (pid, host, start)",
}
METRICS, ZERO_SHOT, LOCK = "metrics.jsonl", "zero_shot.json", "fedur.lock"


class RunDirError(FedurError, RuntimeError):
    """The run directory cannot be used as asked; the message says what to do."""


@dataclass
class History:
    """What a resumed run reads back: the metrics rows of its committed rounds and its zero-shot results."""

    rounds: list[dict] = field(default_factory=list)
    zero_shot: dict = field(default_factory=dict)
    first_round: int = 1  # the number the run's files give its first round (0: a run from before rounds counted from 1)


class RunDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        """The path of one of LAYOUT's entries (`name` may also be a file inside a declared folder)."""
        top = name.split("/")[0]
        if not any(fnmatch.fnmatchcase(top, pattern) for pattern in LAYOUT):
            # internal: every writer's name is declared
            raise KeyError(f"{name} is not part of a run directory: declare it in fedur/train/run_dir.py LAYOUT")
        return self.root / name

    def fedur_entries(self) -> tuple[list[str], list[str]]:
        """(names fedur writes, other names) of what the directory holds now, but the lock file."""
        names = sorted(p.name for p in self.root.iterdir() if p.name != LOCK) if self.root.is_dir() else []
        ours = [n for n in names if any(fnmatch.fnmatchcase(n, pattern) for pattern in LAYOUT)]
        return ours, [n for n in names if n not in ours]

    def check_new(self) -> None:
        """A new run needs a directory that does not exist or is empty (but for the lock): no run overwrites another."""
        if self.root.exists() and (not self.root.is_dir() or any(p.name != LOCK for p in self.root.iterdir())):
            hint = " (it holds a checkpoint: add --run.resume true to continue it)" if checkpoint.committed_rounds(self.root) else ""
            raise RunDirError(f"run.output_dir={self.root} already exists and is not empty{hint}; choose a new run.output_dir")

    def clear_without_commit(self) -> list[str]:
        """Remove what a run that died before its first commit left, so that it can start over; refuses,
        removing nothing, when anything fedur does not write is there."""
        ours, foreign = self.fedur_entries()
        if foreign or checkpoint.committed_rounds(self.root):
            raise RunDirError(
                f"{self.root} has no committed checkpoint to resume but holds {', '.join(foreign[:5]) or 'committed rounds'}; "
                "choose a new run.output_dir"
            )
        for name in ours:
            path = self.root / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        return ours

    def history(self, rounds: int, cut: bool, first_round: int = 1) -> History:
        """What a resume after `rounds` committed rounds reads back (its rows numbered from `first_round`, as its
        checkpoint format says); with `cut` (rank 0), metrics.jsonl is cut right after those rows (in place:
        other ranks may read the first bytes meanwhile)."""
        if rounds == 0:
            return History(first_round=first_round)
        path = self.path(METRICS)
        if not path.is_file():
            raise RunDirError(f"cannot resume at round {rounds}: {path} is missing; resume needs the run directory it wrote")
        lines = path.read_bytes().split(b"\n")[:-1]  # the last piece is empty or a partly written line
        if len(lines) < rounds:
            raise RunDirError(
                f"cannot resume at round {rounds}: {path} holds only {len(lines)} complete rounds; the checkpoint is "
                "newer than the metrics, so resume from an earlier checkpoint or start a new run.output_dir"
            )
        rows = [json.loads(line) for line in lines[:rounds]]
        if [r["round"] for r in rows] != list(range(first_round, first_round + rounds)):
            raise RunDirError(f"{path}: rounds {[r['round'] for r in rows]} are not {first_round}..{first_round + rounds - 1} "
                              "in order")
        zero_shot = self.path(ZERO_SHOT)
        if not zero_shot.is_file():
            raise RunDirError(f"cannot resume at round {rounds}: {zero_shot} is missing")
        if cut:
            os.truncate(path, sum(len(line) + 1 for line in lines[:rounds]))
        return History(rows, json.loads(zero_shot.read_text()), first_round)


def resolve(
    output_dir: str | None, resume: bool | str, force: bool, num_clients: int, settings: dict
) -> tuple[RunDir | None, checkpoint.Committed | None]:
    """The run directory (None: a new timestamped one) and the committed round to continue from (None: a
    fresh run), decided before any compute from run.output_dir / run.resume / run.force_resume.

    Refuses: a resume without a run directory or committed round, an unreadable checkpoint, another
    number of clients, and changed result-affecting `settings` (unless `force`).
    """
    if resume is False:
        if output_dir is not None:
            RunDir(output_dir).check_new()
        return (None if output_dir is None else RunDir(output_dir)), None
    if isinstance(resume, str) and resume != "auto":
        if output_dir is not None and Path(output_dir).resolve() != Path(resume).resolve():
            raise RunDirError(f"run.resume={resume} and run.output_dir={output_dir} name different runs; give one")
        if not Path(resume).is_dir():
            raise RunDirError(f"run.resume={resume} does not exist; give the directory of the run to continue")
        output_dir = resume
    if output_dir is None:
        raise RunDirError("run.resume needs run.output_dir: the directory of the run to continue")
    run_dir = RunDir(output_dir)
    committed = checkpoint.latest(run_dir.root)
    if committed is None:
        if resume != "auto":
            raise RunDirError(
                f"no committed checkpoint under {output_dir}/{checkpoint.CHECKPOINTS}/ to resume from "
                "(a run commits one after each round); start a new run instead"
            )
        return run_dir, None  # nothing committed yet: start over (main clears the directory on rank 0)
    if committed.marker.num_clients != num_clients:
        raise RunDirError(
            f"the checkpoint in {committed.folder} has {committed.marker.num_clients} clients, "
            f"federation.num_clients is {num_clients}"
        )
    changed = settings_diff(committed.marker.settings, settings)
    if changed and not force:
        raise RunDirError(
            f"settings that change results differ from the checkpoint in {committed.folder}:\n  "
            + "\n  ".join(changed) + "\nrestore them, or pass --run.force_resume true to continue anyway"
        )
    checkpoint.verify(committed, num_clients)
    return run_dir, committed


ABSENT = "<absent>"

# fedur's own settings added after runs were made: a checkpoint written before one existed ran with this value (the
# behaviour the setting now names), so it resumes, and stays in its table, when the value now is the same. A plugin's
# (method.*, labeller.*, dataset.*) are its class's to say: its `added_settings` (`added_settings` below).
ADDED_SETTINGS = {
    "optim.schedule": "cosine",
    "federation.partition_file": None,
    "evaluation.new_clients": 0,
    "evaluation.new_client_epochs": None,
    "evaluation.new_client_labels": "arrival",
    "optim.cosine_epochs": None,
    "model.ctx_suffix": "",
    "optim.warmup_epochs": 0,
    "optim.warmup_lr": 1e-5,
    "privacy.mode": "none",
    "data.validation_fraction": 0.0,
    "evaluation.select": "none",
    "evaluation.estimator": DEFAULT_ESTIMATOR,
    **{f"{group}.{f.name}": f.default for group in ("clock", "adversary", "aggregator", "server")  # clients that drop,
       for f in fields(GROUPS[group]) if f"{group}.{f.name}" not in RESULT_NEUTRAL},  # lag, misbehave, the aggregator
    # and when the server steps: their defaults
}


def added_settings(now: dict) -> dict:
    """ADDED_SETTINGS and the `added_settings` of the plugin classes the flat settings `now` name."""
    return {**ADDED_SETTINGS, **plugin_described(now, "added_settings")}


def changed_settings(saved: dict, now: dict) -> dict[str, tuple]:
    """{key: (saved value, value now)} of every flat setting that differs (ABSENT where one side lacks it; a
    checkpoint older than a setting counts as its `added_settings` value). Values are compared as JSON stores them
    (a tuple now equals the list a marker holds)."""
    now = json.loads(json.dumps(now))
    saved = {**{key: value for key, value in added_settings(now).items() if key in now}, **renamed(saved)}
    for key in FILE_SETTINGS:  # a checkpoint from before file settings were digests holds the path: read it now
        if isinstance(saved.get(key), str) and not saved[key].startswith(DIGEST):
            saved[key] = file_digest(saved[key])
    keys = sorted(set(saved) | set(now))
    return {key: (saved.get(key, ABSENT), now.get(key, ABSENT)) for key in keys if saved.get(key, ABSENT) != now.get(key, ABSENT)}


def settings_diff(saved: dict, now: dict) -> list[str]:
    """`key: old (checkpoint) -> new (now)` for every setting that differs (a file setting: its content changed)."""
    lines = []
    for key, (old, new) in changed_settings(saved, now).items():
        if key in FILE_SETTINGS and isinstance(old, str) and not old.startswith(DIGEST) and new != ABSENT:
            lines.append(f"{key}: the checkpoint recorded the file {old}, which cannot be read now to compare its content; "
                         "give that file back (or the same content at that path)")
        elif key in FILE_SETTINGS and isinstance(old, str) and isinstance(new, str) and DIGEST in old + new:
            lines.append(f"{key}: the file's content differs from the checkpoint's ({_short(old)} (checkpoint) -> "
                         f"{_short(new)} (now))")
        else:
            lines.append(f"{key}: {old!r} (checkpoint) -> {new!r} (now)")
    return lines


def _short(value: str) -> str:
    return value[: len(DIGEST) + 12] if value.startswith(DIGEST) else repr(value)


@contextlib.contextmanager
def writing(path: str | Path):
    """Writes to `path` inside: an OSError that names no file (a full disk met by a file object's write, by
    TensorBoard's writer) names `path`, so that the run's one-line error says which file could not be written; the
    ValueError Lightning's TensorBoardLogger raises from a failed add_scalar is its OSError again."""
    try:
        yield
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err  # machine: a write that failed
    except ValueError as err:  # Lightning's TensorBoardLogger.log_metrics wraps any add_scalar failure in a ValueError
        cause = err.__cause__
        if not isinstance(cause, OSError):
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), cause.filename or str(path)) from cause  # machine: ditto


def target(output_dir: str | None, resume: bool | str) -> str | None:
    """The run directory's path as run.output_dir and run.resume give it (None: a new timestamped one)."""
    if isinstance(resume, str) and resume != "auto" and output_dir is None:
        return resume
    return output_dir
