"""Per-round checkpoints of the whole federated state, committed atomically: the on-disk format, in one place.

    <run_dir>/checkpoints/round_00003/client_000.pt ...   one file per client (ClientState.state_dict), written
                                                          by the rank that hosts it
                                      global.pt           what every rank knows (RunState.state_dict, rank 0)
                                      COMMITTED.json      the commit marker (Marker), written by rank 0 after a
                                                          barrier, last

Rounds are counted from 1 in every file (as on the console and in TensorBoard): round_00003 holds the state after
the third round, and its marker says "round": 3 (format 2). Runs from before (format 1) counted from 0 there
(round_00002 was the state after the third round); they stay readable and resumable, in their own numbering.

A round directory without COMMITTED.json is an interrupted save and is ignored: resuming uses the
newest committed round. Files are written to a temporary name and renamed, and load with
`weights_only=True` (tensors, numbers, strings, lists and dicts only; nothing is unpickled as code).
Client files do not depend on the placement of clients on ranks, so a run may resume on another
number of ranks.

Reading markers (`committed_rounds`, `latest`) needs no torch: `fedur-tables` reads them for every run
of a grid.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedur.errors import FedurError
from fedur.train import faults

if TYPE_CHECKING:
    from torch import Tensor

    from fedur.federated.client import ClientState
    from fedur.train.host import Host
    from fedur.train.state import RunState

CHECKPOINTS = "checkpoints"
MARKER = "COMMITTED.json"
FORMAT = 2  # rounds counted from 1 in folder names and markers; 1: from 0 (runs from before)
FORMATS = (1, 2)


def first_round(format: int) -> int:
    """The number a run of this checkpoint format gives its first round in its files (metrics.jsonl, folders)."""
    return 0 if format == 1 else 1


class CheckpointError(FedurError, RuntimeError):
    """A checkpoint is missing, incomplete or unreadable; the message names the file and what to do."""


@dataclass(frozen=True)
class Marker:
    """COMMITTED.json: what a committed round is and which settings made it."""

    round_idx: int  # the index (from 0) of the last round the checkpoint contains
    num_clients: int
    world_size: int
    settings: dict[str, Any] = field(default_factory=dict)  # the result-affecting settings, flat (config.result_settings)
    tensorboard: str = "tensorboard"  # the TensorBoard folder of the run
    format: int = FORMAT  # a resumed run keeps the format (the numbering) it started with

    @property
    def number(self) -> int:
        """The round's number in the run's files: its folder round_NNNNN and the marker's "round"."""
        return self.round_idx + first_round(self.format)

    def to_json(self) -> str:
        settings_hash = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()
        content = {"format": self.format, "round": self.number, "num_clients": self.num_clients,
                   "world_size": self.world_size, "settings": self.settings, "tensorboard": self.tensorboard,
                   "settings_sha256": settings_hash}
        return json.dumps(content, indent=1) + "\n"

    @classmethod
    def read(cls, path: Path, number: int) -> Marker:
        """The marker of the round folder numbered `number`."""
        try:
            content = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path} is unreadable ({err}); delete {Path(path).parent} to resume from the round before") from err
        if not isinstance(content, dict) or content.get("format") not in FORMATS or content.get("round") != number:
            raise CheckpointError(f"{path} is not a fedur checkpoint marker of round {number}")
        return cls(number - first_round(content["format"]), content["num_clients"], content.get("world_size", 0),
                   content.get("settings", {}), content.get("tensorboard", "tensorboard"), content["format"])


@dataclass
class Committed:
    round_idx: int  # the index (from 0) of the last round the checkpoint contains: round round_idx + 1 on the console
    folder: Path
    marker: Marker


def round_folder(run_dir: Path, number: int) -> Path:
    """The folder of the round numbered `number` in the run's files (Marker.number)."""
    return Path(run_dir) / CHECKPOINTS / f"round_{number:05d}"


def client_file(folder: Path, client_id: int) -> Path:
    return folder / f"client_{client_id:03d}.pt"


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save(obj, tmp)
    os.replace(tmp, path)


def save(obj, path: Path) -> None:
    """torch.save, with a failed write (torch reports a full disk as a RuntimeError without the file's name) an
    OSError naming the file; what was partly written is removed."""
    import torch

    try:
        torch.save(obj, path)
    except (OSError, RuntimeError) as err:
        full = _disk_full(Path(path).parent)  # before the partial file goes and frees its blocks
        Path(path).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename:
            raise
        # machine: a write that failed
        raise OSError(errno.ENOSPC if full else errno.EIO, os.strerror(errno.ENOSPC) if full else str(err).splitlines()[0],
                      str(path)) from err


def _disk_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free == 0
    except OSError:
        return False


def atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
    except OSError as err:  # a full disk meets the write, whose error names no file
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err  # machine: a write that failed
    os.replace(tmp, path)


def clear_uncommitted(run_dir: Path, number: int) -> None:
    """Rank 0, before a save: remove what an interrupted save of this round left behind."""
    folder = round_folder(run_dir, number)
    if folder.exists() and not (folder / MARKER).exists():
        shutil.rmtree(folder)


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` committed rounds; drop older rounds, committed or not."""
    committed = committed_rounds(run_dir)
    if len(committed) <= keep:
        return
    oldest_kept = committed[-keep][0]
    for folder in sorted((Path(run_dir) / CHECKPOINTS).glob("round_*")):
        if _round_of(folder) is not None and _round_of(folder) < oldest_kept:
            shutil.rmtree(folder, ignore_errors=True)


def committed_rounds(run_dir: Path) -> list[tuple[int, Path]]:
    """(round number in the folder's name, folder) of every committed round of a run directory, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    rounds = [(_round_of(f), f) for f in root.glob("round_*") if (f / MARKER).is_file()]
    return sorted((r, f) for r, f in rounds if r is not None)


def latest(run_dir: Path) -> Committed | None:
    """The newest committed round of a run directory, its marker read and checked (no torch needed)."""
    rounds = committed_rounds(run_dir)
    if not rounds:
        return None
    number, folder = rounds[-1]
    marker = Marker.read(folder / MARKER, number)
    return Committed(marker.round_idx, folder, marker)


def load(path: Path) -> dict:
    """A checkpoint file, or a CheckpointError naming it."""
    import torch

    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing from a committed round; delete {path.parent} to resume "
                              "from the round before")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint file {path} is corrupt ({type(err).__name__}: {err}); "
            f"delete {path.parent} to resume from the round before"
        ) from err


def verify(committed: Committed, num_clients: int) -> None:
    """Every file of the committed round loads (before any compute, on every rank)."""
    load(committed.folder / "global.pt")
    for client_id in range(num_clients):
        load(client_file(committed.folder, client_id))


def save_round(host: Host, run_dir: Path, state: RunState, marker: Marker, keep: int) -> None:
    """Each rank writes its own clients; after a barrier rank 0 writes what every rank knows (global.pt), commits,
    prunes."""
    fabric, collectives, round_idx = host.fabric, host.collectives, marker.round_idx
    if fabric.is_global_zero:
        clear_uncommitted(run_dir, marker.number)
    collectives.barrier("checkpoint: prepare")
    folder = round_folder(run_dir, marker.number)
    folder.mkdir(parents=True, exist_ok=True)
    for client in host.clients:
        atomic_save(client.state_dict(), client_file(folder, client.client_id))
    faults.point("commit", round_idx, fabric.global_rank)
    collectives.barrier("checkpoint: clients written")
    if fabric.is_global_zero:
        atomic_save(state.state_dict(), folder / "global.pt")
        atomic_write_text(marker.to_json(), folder / MARKER)  # the commit: written last
        prune(run_dir, keep)


def restore(committed: Committed, clients: list[ClientState]) -> dict:
    """Load this rank's clients from the committed round; returns what every rank knew (global.pt)."""
    from fedur.federated.client import ClientStateError

    for client in clients:
        try:
            client.load_state_dict(load(client_file(committed.folder, client.client_id)))
        except ClientStateError as err:
            raise CheckpointError(str(err)) from err
    return load(committed.folder / "global.pt")


def save_prompts(folder: Path, shared: dict[str, Tensor], clients: list[ClientState], write_shared: bool) -> None:
    """The final model of every client: global.pt, the shared pieces (rank 0), and client_XXX.pt (written by
    the rank that hosts it), what each client classifies with, by name: its prompts, and the method's own
    per-client tensors where it keeps some (pFedPrompt's cache, GDA-U's classifier)."""
    folder.mkdir(exist_ok=True)
    if write_shared and shared:
        save({name: t.cpu() for name, t in shared.items()}, folder / "global.pt")
    for client in clients:
        state = {"client_id": client.client_id, **{name: t.cpu() for name, t in client.pieces.items()}}
        state.update({name: t.cpu() for name, t in client.extra.items() if name not in state})
        save(state, folder / f"client_{client.client_id:03d}.pt")


def _round_of(folder: Path) -> int | None:
    try:
        return int(folder.name.removeprefix("round_"))
    except ValueError:
        return None
