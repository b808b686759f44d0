"""Who owns a run directory: one process at a time, and every node seeing the same one.

- **One owner.** Rank 0 holds an exclusive lock (`flock`) on RUN/fedur.lock for the run's life (`claim`), taken
  before anything is loaded. The operating system releases it when the process ends in any way, SIGKILL
  included, so a killed run leaves no stale lock; while it is held, a second run or resume into the directory
  is refused in one line naming the holder (pid, host, start, command), and nothing on disk changes (a claim
  that is not kept puts the lock file back as it was). Processes forked from the owner (loader workers) close
  their copy of the lock at once, so the lock ends with the owner, not seconds later with its workers.
- **One directory for every node.** Rank 0 writes a nonce into the lock file; every rank reads it before
  anything is loaded (`check_shared`). A node whose run.output_dir is other storage (its own /tmp) would put
  its clients' files where nothing commits or prunes them: the run stops on every rank, naming the node.
- **Writable.** A run directory, or a folder of it, that cannot be written is refused before any compute.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fedur.train import checkpoint
from fedur.train.run_dir import LAYOUT, LOCK, METRICS, RunDirError

if TYPE_CHECKING:
    from fedur.federated.collectives import Collectives

HOST_BYTES = 64  # a host name as the shared-storage check exchanges it
ATTEMPTS = 3  # a claim that lost a race with a releasing owner tries again


class Claim:
    """Rank 0's hold on a run directory: an exclusive lock on its fedur.lock, which names the owner and carries
    the nonce the other ranks look for (`check_shared`). Other ranks hold an empty Claim (fd None)."""

    def __init__(self, root: Path, fd: int | None = None, created: Path | None = None, nonce: str = "",
                 previous: tuple[bytes, os.stat_result] | None = None) -> None:
        self.root, self.fd, self.created, self.nonce = root, fd, created, nonce  # created: the topmost folder made
        self.previous, self.kept = previous, False  # the lock file's content and times before this claim
        if fd is not None:  # a forked child (a loader worker) must not keep the lock alive after the owner
            os.register_at_fork(after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def keep(self) -> None:
        """The run goes ahead (its settings and checkpoint checked): the lock file keeps naming it as the owner."""
        self.kept = True

    def release(self) -> None:
        """Give the directory up. A claim that was not kept (the run was refused) puts the lock file back as it
        was, or removes it if it made it; a directory it created that holds nothing but the lock is removed, with
        the parent folders it created. So a refused run or resume changes nothing on disk, and a run that failed
        before writing anything leaves nothing behind. Done while the lock is held, then the lock goes."""
        if self.fd is None:
            return
        if not self.kept and self.previous is not None:
            content, stat = self.previous
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, content, 0)
            os.utime(self.fd, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        lock_only = [p.name for p in self.root.iterdir()] == [LOCK]
        if (not self.kept and self.previous is None) or (self.created is not None and lock_only):
            (self.root / LOCK).unlink(missing_ok=True)
            folder = self.root if self.created is not None else None
            with contextlib.suppress(OSError):  # a folder that is not empty stays
                while folder is not None:
                    folder.rmdir()
                    folder = None if folder == self.created else folder.parent
        os.close(self.fd)  # the lock goes with the descriptor
        self.fd = None


def claim(root: str | Path, create: bool) -> Claim:
    """Take ownership of the run directory `root` (rank 0, before any compute), creating it when `create` and it
    does not exist (a resume of a directory that does not exist gets an empty Claim: `resolve` says why it
    cannot resume). Refuses, as a RunDirError: a directory another live process holds, one that cannot be
    written, a file where the directory should be."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise RunDirError(f"run.output_dir={root} is a file, not a directory; choose a new run.output_dir")
    if not root.is_dir() and not create:
        return Claim(root)
    created = next((p for p in reversed([root, *root.parents]) if not p.exists()), None)  # the topmost one to make
    for _ in range(ATTEMPTS):
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunDirError(f"run.output_dir={root} cannot be written ({err.strerror}); choose a directory you can "
                              "write to, or fix its permissions") from err
        try:
            _lock(fd, root)
            if os.path.exists(root / LOCK) and os.path.samestat(os.fstat(fd), os.stat(root / LOCK)):
                break  # the lock file we hold is the one in the directory (not one a releasing owner removed)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    else:
        raise RunDirError(f"run.output_dir={root}: another process keeps claiming and releasing it; try again")
    try:
        stat = os.fstat(fd)
        previous = (os.pread(fd, stat.st_size, 0), stat) if stat.st_size else None
        nonce = secrets.token_hex(8)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "nonce": nonce, "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)  # other nodes read it next (check_shared)
    except OSError as err:
        os.close(fd)
        raise RunDirError(f"run.output_dir={root} cannot be written ({err.strerror}); choose a directory you can "
                          "write to, or fix its permissions") from err
    claimed = Claim(root, fd, created, nonce, previous)
    unwritable = read_only(root)
    if unwritable:
        claimed.release()
        raise RunDirError(f"run.output_dir={root} has folders or files fedur cannot write: {', '.join(unwritable[:5])}"
                          f"{' ...' if len(unwritable) > 5 else ''}; fix their permissions (or the mount), or choose another "
                          "run.output_dir")
    return claimed


def read_only(root: Path) -> list[str]:
    """What a run in `root` would write into (the directory, the folders of its LAYOUT and the round folders,
    metrics.jsonl it appends to) and cannot: checked before any compute, so that a read-only folder does not end
    a run after its first round. Folders fedur does not write are not looked into."""
    folders = [root / name for name in LAYOUT if "*" not in name and (root / name).is_dir()]
    rounds = [folder for folder in (root / checkpoint.CHECKPOINTS).glob("round_*") if folder.is_dir()]
    paths = [root, *folders, *rounds, root / METRICS]
    return [str(p) for p in paths if p.exists() and not os.access(p, os.W_OK)]


def _lock(fd: int, root: Path) -> None:
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock, the rest works
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        raise RunDirError(f"run.output_dir={root} is in use by {owner(root)}; wait for that run to end (or stop it), "
                          "or choose another run.output_dir") from err
    except OSError as err:  # a file system without locks (some NFS or Lustre mounts): say so, go on
        if err.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise RunDirError(f"run.output_dir={root}: its lock cannot be taken ({err.strerror})") from err
        print(f"fedur: warning: {root} is on a file system without file locks ({err.strerror}): nothing stops a "
              "second run from writing into it at the same time", file=sys.stderr)


def owner(root: str | Path) -> str:
    """Who holds the run directory, as its fedur.lock says."""
    try:
        record = json.loads((Path(root) / LOCK).read_text())
        return f"process {record['pid']} on host {record['host']} (started {record['started']}: {record['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its fedur.lock does not say which)"


def lock_nonce(root: str | Path) -> str | None:
    """The nonce rank 0 wrote into the run directory's fedur.lock (None: there is no readable one here)."""
    try:
        return json.loads((Path(root) / LOCK).read_text()).get("nonce")
    except (OSError, ValueError, AttributeError):
        return None


def check_shared(collectives: Collectives, root: str | Path, nonce: str, node_rank: int, wait: float = 5.0) -> None:
    """Every rank reads the nonce rank 0 wrote into the run directory (for up to `wait` seconds: a network file
    system may show another node's write late); any rank that does not find it (its node sees another directory
    under the same path) stops the run on every rank, in one line naming its node. Every rank calls this."""
    import torch

    deadline = time.monotonic() + wait
    while (sees := lock_nonce(root) == nonce) is False and time.monotonic() < deadline:
        time.sleep(0.5)
    host = socket.gethostname().encode()[:HOST_BYTES]
    row = torch.tensor([int(sees), node_rank, len(host), *host.ljust(HOST_BYTES, b"\0")], dtype=torch.int64, device="cpu")
    every = collectives.gather_ranks(row, what="run directory check")
    blind = {}
    for rank, (ok, node, length, *name) in enumerate(every.tolist()):
        if not ok:
            blind.setdefault((node, bytes(name[:length]).decode(errors="replace")), []).append(rank)
    if blind:
        nodes = "; ".join(f"node {node} ({host}, ranks {', '.join(map(str, ranks))})" for (node, host), ranks in blind.items())
        raise RunDirError(f"run.output_dir={root} is not the same directory on every node: {nodes} cannot see what rank 0 "
                          "wrote there; put run.output_dir on storage every node shares (not a node's own /tmp)")

