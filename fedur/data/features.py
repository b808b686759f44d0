"""Every frozen feature computed once: what the image tower gives without a prompt, for every image of a split, in a
memory-mapped float32 file beside the decoded-image cache (fedur/data/cache.py), read instead of running the tower.

The frozen tower's output depends on the image, the preprocess, the tower's weights and how it is computed, none of
which a federated run changes: the zero-shot passes, and every pass of a method whose tower carries no prompt (what
trains is its text side, or what it builds on the features), would compute the same features in every epoch, round
and run. Two kinds, a file each per split: "features", (N, D) unit-norm (`PromptedCLIP.image_features` without a
prompt), and "tokens", (N, 1 + P, D) the unit-norm projected output tokens (`PromptedCLIP.image_tokens`: FedOTP's
patches), built only where a method reads them; and the classes' zero-shot text features, "text", (C, D) (what
`fedur.model.clip.zero_shot_weights` gives, in one batch as it computes them). Stored in float32; the dtype the tower
gave is recorded and restored when the rows are read.

One file per split, kind and model: `<cache_dir>/<dataset>-<split>-<kind>-<model>-<digest>.npy` and a JSON sidecar
written after it (its key, shape, the tower's dtype, a CRC-32 of the rows, the build's time), which marks it complete.
The key covers every image's identity (path, size and modification time, or the bytes of in-memory arrays; the rows
kept after unreadable images were left out), the preprocess, the tower (its architecture and every weight:
`fedur.model.frozen.tower_digest`) and how it was computed (device, precision, kernels, versions, the build's batch
size): another image on disk, model, weights file or random init gives another file. It is built in fixed batches
of BUILD_BATCH consecutive rows, so that a row's features depend on nothing a run chooses: a cold and a warm run, and
runs on any number of ranks, read the same bits. A builder writes a private temporary file and renames it into place
under the file's lock, so an interrupted build leaves nothing that is taken for a file; a file whose size or
checksum does not match its sidecar is damaged: said in one line and built again, never read as features.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedur.data.cache import Progress, check_space, locked, slug, split_key
from fedur.data.datasets import ImageSplit
from fedur.data.loaders import in_batches

FORMAT_VERSION = 1
BUILD_BATCH = 256  # rows per batch of the build: part of the key (a row's features depend on its batch's size)
CHECK_ROWS = 4096  # rows per chunk of the checksum
Kind = Literal["features", "tokens", "text"]  # image features, image tokens, the classes' zero-shot text features
Compute = Callable[[list[np.ndarray]], Iterator[Tensor]]  # batches of rows -> each batch's (b, *row) output, in order
INSTEAD = "data.feature_cache=false to run the image tower on every pass"


@dataclass(frozen=True)
class TowerSpec:
    """What the features depend on beyond the images: the model (`name`, for file names; `digest`: the tower's
    architecture and weights), the preprocess (its printed form) and how the tower is computed (`computed`: device,
    precision, kernels, library versions)."""

    name: str
    digest: str
    preprocess: str
    computed: str


@dataclass(frozen=True)
class Wanted:
    """One feature file: the `kind` rows, each of shape `row`, of the `count` images of `split` of the dataset
    `dataset` (its cache key), whose `identity` is their `split_identity`, through `tower`."""

    dataset: str
    split: str
    kind: Kind
    identity: str
    count: int
    row: tuple[int, ...]
    tower: TowerSpec

    @property
    def key(self) -> str:
        """Hex digest of everything the rows depend on."""
        return feature_key(self.identity, self.kind, self.tower)

    @property
    def what(self) -> str:
        """What a build computes, as its progress says it."""
        return "the classes' zero-shot text features" if self.kind == "text" else f"frozen {self.kind} of {self.split} images"

    @property
    def stem(self) -> str:
        """The file's name without its suffix: <dataset>-<split>-<kind>-<model>-<key[:16]>."""
        return f"{slug(self.dataset)}-{self.split}-{self.kind}-{slug(self.tower.name)}-{self.key[:16]}"


def split_identity(split: ImageSplit, name: str, dataset_key: str, kept: np.ndarray | None = None) -> str:
    """Hex digest of the images of `split` as loaded (before unreadable ones are left out): every path, size and
    modification time, or the bytes of in-memory arrays, and the Pillow version (`cache.split_key`); with `kept`,
    only those rows, in that order."""
    digest = hashlib.sha256(split_key(split, name, dataset_key, None, None).encode())
    if kept is not None and len(kept) != len(split):
        digest.update(np.ascontiguousarray(kept, dtype=np.int64).tobytes())
    return digest.hexdigest()


def feature_key(identity: str, kind: Kind, tower: TowerSpec) -> str:
    """Hex digest of everything a feature file's rows depend on."""
    header = [FORMAT_VERSION, BUILD_BATCH, identity, kind, tower.name, tower.digest, tower.preprocess, tower.computed]
    return hashlib.sha256(json.dumps(header).encode()).hexdigest()


class FeatureFile:
    """A built feature file, mapped read-only; `rows` copies rows out in the dtype the tower gave."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = path, getattr(torch, dtype)
        self._map = np.load(path, mmap_mode="r")
        self.shape: tuple[int, ...] = self._map.shape

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, indices: np.ndarray) -> Tensor:
        """(len(indices), *row): the rows at `indices`, on the CPU."""
        picked = np.ascontiguousarray(self._map[np.asarray(indices, dtype=np.int64)])
        return torch.from_numpy(picked).to(self.dtype)


def open_features(directory: Path, wanted: Wanted, compute: Compute, progress: Progress | None = None,
                  say: Callable[[str], None] | None = None) -> tuple[FeatureFile, bool]:
    """The `wanted` file in `directory`, and whether this call built it: built first when absent or damaged, by
    `compute` over batches of BUILD_BATCH consecutive rows (what one builder does while the others wait on the file's
    lock). `say`: where the line about a damaged file goes (default: stderr)."""
    key, file = wanted.key, directory / wanted.stem
    count, row_shape = wanted.count, wanted.row
    with locked(file):
        record, damage = _checked(file, key, (count, *row_shape))
        if record is not None:
            return FeatureFile(file.with_suffix(".npy"), record["dtype"]), False
        if damage is not None:
            (say or _to_stderr)(f"fedur: the feature cache file {file.with_suffix('.npy')} is damaged ({damage}); "
                                "computing its features again")
            file.with_suffix(".json").unlink()  # until the new file is whole, none is taken for it
        record = _build(file, key, count, row_shape, compute, progress, f"computing {wanted.what}")
        return FeatureFile(file.with_suffix(".npy"), record["dtype"]), True


def _checked(file: Path, key: str, shape: tuple[int, ...]) -> tuple[dict | None, str | None]:
    """(its record, None) for a complete file of `key`; (None, None) for none; (None, what is wrong) for a damaged one."""
    try:
        record = json.loads(file.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(record, dict) or record.get("key") != key:
        return None, None
    npy = file.with_suffix(".npy")
    if not npy.is_file():
        return None, "its .npy file is missing"
    try:
        rows = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as err:  # a truncated or overwritten header, or fewer bytes than it says
        return None, f"it cannot be read: {err}"
    size, expected = npy.stat().st_size, rows.offset + rows.dtype.itemsize * int(np.prod(shape))
    if rows.shape != shape or rows.dtype != np.float32 or size != expected:
        return None, f"{size:,} bytes of shape {rows.shape}, {expected:,} bytes of shape {shape} expected"
    if checksum(rows) != record.get("crc32"):
        return None, "its checksum differs from the one recorded when it was built"
    return record, None


def checksum(rows: np.ndarray) -> int:
    """CRC-32 of the rows' bytes, in file order."""
    crc = 0
    for start in range(0, len(rows), CHECK_ROWS):
        crc = zlib.crc32(np.ascontiguousarray(rows[start:start + CHECK_ROWS]).reshape(-1).view(np.uint8), crc)
    return crc


def _build(file: Path, key: str, count: int, row_shape: tuple[int, ...], compute: Compute, progress: Progress | None,
           what: str) -> dict:
    start = time.perf_counter()
    shape = (count, *row_shape)
    check_space(file.parent, 4 * int(np.prod(shape)), what="the frozen-feature cache", instead=INSTEAD)
    tmp = file.parent / f".{file.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.npy"
    crc, dtype, done = 0, "float32", 0
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        for batch in compute(in_batches(np.arange(count), BUILD_BATCH)):
            if tuple(batch.shape[1:]) != row_shape:
                # internal: the caller's row shape and its compute disagree
                raise ValueError(f"the tower gave rows of shape {tuple(batch.shape[1:])}, expected {row_shape}")
            dtype = str(batch.dtype).removeprefix("torch.")
            rows = batch.detach().float().cpu().numpy()
            out[done:done + len(rows)] = rows
            crc = zlib.crc32(np.ascontiguousarray(rows).reshape(-1).view(np.uint8), crc)
            done += len(rows)
            if progress is not None:
                progress(what, done, count)
        if done != count:
            # internal: the compute must give a row for every planned one
            raise ValueError(f"the tower gave {done} rows for {count} images")
        out.flush()
        del out
        os.replace(tmp, file.with_suffix(".npy"))
    finally:
        tmp.unlink(missing_ok=True)
    record = {"format": FORMAT_VERSION, "key": key, "shape": list(shape), "dtype": dtype, "crc32": crc,
              "seconds": round(time.perf_counter() - start, 1)}
    sidecar = file.parent / f".{file.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.json"
    sidecar.write_text(json.dumps(record, indent=1))
    os.replace(sidecar, file.with_suffix(".json"))  # written last: its presence marks the .npy complete
    return record


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
