"""Decode every image once, at the model's input resolution, into a memory-mapped uint8 file.

Decoding a JPEG and resizing it costs ~2 ms per image on one core, once per epoch and per
pseudo-labelling pass; reading a decoded (H, W, 3) row and normalising it costs a fraction of that
(benchmarks/data_throughput.py). The geometric part of CLIP's preprocess (Resize + CenterCrop + RGB)
is applied once and stored. A cached sample leaves its DataLoader as (3, S, S) uint8 (`Pixels`), and
the batch is normalised on the device (`BatchNormalize`, i.e. ToTensor + Normalize), which gives bit
for bit the tensors of `preprocess(image)` at a quarter of the bytes through workers and pinned memory.

One cache file per split: `<cache_dir>/<dataset>-<split>-<size>px-<digest>.npy` (an .npy file, N x H x W x
3 bytes) and a JSON sidecar written after it, which marks the file complete. The digest covers what the
pixels depend on: the dataset key, the split, every image's path, size and mtime (or the bytes of
in-memory arrays), the geometric transform, the image size and the Pillow version. A changed file
list or size gives a new file; a second run, and every other rank, opens the existing one. Builders
write to private temporary files and rename them into place, under an advisory lock, so concurrent
builders never leave a half-written file behind.

Unreadable images are found while decoding, reported by path, and stop the run or are left out
(`CacheOptions(corrupt="skip")`); with the cache off, a verification pass decodes every image once up front and
records its verdict in the same directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import PIL
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, Normalize, ToTensor

from fedur.data.datasets import DataUnavailableError, ImageSplit
from fedur.data.loaders import BatchNormalize, MappedImages, Pixels, unchanged
from fedur.errors import ConfigError

FORMAT_VERSION = 1
DEFAULT_CACHE_DIR = "~/.cache/fedur"
MAX_LISTED = 20  # corrupt paths named in an error; the rest are counted
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass
class PreparedData:
    """The splits to train and evaluate on, with the per-sample transform and the batch step that go with them."""

    train: ImageSplit  # rows of the cache when cached; without the skipped images
    test: ImageSplit
    transform: Callable  # per sample: Pixels when cached ((3, S, S) uint8), else `preprocess` (normalised float)
    normalize: Callable[[Tensor], Tensor]  # per batch, after moving it to the device: BatchNormalize or unchanged
    skipped: list[str]  # paths left out by corrupt="skip", train first (for the run summary)
    train_kept: np.ndarray  # int64 indices into the input train split that were kept
    test_kept: np.ndarray
    cache_files: dict[str, str]  # split -> cache file ({} when not cached)
    built: tuple[str, ...]  # splits decoded by this call (the others were opened or verified before)


@dataclass(frozen=True)
class CacheOptions:
    """How `prepare_splits` reads the images: the `data:` options cache, cache_dir and corrupt_images."""

    cache: bool
    """Decode every image once into a memory-mapped uint8 file at the model's resolution (else: verify only)."""
    cache_dir: str | None
    """Where the cache lives (None: $FEDUR_CACHE_DIR, else ~/.cache/fedur)."""
    corrupt: Literal["stop", "skip"] = "stop"
    """An unreadable image stops the run with its path ("stop") or is left out and listed ("skip")."""
    workers: int | None = None
    """Decoding processes (None: every core this process may use)."""


def prepare_splits(
    train: ImageSplit,
    test: ImageSplit,
    preprocess: Callable,
    image_size: int,
    dataset_key: str,
    options: CacheOptions,
    progress: Progress | None = None,
) -> PreparedData:
    """Check every image once, drop or refuse the unreadable ones, and (with `options.cache`) decode the rest once.

    `preprocess` is the model's (CLIP: Resize, CenterCrop, RGB, ToTensor, Normalize); `dataset_key`
    names the dataset in file names and keys (`Dataset.cache_key`, e.g. "imagefolder:/data/dtd"). Call it
    on rank 0 first (`fabric.rank_zero_first()`): the other ranks then find the files and only open them.
    """
    cache, corrupt = options.cache, options.corrupt
    if corrupt not in ("stop", "skip"):
        # internal: data.corrupt_images' Literal checks it first
        raise ValueError(f"data.corrupt_images must be 'stop' or 'skip', got {corrupt!r}")
    directory = cache_directory(options.cache_dir)
    check_writable(directory)
    geometric, mean, std = split_preprocess(preprocess) if cache else (None, (), ())
    workers = _default_workers() if options.workers is None else options.workers
    out = {
        name: _prepare_split(split, name, geometric, image_size, directory, dataset_key, workers, progress)
        for name, split in (("train", train), ("test", test))
    }
    bad = out["train"].corrupt + out["test"].corrupt
    if corrupt == "stop" and bad:
        raise DataUnavailableError(corrupt_message(bad))
    return PreparedData(
        train=out["train"].split, test=out["test"].split,
        transform=Pixels() if cache else preprocess,
        normalize=BatchNormalize(mean, std) if cache else unchanged,
        skipped=[c["path"] for c in bad],
        train_kept=out["train"].kept, test_kept=out["test"].kept,
        cache_files={name: o.cache_file for name, o in out.items() if o.cache_file},
        built=tuple(name for name, o in out.items() if o.built),
    )


@dataclass
class _Split:
    split: ImageSplit
    kept: np.ndarray
    corrupt: list[dict]
    cache_file: str | None
    built: bool


def _prepare_split(
    split: ImageSplit, name: str, geometric: Compose | None, image_size: int, directory: Path, dataset_key: str,
    workers: int, progress: Progress | None,
) -> _Split:
    """One split without its unreadable images; with `geometric` (cache on), backed by its cache file."""
    cache = geometric is not None
    if not cache and split.paths is None:  # arrays in memory: nothing can fail to decode, nothing to check
        return _Split(split, np.arange(len(split), dtype=np.int64), [], None, False)
    key = split_key(split, name, dataset_key, geometric, image_size if cache else None)
    file = directory / f"{slug(dataset_key)}-{name}-{f'{image_size}px' if cache else 'verified'}-{key[:16]}"
    what = f"decoding {name} images into the cache" if cache else f"checking {name} images"
    record, built = _decoded(split, geometric, image_size, file, key, workers, progress, what)
    corrupt = record["corrupt"]
    kept = np.setdiff1d(np.arange(len(split)), [c["index"] for c in corrupt]).astype(np.int64)
    result = split if len(kept) == len(split) else split.subset(kept)
    if not cache:
        return _Split(result, kept, corrupt, None, built)
    cache_file = str(file.with_suffix(".npy"))
    rows = None if len(kept) == len(split) else kept  # the file holds every input row; corrupt ones are zeros
    return _Split(replace(result, arrays=MappedImages(cache_file, rows)), kept, corrupt, cache_file, built)


def cache_directory(cache_dir: str | None) -> Path:
    """Where the caches live: data.cache_dir, else $FEDUR_CACHE_DIR, else ~/.cache/fedur."""
    return Path(os.path.expanduser(cache_dir or os.environ.get("FEDUR_CACHE_DIR") or DEFAULT_CACHE_DIR))


def split_preprocess(preprocess: Callable) -> tuple[Compose, tuple[float, ...], tuple[float, ...]]:
    """(the PIL steps before ToTensor, Normalize's mean, its std) of a torchvision Compose."""
    steps = list(getattr(preprocess, "transforms", []))
    tensor_at = [i for i, step in enumerate(steps) if isinstance(step, ToTensor)]
    tail = steps[tensor_at[0] + 1 :] if len(tensor_at) == 1 else []
    if len(tail) != 1 or not isinstance(tail[0], Normalize):
        raise ConfigError(
            f"the image cache needs a preprocess of PIL steps, then ToTensor, then Normalize (as open_clip's); "
            f"got {preprocess!r}. Set data.cache=false to decode every image each time."
        )
    return Compose(steps[: tensor_at[0]]), tuple(map(float, tail[0].mean)), tuple(map(float, tail[0].std))


def split_key(
    split: ImageSplit, name: str, dataset_key: str, geometric: Compose | None, image_size: int | None
) -> str:
    """Hex digest of everything the stored pixels (or the verification verdict) depend on."""
    digest = hashlib.sha256()
    header = [FORMAT_VERSION, dataset_key, name, repr(geometric), image_size, PIL.__version__, len(split)]
    digest.update(json.dumps(header).encode())
    if split.paths is not None and split.arrays is None:
        for path in split.paths:
            try:
                stat = os.stat(path)
                digest.update(os.fsencode(path) + f"\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
            except OSError:
                digest.update(os.fsencode(path) + b"\0missing\n")  # reported as unreadable when decoded
    else:
        arrays = np.ascontiguousarray(split.arrays)  # (N, h, w, 3) uint8 in memory
        digest.update(str(arrays.shape).encode())
        digest.update(memoryview(arrays.reshape(-1)))
    return digest.hexdigest()


def corrupt_message(bad: list[dict]) -> str:
    listed = "\n".join(f"  {c['path']}: {c['error']}" for c in bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    return (
        f"{len(bad)} image(s) cannot be read:\n{listed}{more}\n"
        "Replace or remove these files, or set data.corrupt_images=skip to leave them out (they are then "
        "listed in the run's summary)."
    )


def _decoded(
    split: ImageSplit, geometric: Compose | None, image_size: int | None, file: Path, key: str, workers: int,
    progress: Progress | None, what: str,
) -> tuple[dict, bool]:
    """The record of `file` (and with `geometric`, its .npy of pixels), decoding the split first if absent."""
    with locked(file):
        record = _read_record(file, key)
        if record is not None:
            return record, False
        start, corrupt, pixels = time.perf_counter(), [], None
        tmp = file.parent / f".{file.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.npy"
        shape = (len(split), image_size or 0, image_size or 0, 3)
        try:
            if geometric is not None:
                check_space(file.parent, int(np.prod(shape)))
                pixels = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
            decoded = _decode_all(_Decode(split, geometric, image_size), workers, progress, what)
            for index, image, error in decoded:
                if error is not None:
                    corrupt.append({"index": index, "path": _name(split, index), "error": error})
                elif pixels is not None:
                    pixels[index] = image
            if pixels is not None:
                pixels.flush()
                del pixels
                os.replace(tmp, file.with_suffix(".npy"))
        finally:
            tmp.unlink(missing_ok=True)
        record = {"seconds": round(time.perf_counter() - start, 1)}
        record.update({"shape": list(shape)} if geometric is not None else {})
        return _write_record(file, key, record, corrupt), True


class _Decode(Dataset):
    """(index, geometric(image) as (S, S, 3) uint8 or None, None) or (index, None, why it failed)."""

    def __init__(self, split: ImageSplit, geometric: Compose | None, image_size: int | None):
        self.split, self.geometric, self.image_size = split, geometric, image_size

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str | None]:
        try:
            image = self.split.load(index)
            if self.geometric is None:
                return index, None, None
            pixels = np.asarray(self.geometric(image).convert("RGB"))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, DataUnavailableError) as err:
            return index, None, f"{type(err).__name__}: {err}"  # PIL raises SyntaxError for some broken files
        if pixels.shape != (self.image_size, self.image_size, 3):
            # internal: split_preprocess checked the preprocess
            raise ValueError(f"the preprocess gives {pixels.shape} images, expected {self.image_size} square")
        return index, pixels, None


def _decode_all(dataset: _Decode, workers: int, progress: Progress | None, what: str):
    loader = DataLoader(dataset, batch_size=32, num_workers=workers, collate_fn=list)
    done = 0
    for batch in loader:
        yield from batch
        done += len(batch)
        if progress is not None:
            progress(what, done, len(dataset))


def _read_record(file: Path, key: str) -> dict | None:
    sidecar = file.with_suffix(".json")
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != key or ("shape" in record and not file.with_suffix(".npy").is_file()):
        return None
    return record


def _write_record(file: Path, key: str, record: dict, corrupt: list[dict]) -> dict:
    record = {"format": FORMAT_VERSION, "key": key, **record, "corrupt": corrupt}
    tmp = file.parent / f".{file.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.json"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, file.with_suffix(".json"))  # written last: its presence marks the .npy complete
    return record


@contextlib.contextmanager
def locked(file: Path):
    """An exclusive advisory lock per cache file, so that two builders do not decode the same split twice."""
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file.with_suffix(".lock"), "a") as handle:
        with contextlib.suppress(OSError):  # a filesystem without locks: the atomic renames still keep files whole
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check_writable(directory: Path) -> None:
    """The cache folder exists (made if absent) and takes a file: one line naming it, not a traceback from the
    first write (a path that is a file, a folder without write permission, a read-only filesystem)."""
    probe = directory / f".write-test.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as err:
        why = "it is a file, not a folder" if directory.exists() and not directory.is_dir() else err.strerror or err
        raise DataUnavailableError(f"cannot write the image cache in {directory} ({why}); set data.cache_dir to a "
                                   "folder you can write") from err


def check_space(directory: Path, needed: int, what: str = "the image cache",
                instead: str = "data.cache=false to decode every image each time") -> None:
    """One line when `directory`'s disk has not `needed` bytes free (and 5% more), naming what needs them and the
    setting that does without (`instead`)."""
    free = shutil.disk_usage(directory).free
    if free < needed * 1.05:
        raise DataUnavailableError(
            f"{what} needs {needed / 1e9:.1f} GB in {directory} and only {free / 1e9:.1f} GB are free; "
            f"set data.cache_dir to a larger disk, or {instead}"
        )


def _name(split: ImageSplit, index: int) -> str:
    return split.paths[index] if split.paths is not None else f"<array row {index}>"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-60:] or "dataset"


def _default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores <= 1 else min(cores, 32)


def stderr_progress(every_seconds: float = 5.0) -> Progress:
    """A progress callback printing "what: done/total (pct), rate, time left" at most every `every_seconds`."""
    state = {"what": None, "start": 0.0, "last": 0.0}

    def report(what: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if what != state["what"]:
            state.update(what=what, start=now, last=now)
        if now - state["last"] < every_seconds and done < total:
            return
        state["last"] = now
        elapsed = now - state["start"]
        if elapsed < 1.0:  # too short to measure a rate (the whole split took under a second)
            print(f"fedur: {what}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f}%)", file=sys.stderr, flush=True)
            return
        rate = done / elapsed
        print(
            f"fedur: {what}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f}%), {rate:,.0f} img/s, "
            f"{(total - done) / max(rate, 1e-9):,.0f} s left",
            file=sys.stderr, flush=True,
        )

    return report
