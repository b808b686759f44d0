"""A client's peak memory as fedur estimates it before any compute (fedur/train/memory.py), for the big ViTs, and
against peaks measured on the CPU for tiny configs.

Part `vits`: the estimate for ViT-B/32, B/16, L/14 and H/14 (open_clip configs, skeletons on fake tensors: nothing
downloaded, no memory) at a run's batch (optim.batch_size 64, eval_batch_size 256), FedUR's prompts (n_ctx 16, 5
visual tokens in every block but the last) and 100 class names, in fp32 and bf16-mixed, with activation
checkpointing off and on (model.checkpointing).

Part `tiny`: for fedur-tiny and a tiny random-init stand-in of each backbone family (tests/model/families.py), the
estimate (fake tensors) beside two measurements of the same step on real CPU tensors: the live tensor bytes counted
by the same counter (`memory.measure` without the fake mode: checks what the fake pass propagates, shapes, dtypes and
saved activations) and the process's peak RSS over the step (VmHWM reset through /proc/self/clear_refs) less its RSS
before it, plus the weights (an independent, coarser measure: the allocator's and Python's own memory are in it; glibc's malloc_trim first
returns the warm-up step's freed heap, so that the RSS before is what is alive).
FedUR where the family takes visual prompts, PromptFL where it does not; checkpointing off and on.

    python benchmarks/memory_estimate.py                                  # both parts: benchmarks/results/memory_estimate.md
    python benchmarks/memory_estimate.py --parts tiny --families vit --batch 8 --out /tmp/mem   # the smallest
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MIB = 1024**2
VITS = ("ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-H-14")


def trim() -> None:
    """glibc's malloc_trim(0), where there is glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def vits(models: list[str], batch: int, eval_batch: int) -> list[str]:
    from fedur.methods import FedUR
    from fedur.model.clip import register_model_config
    from fedur.train.memory import GIB, ModelSpec, estimate_memory

    register_model_config(None)
    rows = ["| model | precision | checkpointing | training step (GiB) | evaluation (GiB) | weights (GiB) | peak (GiB) | "
            "estimated in (s) |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    classes = tuple(f"class {i}" for i in range(100))
    for name in models:
        for precision in ("32-true", "bf16-mixed"):
            for checkpointing in (False, True):
                started = time.perf_counter()
                e = estimate_memory(ModelSpec(name, classes, 16, 5, None, checkpointing=checkpointing), FedUR(), batch,
                                    eval_batch, precision=precision)
                rows.append(f"| {name} | {precision} | {'on' if checkpointing else 'off'} | {e.train_bytes / GIB:.2f} | "
                            f"{e.eval_bytes / GIB:.2f} | {e.weights_bytes / GIB:.2f} | {e.peak_bytes / GIB:.2f} | "
                            f"{time.perf_counter() - started:.1f} |")
    return rows


def tiny(families: list[str], batch: int, eval_batch: int) -> list[str]:
    sys.path.insert(0, str(REPO))
    from fedur.methods import FedUR, PromptFL
    from fedur.methods.pieces import initial_values
    from fedur.model.classifier import PromptedCLIP
    from fedur.model.clip import load_clip, register_model_config
    from fedur.model.towers import VISUAL_PROMPTS, features
    from fedur.train.memory import ModelSpec, Workload, estimate_memory, measure
    from tests.model.families import config_file

    register_model_config(None)
    folder = Path(tempfile.mkdtemp(prefix="fedur-memory-"))
    rows = ["| family | model | method | checkpointing | estimate: train / eval (MiB) | live tensors, real step: train / eval "
            "(MiB) | estimate / live | peak RSS - RSS before + weights (MiB) |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    classes = tuple(f"class {i}" for i in range(10))
    for family in families:
        name = "fedur-tiny" if family == "fedur-tiny" else config_file(family, folder).stem
        torch.manual_seed(0)
        clip = load_clip(name, None)
        method = FedUR() if VISUAL_PROMPTS in features(clip.model) else PromptFL()
        for checkpointing in (False, True):
            e = estimate_memory(ModelSpec(name, classes, 4, 5, None, checkpointing=checkpointing), method, batch, eval_batch)
            model = PromptedCLIP(clip, list(classes), 4, 5, None, 0.02, 1)
            model.checkpointing = checkpointing
            start = initial_values(method.pieces(), model, 1)
            work = Workload(1, batch, eval_batch, clip.image_size)
            measure(model, method, start, work, "32-true")  # warm: first-call allocations
            gc.collect()
            trim()  # freed heap back to the system: RSS then holds what is alive (the weights), not the warm step's
            before = rss("VmRSS")
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")
            real = measure(model, method, start, work, "32-true")
            rss_peak = rss("VmHWM") - before + real.weights_bytes
            rows.append(f"| {family} | {name} | {type(method).__name__} | {'on' if checkpointing else 'off'} | "
                        f"{e.train_bytes / MIB:.1f} / {e.eval_bytes / MIB:.1f} | {real.train_bytes / MIB:.1f} / "
                        f"{real.eval_bytes / MIB:.1f} | {e.peak_bytes / real.peak_bytes:.3f} | {rss_peak / MIB:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="vits,tiny")
    parser.add_argument("--models", default=",".join(VITS), help="the vits part's open_clip models")
    parser.add_argument("--families", default="fedur-tiny,vit,resnet,siglip,eva02,pe,convnext",
                        help="the tiny part's families (tests/model/families.py; fedur-tiny: the package's)")
    parser.add_argument("--batch", type=int, default=64, help="optim.batch_size")
    parser.add_argument("--eval-batch", type=int, default=256, help="optim.eval_batch_size")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    report = ["# A client's peak memory: estimated before any compute, and measured on the CPU", "",
              f"`python benchmarks/memory_estimate.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
              f"(batch {args.batch}, evaluation batch {args.eval_batch}; a shared CPU, torch {torch.__version__})."]
    if "vits" in parts:
        report += ["", "## The big ViTs (FedUR, 100 classes; estimates)", "", *vits(args.models.split(","), args.batch,
                                                                                      args.eval_batch)]
    if "tiny" in parts:
        report += ["", "## Tiny configs: the estimate against the same step on real CPU tensors (fp32, 10 classes)", "",
                   *tiny(args.families.split(","), args.batch, args.eval_batch)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory_estimate.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
