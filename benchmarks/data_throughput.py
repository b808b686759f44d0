"""Images per second delivered to the model, with and without the decode-once cache, side by side.

A client's training epoch through fedur's ImageLoader (shuffled, batches of normalised
(B, 3, S, S) float tensors, workers started per epoch as in training) is drained once per
measurement on a stratified subset of an image folder (CIFAR-10 JPEGs by default), for
num_workers 0 and 2:

  jpeg / decode every epoch   paths split + CLIP's preprocess (open, decode, resize, crop, normalise)
  jpeg / cache                fedur.data.cache.prepare_splits: read a decoded row as uint8, then
                              normalise the batch (here on the CPU, as a CPU run does)
  jpeg / cache, uint8 batches the same loader without the batch normalisation: what the host delivers
                              in a GPU run, which normalises the batch on the GPU (not timed here)
  arrays 32 px / ...          the same images held in memory at 32 px (CIFAR-10 through torchvision):
                              PIL resize to the model's size every epoch, or the same cache

It also reports the one-time cost of building the cache (decoding every image once) and its size.

    python benchmarks/data_throughput.py --root /tmp/data --images 5000 --image-size 224
    python benchmarks/data_throughput.py --root DIR --images 8 --image-size 32 --workers 0 --build-workers 0 \
        --repeats 1 --out /tmp/throughput.md         # a smoke: any small image folder, seconds

Each figure is the median of --repeats epochs, with and without the cache alternating so that other
jobs' load falls on both; the spread (min-max) and the median ratio of paired epochs are reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import open_clip
import PIL
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedur.data.cache import CacheOptions, prepare_splits  # noqa: E402
from fedur.data.datasets import ImageSplit, load_imagefolder, stratified_subset  # noqa: E402
from fedur.data.loaders import ImageLoader, epoch_order, in_batches, unchanged  # noqa: E402

DECODE = "decode every epoch"
CACHE = "cache, batch normalised on the CPU"
CACHE_UINT8 = "cache, uint8 batches (GPU run: normalised there)"


def epoch_seconds(split: ImageSplit, transform, normalize, workers: int, batch_size: int, seed: int) -> float:
    """One shuffled epoch over the split through fedur's ImageLoader (its workers started for this epoch, as a
    run's first epoch starts them; later epochs of a run reuse them)."""
    loader = ImageLoader({"train": split}, transform, workers)
    order = epoch_order(len(split), torch.Generator().manual_seed(seed)).numpy()
    start = time.perf_counter()
    seen = 0
    for images in loader.batches("train", in_batches(order, batch_size)):
        seen += len(normalize(images))
    loader.close()
    assert seen == len(split)
    return time.perf_counter() - start


def compare(modes: dict, workers: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """Images per second of each mode over --repeats epochs, the modes alternating within each repeat so
    that load from other jobs on the machine falls on both alike."""
    rates = {mode: [] for mode in modes}
    for seed in range(args.repeats):
        for mode, (split, transform, normalize) in modes.items():
            rates[mode].append(len(split) / epoch_seconds(split, transform, normalize, workers, args.batch_size, seed))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/tmp/data", help="image folder with train/<class>/*")
    parser.add_argument("--images", type=int, default=5000, help="stratified subset of the train images")
    parser.add_argument("--image-size", type=int, default=224, help="the model's input size (ViT-B/32: 224)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", default="0,2", help="DataLoader num_workers values to compare")
    parser.add_argument("--build-workers", type=int, default=2, help="processes decoding into the cache (0: in this one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "data_throughput" / "results.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    dataset = load_imagefolder(args.root)
    keep = stratified_subset(dataset.train.labels, args.images / len(dataset.train), np.random.RandomState(0))
    jpegs = dataset.train.subset(keep)
    preprocess = open_clip.image_transform(args.image_size, is_train=False)  # what open_clip gives ViT-B/32
    small = open_clip.image_transform(32, is_train=False)
    pixels = [np.asarray(small.transforms[0](jpegs.load(i))) for i in range(len(jpegs))]  # resized to 32 px
    arrays = ImageSplit(jpegs.labels, arrays=np.stack(pixels))  # (N, 32, 32, 3)
    workers = [int(w) for w in args.workers.split(",")]

    rows, builds = [], []
    with tempfile.TemporaryDirectory(prefix="fedur-cache-") as cache_dir:
        for label, split in (("jpeg", jpegs), ("arrays 32 px", arrays)):
            start = time.perf_counter()
            prepared = prepare_splits(
                split, ImageSplit(split.labels[:0], paths=[]), preprocess, args.image_size, f"benchmark-{label}",
                CacheOptions(cache=True, cache_dir=cache_dir, workers=args.build_workers),
            )
            build = time.perf_counter() - start
            size = os.path.getsize(prepared.cache_files["train"])
            builds.append((label, build, len(split) / build, size))
            print(f"{label}: cache built in {build:.1f} s ({len(split) / build:,.0f} img/s), {size / 1e6:,.0f} MB")
            modes = {
                DECODE: (split, preprocess, unchanged),
                CACHE: (prepared.train, prepared.transform, prepared.normalize),
                CACHE_UINT8: (prepared.train, prepared.transform, unchanged),
            }
            for w in workers:
                rates = compare(modes, w, args)
                for mode, r in rates.items():
                    speedup = None if mode == DECODE else statistics.median(c / d for c, d in zip(r, rates[DECODE]))
                    rows.append((label, mode, w, statistics.median(r), min(r), max(r), speedup))
                    print(f"{label:13s} {mode:42s} workers {w}: {statistics.median(r):8,.0f} img/s "
                          f"({min(r):,.0f}-{max(r):,.0f}){'' if speedup is None else f' x{speedup:.2f}'}", flush=True)

    write(args, rows, builds, len(jpegs), sys.argv[1:] if argv is None else argv)
    return 0


def write(args: argparse.Namespace, rows: list, builds: list, n: int, argv: list[str]) -> None:
    command = "python benchmarks/data_throughput.py " + " ".join(argv)
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Data throughput: decode every epoch vs the decode-once cache",
        "",
        f"`{command}`",
        "",
        f"{n:,} train images (stratified) from `{args.root}`, model input {args.image_size} px (open_clip's "
        f"preprocess: bicubic resize, center crop, normalise), batch {args.batch_size}, shuffled, one epoch per "
        f"measurement, median of {args.repeats} (min-max), the loadings alternating; the speed-up is the median "
        f"ratio to the paired decode-every-epoch epoch. {os.cpu_count()} CPU cores ({cpu}), shared with other jobs; "
        f"torch {torch.__version__}, Pillow {PIL.__version__}, {time.strftime('%Y-%m-%d')}.",
        "",
        "`jpeg`: the files, decoded by PIL; `arrays 32 px`: the same images held in memory (CIFAR-10 through "
        "torchvision), resized by PIL. `decode every epoch`: CLIP's preprocess per sample (float batches). "
        "`cache`: rows of the decode-once cache as uint8, the batch normalised in the consumer, as a CPU run does. "
        "`uint8 batches`: the same loader without that step, i.e. what the host delivers in a GPU run, which "
        "normalises on the GPU (not timed: no GPU here).",
        "",
        "| images | loading | num_workers | img/s (median) | min-max | cache speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {label} | {mode} | {w} | {m:,.0f} | {lo:,.0f}-{hi:,.0f} | {'' if x is None else f'x{x:.2f}'} |"
        for label, mode, w, m, lo, hi, x in rows
    ]
    lines += ["", "One-time build of the cache (decoding every image once, "
              f"{args.build_workers} worker processes):", "",
              "| images | build s | img/s | size on disk |", "| --- | --- | --- | --- |"]
    lines += [f"| {label} | {s:.1f} | {rate:,.0f} | {size / 1e6:,.0f} MB |" for label, s, rate, size in builds]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
