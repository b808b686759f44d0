"""What a federated round costs, and how far it is from its compute floor.

Per model (ViT-B/32, fedur-tiny, fedur-demo; random init, nothing downloaded) and class count (10, 100,
200 class names of varied token lengths), with the run's default prompts (n_ctx 16, 5 visual tokens in
all blocks but the last), on random images already on the device:

  text      the text tower's forward + backward per optimizer step, the plain path
            (`encode_text_embeddings`) and the shared-prefix path (`encode_text_shared_prefix`)
            alternating; their time ratio; FLOPs of both; token counts
  train     prompted training forward + backward at batch 64 (`PromptedCLIP.forward`, cross-entropy,
            backward; no optimizer step), with `model.shared_prefix_text` off and on, alternating:
            images/s, FLOPs per step, achieved FLOP rate as a fraction of the measured matmul rate, peak
            memory, and fedur's estimate of it made before any compute (fedur/train/memory.py: the same step on
            fake tensors)
  eval      pseudo-labelling / evaluation forward, no grad, batch 256 (the text side computed once per
            pass, as the round loop does): images/s, FLOPs, fraction of the matmul rate, peak memory
  bytes     what each client sends per round: the visual prompt (float32) plus, in a refresh round, the
            class histograms (int64, two of C for cooperative selection), as fedur/train/fit.py counts
  round     whole runs of `python -m fedur.main` (10 clients, ~500 train + 100 test generated images, 1
            local epoch, a refresh every round), per-round `round_seconds` and `phase_seconds` from
            <run>/metrics.jsonl, against the compute floor: the images each phase puts through the towers
            (partition.json, the selected counts) x the per-image cost at full batch, measured by the same
            invocation just before the runs (so under the same load). Each configuration runs twice, back to
            back, with `--evaluation.global_model true` and `false` (--round-global): the evaluate phase of
            both and their ratio. And each run's time before round 1 as summary.json's `startup_seconds` splits
            it (imports, setup, zero_shot, other, total; null in the JSON, "not recorded" in the Markdown, where
            the fedur that ran does not write it)
  methods   (not in the default --parts) whole runs as `round`'s, one per method (every one with rounds, or
            --methods), FedUR first: each method's round and phases in seconds and its round's ratio to FedUR's

What a client trains is the method's: FedUR's pieces (a deep visual prompt, a text context, their declared
initial values) and its hooks for the text side and the logits, as the round loop uses them.

The matmul rate is measured on the spot: fp32 2048^3 on CPU, bf16 8192^3 on CUDA. FLOPs come from
torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions, attention). Peak memory: the process's
peak RSS (VmHWM, reset through /proc/self/clear_refs) on CPU, torch.cuda.max_memory_allocated on CUDA.
Timed calls alternate between the settings compared so that load from other jobs falls on both; every
figure is a median. Precision: fp32 on CPU, bf16 autocast on CUDA (as fedur's `fabric.precision auto`).

    python benchmarks/round_cost.py --quick                                    # CPU, small, < 2 min
    python benchmarks/round_cost.py --smoke --parts text,train,eval,bytes      # does it run: seconds, no measurement
    python benchmarks/round_cost.py --models fedur-tiny,fedur-demo             # every part, a few minutes
    python benchmarks/round_cost.py --device cuda                              # see benchmarks/gpu_round_cost.sh
    python benchmarks/round_cost.py --parts methods --models ViT-B-32          # every method's round beside FedUR's

Results go to <out>/<device>[-quick|-smoke].json and .md (default out: benchmarks/results/round_cost/). With
--merge, an invocation adds to the JSON already there (parts measured in several shorter runs); the
Markdown lists every contributing command line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fedur.methods import FedUR  # noqa: E402
from fedur.methods.base import shared_names  # noqa: E402
from fedur.methods.pieces import initial_values  # noqa: E402
from fedur.metrics import round_numbers  # noqa: E402
from fedur.model.classifier import PromptedCLIP  # noqa: E402
from fedur.model.clip import encode_text_embeddings, load_clip  # noqa: E402
from fedur.model.text_tower import encode_text_shared_prefix  # noqa: E402

CIFAR100 = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
MODIFIERS = ["red", "dark green", "light blue", "striped", "tiny", "old rusty", "black and white", "golden", "wild",
             "snow covered"]
STEP_OPTIONS = ("off", "on")  # shared-prefix text tower
# What a client trains is the method's (PromptedCLIP holds no client's pieces): the run's default method, FedUR, whose
# hooks form the text side and the logits here as the round loop does (a deep visual prompt, a text context).
METHOD = FedUR()
PHASES = ("refresh", "train", "aggregate", "evaluate")  # metrics.jsonl phase_seconds (the checkpoint's save is after them)
STARTUP = ("imports", "setup", "zero_shot", "other", "total")  # summary.json startup_seconds: the time before round 1
GLOBAL_OFF = "|global-off"  # the key suffix of a whole-round run with --evaluation.global_model false


def class_names(n: int) -> list[str]:
    """n names of 1-7 tokens: CIFAR-100's, then '<modifier> <CIFAR-100 name>'; an evenly spaced subset of the
    200 so that every n has a similar mix of lengths."""
    pool = CIFAR100 + [f"{MODIFIERS[i % 10]} {CIFAR100[(37 * i) % 100]}" for i in range(100)]
    pool += [f"{pool[i % 200]} {i}" for i in range(max(0, n - len(pool)))]
    if n >= len(pool):
        return pool[:n]
    step = (len(pool) - 1) / max(1, n - 1)
    return [pool[round(i * step)] for i in range(n)]


# ---------------------------------------------------------------- timing, memory, FLOPs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMemory:
    """Peak memory of what runs between reset() and read(): RSS on CPU, allocated memory on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "cuda max_memory_allocated" if device.type == "cuda" else "process peak RSS (VmHWM)"
        if device.type != "cuda":
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.kind = "process peak RSS since start (ru_maxrss; VmHWM cannot be reset here)"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")

    def current(self) -> int:
        """What is held now (the baseline a peak is read against): allocated memory, or the process's RSS."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        try:
            return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
        except (OSError, AttributeError):
            return 0

    def read(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
        except (OSError, AttributeError):
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def alternate(fns: dict[str, Callable[[], None]], device: torch.device, memory: PeakMemory, min_seconds: float,
              max_reps: int) -> dict[str, dict]:
    """Call the functions in turn (a, b, a, b, ...) until each has run for min_seconds (or max_reps times):
    {name: {"seconds": [...], "median": s, "peak_bytes": b}}."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, int] = {name: 0 for name in fns}
    baseline = memory.current()  # the model, the inputs, the process (on CPU: torch's libraries)
    while True:
        for name, fn in fns.items():
            memory.reset()
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
            peaks[name] = max(peaks[name], memory.read())
        if all(sum(t) >= min_seconds or len(t) >= max_reps for t in times.values()):
            break
    return {name: {"seconds": t, "median": statistics.median(t), "peak_bytes": peaks[name], "baseline_bytes": baseline}
            for name, t in times.items()}


def count_flops(fn: Callable[[], None]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def matmul_rate(device: torch.device, quick: bool, smoke: bool = False) -> dict:
    """The machine's matmul rate: best of several fp32 2048^3 (CPU) or bf16 8192^3 (CUDA) products (--smoke: one
    256^3, a figure that only shows the code ran)."""
    n, dtype = (2048, torch.float32) if device.type != "cuda" else (8192, torch.bfloat16)
    n = 256 if smoke else n
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(1 if smoke else 2 if quick else (5 if device.type != "cuda" else 20)):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "flops_per_s": 2 * n**3 / best}


def _matmul_worker(n: int, reps: int, threads: int, barrier, out) -> None:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    barrier.wait()  # every process multiplies at the same time
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    out.put(2 * n**3 / best)


def concurrent_matmul_rate(processes: int, threads: int, quick: bool) -> dict:
    """CPU: the fp32 2048^3 matmul rate of `processes` processes multiplying at once (`threads` threads each), as
    ranks do, against one process alone: the machine's own ceiling for running ranks side by side."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    n, reps = 2048, 2 if quick else 5
    rates = {}
    for count in (1, processes):
        barrier, out = ctx.Barrier(count), ctx.Queue()
        procs = [ctx.Process(target=_matmul_worker, args=(n, reps, threads, barrier, out)) for _ in range(count)]
        for proc in procs:
            proc.start()
        rates[count] = [out.get() for _ in procs]
        for proc in procs:
            proc.join()
    solo, together = rates[1][0], rates[processes]
    return {"processes": processes, "threads": threads, "solo_flops_per_s": solo, "each_flops_per_s": together,
            "ceiling": sum(together) / solo}


# ---------------------------------------------------------------- the model parts


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.bf16 = args.precision == "bf16" or (args.precision == "auto" and self.device.type == "cuda")
        self.memory = PeakMemory(self.device)
        self._clips: dict[str, object] = {}
        self._floor_costs: dict[tuple, dict] = {}

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def model(self, name: str, n_classes: int) -> PromptedCLIP:
        if name not in self._clips:
            torch.manual_seed(0)
            self._clips.clear()  # one backbone at a time in memory
            self._clips[name] = load_clip(name, None)
        clip = self._clips[name]
        model = PromptedCLIP(clip, class_names(n_classes), self.args.n_ctx, self.args.visual_tokens, None, 0.02, seed=1)
        return model.to(self.device)

    def estimate(self, name: str, n_classes: int) -> int | None:
        """fedur's estimate of this training step's peak memory, made before any compute (fedur/train/memory.py): the
        same model, prompts, method and batch on fake tensors; None for a fedur without it."""
        try:
            from fedur.train.memory import ModelSpec, estimate_memory
        except ImportError:
            return None
        spec = ModelSpec(name, tuple(class_names(n_classes)), self.args.n_ctx, self.args.visual_tokens, None)
        return estimate_memory(spec, METHOD, self.args.train_batch, 2, precision="bf16-mixed" if self.bf16 else "32-true").train_bytes

    def pieces(self, model: PromptedCLIP) -> dict[str, torch.Tensor]:
        """A client's pieces as the method declares them (their initial values, run.seed 1), on the device and
        trained: leaves that require grad, as local training makes them."""
        values = initial_values(METHOD.pieces(), model, run_seed=1)
        return {name: value.to(self.device).requires_grad_() for name, value in values.items()}

    def images(self, model: PromptedCLIP, batch: int) -> torch.Tensor:
        size = model.clip.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch)).to(self.device)

    # -- text tower per optimizer step
    def text(self, name: str, n_classes: int) -> dict:
        args, model = self.args, self.model(name, n_classes)
        ctx = self.pieces(model)["text_ctx"]  # (n_ctx, width), trained
        tokens = model.text_prompt.tokens
        n_shared = 1 + ctx.shape[0]
        weights = torch.randn(n_classes, model.clip.text_projection.shape[1], device=self.device)

        def step(shared: bool) -> Callable[[], None]:
            def run() -> None:
                ctx.grad = None
                with self.autocast():
                    embeddings = model.text_prompt(ctx)  # (C, L, width)
                    if shared:
                        features = encode_text_shared_prefix(model.clip, embeddings, tokens, n_shared)
                    else:
                        features = encode_text_embeddings(model.clip, embeddings, tokens)
                    loss = (F.normalize(features.float(), dim=-1) * weights).sum()
                loss.backward()

            return run

        steps = {"off": step(False), "on": step(True)}
        flops = {key: count_flops(fn) for key, fn in steps.items()}  # also the warm-up
        timed = alternate(steps, self.device, self.memory, args.min_seconds, args.max_reps)
        pooled = tokens.argmax(dim=-1)
        out = {
            "length": int(tokens.shape[1]),
            "n_shared": n_shared,
            "tokens_off": int(tokens.numel()),
            "tokens_on": n_shared + int((pooled - n_shared + 1).clamp(min=0).sum()),
            "speedup": timed["off"]["median"] / timed["on"]["median"],
            "paired_speedup": statistics.median(a / b for a, b in zip(timed["off"]["seconds"], timed["on"]["seconds"])),
        }
        for key in steps:
            out[key] = {**timed[key], "flops": flops[key]}
        return out

    # -- prompted training step at batch 64
    def train(self, name: str, n_classes: int) -> dict:
        args, model = self.args, self.model(name, n_classes)
        model.train()
        pieces = self.pieces(model)
        has_switch = hasattr(model, "shared_prefix_text")
        labels = torch.randint(0, n_classes, (args.train_batch,), generator=torch.Generator().manual_seed(0))

        def step(shared: bool, images: torch.Tensor, labels: torch.Tensor, fixed_text: torch.Tensor | None = None):
            def run() -> None:
                if has_switch:
                    model.shared_prefix_text = shared
                for piece in pieces.values():
                    piece.grad = None
                with self.autocast():
                    # fixed_text: the image side alone (its FLOPs)
                    text = METHOD.text_side(model, pieces) if fixed_text is None else fixed_text
                    logits = prompted_logits(model, images, pieces, text)
                    loss = F.cross_entropy(logits.float(), labels.to(logits.device))
                loss.backward()

            return run

        small, small_labels = self.images(model, 2), labels[:2]
        with torch.no_grad(), self.autocast():
            fixed_text = METHOD.text_side(model, pieces)
        image_flops_per_image = count_flops(step(True, small, small_labels, fixed_text)) / 2  # + warm-up
        text_flops = {}
        for key in STEP_OPTIONS if has_switch else ("off",):
            whole = count_flops(step(key == "on", small, small_labels))
            text_flops[key] = whole - 2 * image_flops_per_image
        images = self.images(model, args.train_batch)
        steps = {key: step(key == "on", images, labels) for key in text_flops}
        timed = alternate(steps, self.device, self.memory, args.min_seconds, args.max_reps)
        if has_switch:
            model.shared_prefix_text = True  # fedur's default
        out = {"batch": args.train_batch, "image_flops_per_image": image_flops_per_image, "shared_switch": has_switch,
               "estimated_bytes": self.estimate(name, n_classes)}
        for key, t in timed.items():
            flops = image_flops_per_image * args.train_batch + text_flops[key]
            out[key] = {**t, "images_per_s": args.train_batch / t["median"], "flops_per_step": flops,
                        "text_flops": text_flops[key], "flops_per_s": flops / t["median"]}
        if "on" in out:
            out["speedup"] = out["off"]["median"] / out["on"]["median"]
        return out

    # -- pseudo-labelling / evaluation forward at batch 256
    def eval(self, name: str, n_classes: int) -> dict:
        args, model = self.args, self.model(name, n_classes)
        model.eval()
        pieces = self.pieces(model)
        with torch.no_grad(), self.autocast():
            text = METHOD.text_side(model, pieces)  # once per pass

        def forward(images: torch.Tensor, count: bool = False) -> Callable[[], None]:
            # Counting runs with autograd on (the prompts require grad): without it nn.MultiheadAttention takes
            # its fused fast path, whose projections FlopCounterMode does not see. Same math, same FLOPs.
            def run() -> None:
                with (torch.enable_grad() if count else torch.no_grad()), self.autocast():
                    prompted_logits(model, images, pieces, text)

            return run

        forward(self.images(model, 2))()  # warm-up
        flops_per_image = count_flops(forward(self.images(model, 2), count=True)) / 2
        timed = alternate({"eval": forward(self.images(model, args.eval_batch))}, self.device, self.memory,
                          args.min_seconds, args.max_reps)["eval"]
        return {**timed, "batch": args.eval_batch, "images_per_s": args.eval_batch / timed["median"],
                "flops_per_image": flops_per_image, "flops_per_s": flops_per_image * args.eval_batch / timed["median"]}

    def floor_costs(self, name: str, n_classes: int, shared: bool) -> dict:
        """Seconds per image at full batch, measured now (in the invocation that runs the rounds, under the
        same load): a training step with the given text-tower setting, the prompted eval forward, and the
        plain (zero-shot CLIP) image forward that round 1's refresh and the zero-shot evaluation use."""
        key = (name, n_classes, shared)
        if key in self._floor_costs:
            return self._floor_costs[key]
        args, model = self.args, self.model(name, n_classes)
        pieces = self.pieces(model)
        has_switch = hasattr(model, "shared_prefix_text")
        if has_switch:
            model.shared_prefix_text = shared
        labels = torch.randint(0, n_classes, (args.train_batch,), generator=torch.Generator().manual_seed(0))
        with torch.no_grad(), self.autocast():
            text = METHOD.text_side(model, pieces)

        def train(images: torch.Tensor) -> Callable[[], None]:
            def run() -> None:
                for piece in pieces.values():
                    piece.grad = None
                with self.autocast():
                    logits = prompted_logits(model, images, pieces, METHOD.text_side(model, pieces))
                    loss = F.cross_entropy(logits.float(), labels[: len(images)].to(self.device))
                loss.backward()

            return run

        def forward(images: torch.Tensor, prompted: bool) -> Callable[[], None]:
            def run() -> None:
                with torch.no_grad(), self.autocast():
                    if prompted:
                        prompted_logits(model, images, pieces, text)
                    else:  # zero-shot CLIP: plain image features
                        model.logits(model.image_features(images, prompted=False), text)

            return run

        small = self.images(model, 2)
        for warm in (train(small), forward(small, True), forward(small, False)):
            warm()
        train_images, eval_images = self.images(model, args.train_batch), self.images(model, args.eval_batch)
        timed = alternate({"train": train(train_images), "eval": forward(eval_images, True),
                           "eval_plain": forward(eval_images, False)}, self.device, self.memory, args.min_seconds,
                          args.max_reps)
        if has_switch:
            model.shared_prefix_text = True  # fedur's default
        batch = {"train": args.train_batch, "eval": args.eval_batch, "eval_plain": args.eval_batch}
        costs = {key: timed[key]["median"] / batch[key] for key in timed}
        costs["train_setting"] = "on" if shared and has_switch else "off"
        self._floor_costs[key] = costs
        return costs

    def bytes_sent(self, name: str, n_classes: int) -> dict:
        """One client's upload as fedur/train/server.py counts it: the method's shared pieces and messages, plus
        in a refresh round the class histograms (fedur/train/round.py: two of C int64 for cooperative selection)."""
        model = self.model(name, n_classes)
        start = initial_values(METHOD.pieces(), model, run_seed=1)
        sent = {**{n: start[n] for n in shared_names(METHOD)}, **METHOD.messages(model, start)}
        prompt = sum(t.numel() * t.element_size() for t in sent.values())
        return {"visual_prompt": prompt, "histograms": 2 * n_classes * 8, "refresh_round": prompt + 2 * n_classes * 8,
                "other_round": prompt}


def prompted_logits(model: PromptedCLIP, images: torch.Tensor, pieces: dict[str, torch.Tensor], text) -> torch.Tensor:
    """(B, C) logits of a client's model: the method's hook (FedUR's reads nothing of the client but its pieces)."""
    return METHOD.logits(model, images, pieces, text, client=None)


# ---------------------------------------------------------------- whole rounds


def run_round(bench: Bench, name: str, train_images: int, shared: bool, results: dict, ranks: int = 1,
              clients_per_step: int = 1, global_model: bool = True, method: str | None = None) -> dict:
    """One `python -m fedur.main` run on generated shapes (under `fabric run --devices ranks` for several ranks);
    its rounds against their compute floor, and its time before round 1 (summary.json's startup_seconds: None
    where the fedur that ran does not record it). `global_model`: evaluation.global_model, the server's model
    tested every round on the clients' test union."""
    args = bench.args
    classes = 10
    per_class = max(1, train_images // classes)
    workdir = Path(tempfile.mkdtemp(prefix="round-cost-"))
    run_dir = workdir / "run"
    if ranks == 1:
        head = [sys.executable, "-m", "fedur.main"]
    else:
        with socket.socket() as sock:  # a free port for the ranks' rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        head = [str(Path(sys.executable).parent / "fabric"), "run", "--accelerator", bench.device.type,
                "--devices", str(ranks), "--main-port", str(port), str(REPO / "fedur" / "main.py")]
    cmd = [
        *head, "--config", str(REPO / "configs" / "tiny.yaml"),
        "--model.name", name, "--model.pretrained", "null", "--model.n_ctx", str(args.n_ctx),
        "--model.visual_tokens", str(args.visual_tokens), "--model.shared_prefix_text", str(shared).lower(),
        "--dataset", "Synthetic", "--dataset.classes", str(classes), "--dataset.train_per_class", str(per_class),
        "--dataset.test_per_class", str(max(1, per_class // 5)), "--data.num_workers", str(args.num_workers),
        "--federation.num_clients", str(args.round_clients), "--federation.rounds", str(args.round_rounds),
        "--federation.local_epochs", "1", "--federation.refresh_every", "1", "--federation.beta", "0.5",
        "--optim.batch_size", str(args.train_batch), "--optim.eval_batch_size", str(args.eval_batch),
        "--fabric.accelerator", bench.device.type, "--fabric.devices", str(ranks),
        "--fabric.precision", "bf16-mixed" if bench.bf16 else "32-true",
        "--run.output_dir", str(run_dir), "--run.progress", "false", "--run.clients_per_step", str(clients_per_step),
        "--evaluation.global_model", str(global_model).lower(), *(["--method", method] if method else []),
    ]
    if bench.device.type != "cuda":
        cmd += ["--run.threads", str(torch.get_num_threads())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FEDUR_CACHE_DIR": str(workdir / "cache")}
    # Per-image costs at full batch for the floor: same model, 10 classes, same text-tower setting, measured
    # in this invocation (before its first run of this model and setting), so under the same load.
    run = {"per_image_cost": bench.floor_costs(name, classes, shared)}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    shown_cmd = ["python", *cmd[1:]] if ranks == 1 else ["fabric", *cmd[1:]]
    shown = " ".join(shlex.quote(c) for c in shown_cmd).replace(str(workdir), "$TMP").replace(str(REPO) + "/", "")
    if done.returncode != 0:
        return {**run, "command": shown, "error": (done.stdout[-1500:] + done.stderr[-1500:]).strip()}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    partition = json.loads((run_dir / "partition.json").read_text())
    n_train, n_test = sum(partition["train_sizes"]), sum(partition["test_sizes"])
    summary_path = run_dir / "summary.json"
    startup = json.loads(summary_path.read_text()).get("startup_seconds") if summary_path.is_file() else None

    costs = run["per_image_cost"]
    train_cost, eval_cost, plain_cost = costs["train"], costs["eval"], costs["eval_plain"]

    rounds = []
    for row, number in zip(rows, round_numbers(rows)):
        trained = sum(n or 0 for n in row["selected"])  # local_epochs = 1; none for a method that trains nothing (GDA-U)
        refresh_cost = plain_cost if number == 1 else eval_cost  # the first round: zero-shot CLIP labels
        floor = {
            "refresh": n_train * refresh_cost if row.get("refreshed") else 0.0,
            "train": trained * train_cost,
            "aggregate": 0.0,
            "evaluate": n_test * eval_cost,
        }
        rounds.append({
            "round": number, "round_seconds": row["round_seconds"], "phase_seconds": row.get("phase_seconds"),
            "trained_images": trained, "refreshed": row.get("refreshed"), "floor": floor,
            "floor_seconds": sum(floor.values()), "bytes_sent": row.get("bytes_sent"),
        })
    return {
        "command": shown, "model": name, "classes": classes, "clients": args.round_clients, "train_images": n_train,
        "test_images": n_test, "shared_prefix_text": shared, "ranks": ranks, "clients_per_step": clients_per_step,
        "global_model": global_model, "process_wall_seconds": wall, "rounds": rounds, "startup_seconds": startup,
        "per_image_cost": costs, "method": method or "FedUR",
    }


# ---------------------------------------------------------------- report


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n}"


def mem(t: dict) -> str:
    """peak (+ increase over what was held before the timed calls)."""
    extra = f" (+{human_bytes(t['peak_bytes'] - t['baseline_bytes'])})" if "baseline_bytes" in t else ""
    return human_bytes(t["peak_bytes"]) + extra


def estimated(t: dict) -> str:
    """fedur's estimate of the step's peak tensor memory (weights included), where it was made."""
    return human_bytes(t["estimated_bytes"]) if t.get("estimated_bytes") is not None else "-"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}" if seconds < 10 else f"{seconds * 1000:,.0f}"


def markdown(results: dict) -> str:
    m = results["machine"]
    peak = results.get("matmul", {})

    def rate(entry: dict) -> float:  # the matmul rate measured by the invocation that measured the entry
        return entry.get("matmul_flops_per_s") or peak["flops_per_s"]
    rates = [inv["matmul_flops_per_s"] for inv in results["invocations"] if inv.get("matmul_flops_per_s")] or [
        peak.get("flops_per_s", 0)]
    lines = [
        f"# Round cost: {m['device_name']}",
        "",
        "Command lines that produced this file (each added its parts; later ones replace the same entries):",
        "",
    ]
    for inv in results["invocations"]:
        failed = f"; FAILED: {'; '.join(inv['failures'])}" if inv.get("failures") else ""
        lines.append(f"- `{inv['command']}`  ({inv['date']}, {inv['seconds']:.0f} s, load average "
                     f"{inv['load_before']} -> {inv['load_after']}{failed})")
    lines += [
        "",
        f"Machine: {m['device_name']}; torch {m['torch']}, {m['threads']} compute threads, precision "
        f"{m['precision']}. Matmul rate ({peak.get('dtype')} {peak.get('n')}^3, best of several), measured by each "
        f"invocation: {', '.join(f'{r / 1e9:,.1f}' for r in rates)} GFLOP/s; every % below is against the rate of the "
        f"invocation that measured it. Random-init models, random images already on the device; "
        f"prompts: n_ctx {m['n_ctx']}, {m['visual_tokens']} visual tokens in all blocks but the last. "
        f"Medians of alternating repetitions; peak memory: {m['memory_kind']}, and in brackets its increase "
        f"over what was held before the timed calls (model, inputs; on CPU also torch's own libraries).",
        "",
    ]
    micro = results.get("micro", {})
    keys = sorted(micro, key=lambda k: (k.split("|")[0], int(k.split("|")[1])))
    text_rows = [(k, micro[k]["text"]) for k in keys if "error" not in micro[k].get("text", {"error": 1})]
    if text_rows:
        lines += [
            "## Text tower per optimizer step (forward + backward)",
            "",
            "`off`: `encode_text_embeddings`, every class's full prompt; `on`: `encode_text_shared_prefix`, the start "
            "token and context once, each class only its own tokens up to its EOT. Tokens: what the token-wise "
            "layers process.",
            "",
            "| model | classes | prompt length | tokens off | tokens on | ms off | ms on | speed-up (paired) | GFLOP off | GFLOP on | reps |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, t in text_rows:
            model, c = k.split("|")
            lines.append(
                f"| {model} | {c} | {t['length']} | {t['tokens_off']:,} | {t['tokens_on']:,} | {ms(t['off']['median'])} | "
                f"{ms(t['on']['median'])} | x{t['speedup']:.2f} (x{t['paired_speedup']:.2f}) | "
                f"{t['off']['flops'] / 1e9:,.2f} | {t['on']['flops'] / 1e9:,.2f} | {len(t['off']['seconds'])} |"
            )
        lines.append("")
    train_rows = [(k, micro[k]["train"]) for k in keys if "error" not in micro[k].get("train", {"error": 1})]
    if train_rows:
        lines += [
            "## Prompted training step (forward + backward, batch {})".format(train_rows[0][1]["batch"]),
            "",
            "`PromptedCLIP.forward` (deep visual prompts, text tower with the context), cross-entropy, backward to "
            "both prompts; no optimizer step. FLOP rate: the step's counted FLOPs / its time, and as a share of the "
            "matmul rate above.",
            "",
            "| model | classes | img/s text off | img/s text on | step speed-up | GFLOP / step (on) | GFLOP/s (on) | % of matmul rate | peak memory | estimated before any compute | reps |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, t in train_rows:
            model, c = k.split("|")
            on = t.get("on", t["off"])
            lines.append(
                f"| {model} | {c} | {t['off']['images_per_s']:,.1f} | "
                f"{t['on']['images_per_s']:,.1f} | x{t.get('speedup', float('nan')):.2f} | "
                f"{on['flops_per_step'] / 1e9:,.1f} | {on['flops_per_s'] / 1e9:,.1f} | "
                f"{100 * on['flops_per_s'] / rate(t):.1f}% | {mem(on)} | {estimated(t)} | "
                f"{len(on['seconds'])} |"
                if "on" in t else
                f"| {model} | {c} | {t['off']['images_per_s']:,.1f} | (no switch) | | "
                f"{on['flops_per_step'] / 1e9:,.1f} | {on['flops_per_s'] / 1e9:,.1f} | "
                f"{100 * on['flops_per_s'] / rate(t):.1f}% | {mem(on)} | {estimated(t)} | {len(on['seconds'])} |"
            )
        lines.append("")
    eval_rows = [(k, micro[k]["eval"]) for k in keys if "error" not in micro[k].get("eval", {"error": 1})]
    if eval_rows:
        lines += [
            "## Pseudo-labelling / evaluation forward (no grad, batch {})".format(eval_rows[0][1]["batch"]),
            "",
            "Prompted image features and logits; the text side computed once per pass (not timed).",
            "",
            "| model | classes | img/s | GFLOP / image | GFLOP/s | % of matmul rate | peak memory | reps |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, t in eval_rows:
            model, c = k.split("|")
            lines.append(
                f"| {model} | {c} | {t['images_per_s']:,.1f} | {t['flops_per_image'] / 1e9:,.3f} | "
                f"{t['flops_per_s'] / 1e9:,.1f} | {100 * t['flops_per_s'] / rate(t):.1f}% | "
                f"{mem(t)} | {len(t['seconds'])} |"
            )
        lines.append("")
    byte_rows = [(k, micro[k]["bytes"]) for k in keys if "error" not in micro[k].get("bytes", {"error": 1})]
    if byte_rows:
        lines += [
            "## Bytes each client sends per round",
            "",
            "The visual prompt (float32) every round it trains; in a refresh round also its class histograms "
            "(2 x C int64, cooperative selection). Text prompts stay on the client.",
            "",
            "| model | classes | visual prompt | + histograms (refresh round) |",
            "| --- | --- | --- | --- |",
        ]
        for k, b in byte_rows:
            model, c = k.split("|")
            lines.append(f"| {model} | {c} | {b['visual_prompt']:,} B | {b['refresh_round']:,} B |")
        lines.append("")
    runs = results.get("round", {})
    if runs:
        lines += [
            "## Whole rounds against their compute floor",
            "",
            "`python -m fedur.main` (command below; 10 generated-shape classes, 1 local epoch, a pseudo-label "
            "refresh every round). Floor = images through the towers x the per-image cost at full batch, measured "
            "by the same invocation just before the runs (10 classes, the run's text-tower setting): refresh: every "
            "train image (round 1: zero-shot CLIP's plain image forward; later rounds: the prompted eval forward); "
            f"train: the selected images x 1 epoch, training step at batch {results['machine']['train_batch']}; "
            f"evaluate: every test image, prompted eval forward at batch {results['machine']['eval_batch']} (the "
            "personal protocol; the server's model is scored from the same pass where it shares the clients' image "
            "features, as FedUR's does; a server model with other image features has a pass of its own, not in the floor). "
            "Per phase: seconds measured / floor (on W ranks: the floor / W, each rank's share if balanced). Not in a round: process start, the image cache, the zero-shot "
            "evaluation before round 1 (how long each took: 'Before round 1' below).",
            "",
            "| model | text shared | ms / image: training step | prompted eval forward | plain image forward |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key in sorted(runs):
            c = runs[key].get("per_image_cost")
            if (c and runs[key].get("ranks", 1) == 1 and runs[key].get("clients_per_step", 1) == 1
                    and not key.endswith(GLOBAL_OFF)):  # the global-off twin measured the same costs
                lines.append(f"| {key.split('|')[0]} | {c['train_setting']} | {c['train'] * 1e3:,.3f} | "
                             f"{c['eval'] * 1e3:,.3f} | {c.get('eval_plain', float('nan')) * 1e3:,.3f} |")
        lines += [
            "",
            "| model | train / test images | clients | ranks W | clients per step | text shared | global model | round | round s | "
            "floor s / W | floor / W / round | " + " | ".join(PHASES) + " | bytes sent (all clients) | process s |",
            "| --- " * (13 + len(PHASES)) + "|",
        ]
        for key in sorted(runs):
            r = runs[key]
            if "error" in r:
                lines.append(f"| {key} | failed: see the JSON |" + " |" * (11 + len(PHASES)))
                continue
            w = r.get("ranks", 1)  # W ranks share the floor's work: each rank's share of it, if balanced
            for row in r["rounds"]:
                ph = row.get("phase_seconds") or {}
                cells = []
                for phase in PHASES:
                    actual, floor = ph.get(phase), row["floor"].get(phase, 0.0) / w
                    cells.append("" if actual is None else f"{actual:.2f} / {floor:.2f}")
                sent = sum(row["bytes_sent"]) if row.get("bytes_sent") else 0
                lines.append(
                    f"| {r['model']} | {r['train_images']} / {r['test_images']} | {r['clients']} | {r.get('ranks', 1)} | "
                    f"{r.get('clients_per_step', 1)} | "
                    f"{'on' if r['shared_prefix_text'] else 'off'} | {'on' if r.get('global_model', True) else 'off'} | "
                    f"{row['round']} | {row['round_seconds']:.2f} | "
                    f"{row['floor_seconds'] / w:.2f} | {100 * row['floor_seconds'] / w / row['round_seconds']:.1f}% | "
                    + " | ".join(cells) + f" | {sent:,} | {r['process_wall_seconds']:.0f} |"
                )
        lines += global_table(results.get("global_evaluation") or global_evaluation(runs))
        lines += startup_table(runs)
        lines += placement_table(runs, results.get("concurrent_matmul"))
        lines += together_table(runs)
        lines += ["", "Commands:", ""]
        for key in sorted(runs):
            lines.append(f"- `{runs[key].get('command', key + ' (failed before its run started)')}`")
        lines.append("")
    lines += methods_table(results.get("methods", {}))
    return "\n".join(lines)


def methods_table(runs: dict) -> list[str]:
    """Each method's whole rounds against FedUR's in the same configuration (the `methods` part): the median over the
    rounds after the first (the first pseudo-labels with zero-shot CLIP) of the round and of its phases, in seconds,
    and the round's ratio to FedUR's."""
    if not runs:
        return []

    def median_phase(run: dict, phase: str | None) -> float | None:
        rows = run["rounds"][1:] or run["rounds"]
        values = [r["round_seconds"] if phase is None else (r.get("phase_seconds") or {}).get(phase) for r in rows]
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    lines = ["", "## Each method's round against FedUR's", "",
             "Whole runs of `python -m fedur.main` in the same configuration as the rounds above (`--parts methods`; "
             "each method with its own labeller and default settings, its command below), one after another; seconds "
             "are medians over the rounds after the first. A method's round is what it computes: its towers' passes "
             "(CoCoOp encodes every class prompt per image, pFedMoAP its experts' class prompts, MaPLe and PromptSRC "
             "prompt both towers), its loss terms, the server's model if it has one of its own.", "",
             "| method | round s | refresh s | train s | aggregate s | evaluate s | x FedUR (round) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    base = next((run for run in runs.values() if run.get("method") == "FedUR" and "error" not in run), None)
    for key, run in runs.items():
        if "error" in run:
            lines.append(f"| {key.split('|')[-1]} | failed: {run['error'].strip().splitlines()[-1][:120]} | | | | | |")
            continue
        cells = [median_phase(run, p) for p in (None, "refresh", "train", "aggregate", "evaluate")]
        ratio = f"x{cells[0] / median_phase(base, None):.2f}" if base else "n/a"
        lines.append(f"| {run['method']} | " + " | ".join("" if c is None else f"{c:.2f}" for c in cells) + f" | {ratio} |")
    lines += ["", "Commands:", ""] + [f"- `{run['command']}`" for run in runs.values() if "command" in run] + [""]
    return lines


def global_evaluation(runs: dict) -> dict[str, list[dict]]:
    """{key of a run with the global model on: per round, its evaluate phase and its global-off twin's (s), and
    their ratio}: what testing the server's model on the clients' test union adds to a round's evaluation."""
    out = {}
    for key, on in runs.items():
        off = runs.get(key + GLOBAL_OFF)
        if key.endswith(GLOBAL_OFF) or off is None or "error" in on or "error" in off:
            continue
        rows = []
        for a, b in zip(on["rounds"], off["rounds"]):
            e_on, e_off = ((r.get("phase_seconds") or {}).get("evaluate") for r in (a, b))
            ratio = e_on / e_off if e_on is not None and e_off else None
            rows.append({"round": a["round"], "evaluate_on": e_on, "evaluate_off": e_off, "on_over_off": ratio})
        out[key] = rows
    return out


def global_table(pairs: dict[str, list[dict]]) -> list[str]:
    if not pairs:
        return []
    lines = [
        "",
        "### Evaluation with the global protocol on and off",
        "",
        "Each configuration run twice, back to back (the order flipped from one configuration to the next): "
        "`--evaluation.global_model true` (fedur's default: the server's model also tested every round on the "
        "union of the clients' test sets) and `false` (each client's own test set only). The evaluate phase of "
        "each (metrics.jsonl's phase_seconds) and their ratio.",
        "",
        "| run | round | evaluate s, global on | evaluate s, global off | on / off |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in sorted(pairs):
        for row in pairs[key]:
            cells = [("" if v is None else f"{v:.3f}") for v in (row["evaluate_on"], row["evaluate_off"])]
            ratio = "" if row["on_over_off"] is None else f"x{row['on_over_off']:.2f}"
            lines.append(f"| {key} | {row['round']} | {cells[0]} | {cells[1]} | {ratio} |")
    return lines


def startup_table(runs: dict) -> list[str]:
    """Each run's time before round 1, as fedur splits it in summary.json's startup_seconds."""
    done = {key: r for key, r in runs.items() if "error" not in r}
    if not done:
        return []
    lines = [
        "",
        "### Before round 1",
        "",
        "summary.json's `startup_seconds`: the process's imports, the run's setup, the zero-shot evaluation, the "
        "rest, and their total (\"not recorded\": the fedur that ran does not write it). Process s: the whole "
        "process, as this script timed it.",
        "",
        "| run | " + " | ".join(STARTUP) + " | process s |",
        "| --- " * (len(STARTUP) + 2) + "|",
    ]
    for key in sorted(done):
        startup = done[key].get("startup_seconds")
        if isinstance(startup, dict):
            cells = " | ".join("" if startup.get(k) is None else f"{startup[k]:.2f}" for k in STARTUP)
        else:
            cells = " | ".join(["not recorded"] + [""] * (len(STARTUP) - 1))
        lines.append(f"| {key} | {cells} | {done[key]['process_wall_seconds']:.1f} |")
    return lines


def together_table(runs: dict) -> list[str]:
    """The same run with its clients trained one after another and several per step (run.clients_per_step)."""
    lines = []
    for key in sorted(runs):
        r = runs[key]
        if r.get("clients_per_step", 1) == 1 or "error" in r or key.endswith(GLOBAL_OFF):
            continue
        base = runs.get(key.replace(f"|together{r['clients_per_step']}", "|together1"))  # the same invocation's
        if base is None or "error" in base:
            continue
        if not lines:
            lines += [
                "",
                "### Clients trained together",
                "",
                "The same run (1 rank) with its clients trained one after another and with `run.clients_per_step` "
                "G: groups of G consecutive clients whose batches go through one forward, each image with its "
                "client's prompts (results equal up to float rounding). Mean over the rounds.",
                "",
                "| model | clients | text shared | G | train s, one by one | train s, G per step | train speed-up | round s, one by one | round s, G per step |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]

        def mean(run: dict, what: str) -> float:
            values = [row["round_seconds"] if what == "round" else (row.get("phase_seconds") or {}).get(what, float("nan"))
                      for row in run["rounds"]]
            return sum(values) / len(values)

        one, many = mean(base, "train"), mean(r, "train")
        lines.append(f"| {r['model']} | {r['clients']} | {'on' if r['shared_prefix_text'] else 'off'} | "
                     f"{r['clients_per_step']} | {one:.2f} | {many:.2f} | x{one / many:.2f} | {mean(base, 'round'):.2f} | "
                     f"{mean(r, 'round'):.2f} |")
    return lines


def placement_table(runs: dict, concurrent: dict | None = None) -> list[str]:
    """The same run on 1 and on several ranks: the mean round time and its speed-up against K/W and against the
    machine's ceiling for that many processes at once."""
    lines = []
    for key in sorted(runs):
        r = runs[key]
        if r.get("ranks", 1) == 1 or r.get("clients_per_step", 1) > 1 or "error" in r or key.endswith(GLOBAL_OFF):
            continue
        base = runs.get(key.replace(f"|ranks{r['ranks']}", "|ranks1"))  # measured by the same invocation
        if base is None or "error" in base:
            continue
        if not lines:
            lines += [
                "",
                "### Clients placed on several ranks",
                "",
                "The same run (same clients, data and settings; results identical by fedur's placement tests) on 1 "
                "rank and on W ranks, one compute thread each. Ideal: K / ceil(K / W), the slowest rank's share of "
                "the clients. Machine ceiling (CPU): W single-thread processes multiplying fp32 2048^3 matrices at "
                "once, their summed rate over one process's alone; ranks cannot go faster than that.",
                "",
                "| model | clients K | ranks W | text shared | mean round s, 1 rank | mean round s, W ranks | speed-up | ideal | machine ceiling |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
        one = sum(row["round_seconds"] for row in base["rounds"]) / len(base["rounds"])
        many = sum(row["round_seconds"] for row in r["rounds"]) / len(r["rounds"])
        k, w = r["clients"], r["ranks"]
        ceiling = (concurrent or {}).get(str(w))
        lines.append(f"| {r['model']} | {k} | {w} | {'on' if r['shared_prefix_text'] else 'off'} | {one:.2f} | "
                     f"{many:.2f} | x{one / many:.2f} | x{k / -(-k // w):.2f} | "
                     + (f"x{ceiling['ceiling']:.2f} |" if ceiling else "|"))
    if concurrent:
        for w, c in sorted(concurrent.items()):
            lines.append("")
            lines.append(f"Concurrent matmuls, {w} processes x {c['threads']} thread: "
                         + ", ".join(f"{r / 1e9:,.1f}" for r in c["each_flops_per_s"])
                         + f" GFLOP/s each, against {c['solo_flops_per_s'] / 1e9:,.1f} alone (x{c['ceiling']:.2f}).")
    return lines


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                        help="auto: bf16 autocast on cuda, fp32 on cpu")
    parser.add_argument("--models", default="ViT-B-32,fedur-tiny,fedur-demo")
    parser.add_argument("--classes", default="10,100,200")
    parser.add_argument("--parts", default="text,train,eval,bytes,round")
    parser.add_argument("--eval-once", action="store_true",
                        help="measure eval only at the largest class count (it barely depends on it) and reuse it")
    parser.add_argument("--round-models", default=None, help="models of whole-round runs (default: --models)")
    parser.add_argument("--round-images", default="500", help="train images of a whole-round run (list)")
    parser.add_argument("--round-shared", default="off,on", help="text-tower settings of the whole-round runs")
    parser.add_argument("--round-clients", type=int, default=10)
    parser.add_argument("--round-ranks", default="1", help="ranks of the whole-round runs (list; >1 under fabric run)")
    parser.add_argument("--round-clients-per-step", default="1",
                        help="run.clients_per_step of the whole-round runs (list; on 1 rank)")
    parser.add_argument("--round-rounds", type=int, default=2)
    parser.add_argument("--methods", default="all", help="the `methods` part's methods (class names, FedUR first; all: "
                        "every method with rounds)")
    parser.add_argument("--round-global", default="on,off",
                        help="evaluation.global_model of the whole-round runs (list): each configuration runs once per value")
    parser.add_argument("--n-ctx", type=int, default=16)
    parser.add_argument("--visual-tokens", type=int, default=5)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--eval-batch", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=None, help="data.num_workers of the runs (cpu 0, cuda 2: fedur's default)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU compute threads, also the runs' run.threads (default on cpu: 1; on a machine shared "
                             "with other jobs, multi-threaded small ops wait for descheduled threads)")
    parser.add_argument("--min-seconds", type=float, default=None, help="time each setting at least this long")
    parser.add_argument("--max-reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="CPU: tiny models, short timings, a small run")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest of everything (fedur-tiny, 10 classes, batches of 4, one timed call, a run of "
                             "2 clients on 40 images): that every part runs, in seconds; not a measurement")
    parser.add_argument("--merge", action="store_true", help="add to the results JSON already in --out")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "round_cost"))
    args = parser.parse_args(argv)
    given = set(sys.argv[1:] if argv is None else argv)
    if args.smoke:  # what is given explicitly wins
        defaults = {"models": "fedur-tiny", "classes": "10", "round_models": "fedur-tiny", "round_images": "40",
                    "round_clients": 2, "round_rounds": 1, "train_batch": 4, "eval_batch": 4, "min_seconds": 0.0,
                    "max_reps": 1}
        for key, value in defaults.items():
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, value)
    elif args.quick:
        args.models = args.models if "--models" in given else "fedur-tiny,fedur-demo"
        args.classes = args.classes if "--classes" in given else "10,100"
        args.round_models = args.round_models or "fedur-tiny"
        if "--round-images" not in given:
            args.round_images = "100"
        if "--round-clients" not in given:
            args.round_clients = min(args.round_clients, 4)
        if "--round-rounds" not in given:
            args.round_rounds = 1
    if args.min_seconds is None:
        args.min_seconds = 0.3 if args.quick else 2.0
    unknown = set(args.round_global.split(",")) - {"on", "off"}
    if unknown:
        parser.error(f"--round-global takes on and/or off, not {', '.join(sorted(unknown))}")
    if args.threads is None and not args.device.startswith("cuda"):
        args.threads = 1
    if args.num_workers is None:
        args.num_workers = 2 if args.device.startswith("cuda") else 0  # fedur's default data.num_workers on GPU
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, write the report; 1 when any part or run failed (each failure is recorded in the report)."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bench = Bench(args)
    device = bench.device
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = device.type + ("-smoke" if args.smoke else "-quick" if args.quick else "")
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    results = json.loads(json_path.read_text()) if args.merge and json_path.exists() else {}
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores")
    results["machine"] = {
        "device": str(device), "device_name": device_name, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "precision": "bf16 autocast" if bench.bf16 else "fp32",
        "n_ctx": args.n_ctx, "visual_tokens": args.visual_tokens, "train_batch": args.train_batch,
        "eval_batch": args.eval_batch, "memory_kind": bench.memory.kind,
    }
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO),
                                                             *(sys.argv[1:] if argv is None else argv)])
    invocation = {"command": command, "date": datetime.date.today().isoformat(),
                  "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    results.setdefault("invocations", []).append(invocation)
    started = time.perf_counter()
    failures: list[str] = invocation.setdefault("failures", [])

    def save() -> None:
        invocation["seconds"] = time.perf_counter() - started
        invocation["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        json_path.write_text(json.dumps(results, indent=1))
        md_path.write_text(markdown(results))

    results["matmul"] = matmul_rate(device, args.quick, args.smoke)
    invocation["matmul_flops_per_s"] = results["matmul"]["flops_per_s"]
    print(f"matmul rate: {results['matmul']['flops_per_s'] / 1e9:,.1f} GFLOP/s", flush=True)
    parts = args.parts.split(",")
    models = args.models.split(",") if args.models else []
    classes = [int(c) for c in args.classes.split(",")]
    for name in models:
        for n_classes in classes:
            entry = results.setdefault("micro", {}).setdefault(f"{name}|{n_classes}", {})
            for part in ("text", "train", "eval", "bytes"):
                if part not in parts:
                    continue
                if part == "eval" and args.eval_once and n_classes != max(classes):
                    continue
                tick = time.perf_counter()
                try:
                    entry[part] = getattr(bench, part if part != "bytes" else "bytes_sent")(name, n_classes)
                except Exception as err:  # recorded and reported; the other parts still run
                    entry[part] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
                    failures.append(f"{name} {n_classes} classes {part}: {entry[part]['error']}")
                    print(f"{name} {n_classes} classes {part}: FAILED\n{entry[part]['traceback']}", flush=True)
                    save()
                    continue
                entry[part]["matmul_flops_per_s"] = results["matmul"]["flops_per_s"]  # this invocation's
                print(f"{name} {n_classes} classes {part}: {summary(part, entry[part])} "
                      f"({time.perf_counter() - tick:.0f} s)", flush=True)
                save()
        if args.eval_once and "eval" in parts:
            measured = results["micro"][f"{name}|{max(classes)}"]["eval"]
            if "error" not in measured:
                for n_classes in classes:
                    results["micro"][f"{name}|{n_classes}"].setdefault("eval", {**measured, "reused_from": max(classes)})
            save()
    if "round" in parts and device.type == "cpu":
        for w in (int(w) for w in args.round_ranks.split(",")):
            if w > 1:
                c = concurrent_matmul_rate(w, args.threads or 1, args.quick)
                results.setdefault("concurrent_matmul", {})[str(w)] = c
                print(f"{w} concurrent matmul processes: x{c['ceiling']:.2f} of one alone", flush=True)
    if "round" in parts:
        global_settings = [{"on": True, "off": False}[g] for g in args.round_global.split(",")]
        pair_index = 0
        for name in (args.round_models or args.models).split(","):
            for n_images in (int(n) for n in args.round_images.split(",")):
                for setting in args.round_shared.split(","):
                    # Each comparison's runs come from this one invocation: with several values, every run
                    # (the 1-rank / one-by-one base too) is keyed by its own |ranksW or |togetherG.
                    ranks_list = [int(w) for w in args.round_ranks.split(",")]
                    groups = [int(g) for g in args.round_clients_per_step.split(",")]
                    variants = [(w, 1, f"|ranks{w}") for w in ranks_list] if len(ranks_list) > 1 else []
                    variants += [(1, g, f"|together{g}") for g in groups] if len(groups) > 1 else []
                    if not variants:  # one run: the plain key, with what differs from the default
                        w, g = ranks_list[0], groups[0]
                        variants = [(w, g, (f"|ranks{w}" if w > 1 else "") + (f"|together{g}" if g > 1 else ""))]
                    for ranks, group, suffix in variants:
                        # The global protocol on and off back to back, the order flipped from one configuration to
                        # the next (on, off, off, on, ...), so that a drift in the machine's load falls on both.
                        order = global_settings if pair_index % 2 == 0 else global_settings[::-1]
                        pair_index += 1
                        for global_model in order:
                            tick = time.perf_counter()
                            try:
                                run = run_round(bench, name, n_images, setting == "on", results, ranks, group, global_model)
                            except Exception as err:  # e.g. the floor's timing, or a run that wrote no metrics
                                run = {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}"}
                            key = f"{name}|{n_images}|{setting}{suffix}" + ("" if global_model else GLOBAL_OFF)
                            results.setdefault("round", {})[key] = run
                            label = (f"round {name} {n_images} images text {setting} ranks {ranks} clients per step {group} "
                                     f"global model {'on' if global_model else 'off'}")
                            if "error" in run:
                                failures.append(f"{label}: {run['error'].strip().splitlines()[-1] if run['error'].strip() else 'failed'}")
                                print(f"{label}: FAILED\n{run['error']}", flush=True)
                            else:
                                secs = [r["round_seconds"] for r in run["rounds"]]
                                floors = [r["floor_seconds"] for r in run["rounds"]]
                                print(f"{label}: round s {secs}, floor s {[round(f, 3) for f in floors]} "
                                      f"({time.perf_counter() - tick:.0f} s)", flush=True)
                        results["global_evaluation"] = global_evaluation(results.get("round", {}))
                        save()
    if "methods" in parts:
        from fedur import plugins

        names = ([cls.__name__ for cls in plugins.builtin("method") if cls().rounds(1)] if args.methods == "all"
                 else args.methods.split(","))
        names = ["FedUR", *[n for n in names if n != "FedUR"]]
        model = (args.round_models or args.models).split(",")[0]
        n_images = int(args.round_images.split(",")[0])
        for method in names:
            tick = time.perf_counter()
            try:
                run = run_round(bench, model, n_images, True, results, method=method)
            except Exception as err:  # recorded and reported; the other methods still run
                run = {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}", "method": method}
            results.setdefault("methods", {})[f"{model}|{n_images}|{method}"] = run
            if "error" in run:
                failures.append(f"methods {method}: {run['error'].strip().splitlines()[-1]}")
                print(f"methods {method}: FAILED\n{run['error']}", flush=True)
            else:
                print(f"methods {method}: round s {[r['round_seconds'] for r in run['rounds']]} "
                      f"({time.perf_counter() - tick:.0f} s)", flush=True)
            save()
    save()
    print(f"wrote {json_path} and {md_path}")
    if failures:  # the report holds what was measured; the exit status says that something was not
        print(f"round_cost: {len(failures)} part(s) or run(s) failed:\n  " + "\n  ".join(failures), file=sys.stderr, flush=True)
        return 1
    return 0


def summary(part: str, r: dict) -> str:
    if part == "text":
        return f"{r['off']['median'] * 1e3:.1f} ms off, {r['on']['median'] * 1e3:.1f} ms on, x{r['speedup']:.2f}"
    if part == "train":
        on = r.get("on", {}).get("images_per_s", float("nan"))
        return f"{r['off']['images_per_s']:.1f} img/s off, {on:.1f} img/s on"
    if part == "eval":
        return f"{r['images_per_s']:.1f} img/s"
    return f"{r['refresh_round']} B in a refresh round"


if __name__ == "__main__":
    sys.exit(main())
