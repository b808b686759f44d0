"""A client's peak memory, estimated before any compute: the run's model, method and batch on fake tensors.

torch's FakeTensorMode gives every tensor a meta storage (a shape and a dtype, no memory, no compute); the model is
built there (open_clip's skeleton with the run's tokenizer, class prompts and prompt slots), then one local training
step of a unit (run.clients_per_step clients, optim.batch_size images each: the method's text side and logits, a
cross-entropy, the backward, SGD's momentum for the trained pieces) and one evaluation pass (optim.eval_batch_size
images, no gradient) run on it, under the run's precision (bf16-mixed: CPU autocast to bfloat16, which casts the same
matmuls and convolutions to bfloat16 as CUDA's). `LiveBytes` counts the bytes of every tensor storage while it is
alive (views share their storage), the frozen weights included, and keeps the peak: what the allocator must hold at
least. On a GPU add the CUDA context and cuBLAS workspace (a few hundred MiB) and the caching allocator's rounding.

A method whose forward reads its tensors' values (FedOTP's Sinkhorn stops on a tolerance, a cache indexes by labels)
cannot run on fake tensors: its estimate is the base forward's with its pieces, and says so. benchmarks/
memory_estimate.py compares the estimates with peaks measured on the CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from fedur.federated.client import ClientState
from fedur.methods import forward
from fedur.methods.base import Method
from fedur.methods.pieces import initial_values

GIB = 1024**3


class LiveBytes(TorchDispatchMode):
    """The bytes of every tensor storage alive that an op in its context created (or `add`ed), and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.now = self.peak = 0

    def add(self, tensor: Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self.live:
            return
        size = storage.nbytes()
        self.live[storage] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._freed, size)

    def _freed(self, size: int) -> None:
        self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, Tensor):
                self.add(item)
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """A unit's peak memory in bytes: a training step's and an evaluation pass's, both with the frozen weights."""

    train_bytes: int
    eval_bytes: int
    weights_bytes: int
    batch: int  # images per training step of the unit (clients_per_step x optim.batch_size)
    eval_batch: int
    precision: str
    checkpointing: bool
    forward: str  # whose forward was run: the method's, or the base's where the method's cannot run on fake tensors

    @property
    def peak_bytes(self) -> int:
        return max(self.train_bytes, self.eval_bytes)

    def as_dict(self) -> dict:
        return {**asdict(self), "peak_bytes": self.peak_bytes}

    def describe(self) -> str:
        checkpointed = ", activations checkpointed" if self.checkpointing else ""
        return (f"peak memory per client (estimated before any compute, {self.forward}): {self.peak_bytes / GIB:.2f} GiB "
                f"(training step of {self.batch} images {self.train_bytes / GIB:.2f} GiB, evaluation of {self.eval_batch} "
                f"{self.eval_bytes / GIB:.2f} GiB; weights {self.weights_bytes / GIB:.2f} GiB; {self.precision}{checkpointed}); "
                "a GPU adds its context and allocator rounding")


@dataclass(frozen=True)
class ModelSpec:
    """What builds the run's model (the `model:` settings and the class names), as plain values."""

    name: str
    classnames: tuple[str, ...]
    n_ctx: int
    visual_tokens: int
    visual_depth: int | None
    init_std: float = 0.02
    ctx_suffix: str = ""
    shared_prefix_text: bool = True
    checkpointing: bool = False


def estimate_memory(spec: ModelSpec, method: Method, batch: int, eval_batch: int, clients_per_step: int = 1,
                    precision: str = "32-true", seed: int = 1) -> MemoryEstimate:
    """The peak memory of one training step of `clients_per_step` clients with `batch` images each and of one
    evaluation pass of `eval_batch` images (module docstring), for the open_clip model `spec.name` (its config
    registered). Runs on fake tensors: no memory, no compute; seconds for ViT-H/14."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fedur.model.classifier import PromptedCLIP
    from fedur.model.clip import fake_clip
    from fedur.model.text_tower import plan_shared_prefix

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    clip = fake_clip(spec.name, fake)
    # built outside the mode: the tokenizer's ids and the prompts' inits are real (small), whatever meets the fake
    # weights is fake
    model = PromptedCLIP(clip, list(spec.classnames), spec.n_ctx, spec.visual_tokens, spec.visual_depth, spec.init_std,
                         seed, spec.ctx_suffix)
    model.shared_prefix_text, model.checkpointing = spec.shared_prefix_text, spec.checkpointing
    start = initial_values(method.pieces(), model, seed)
    if model.prefix_reason is None:
        plan_shared_prefix(model.text, model.host_tokens, model.n_shared, torch.device("cpu"))
    return measure(model, method, start, Workload(clients_per_step, batch, eval_batch, clip.image_size), precision, fake)


@dataclass(frozen=True)
class Workload:
    """What a unit puts through the model: its clients, each one's training batch, the evaluation batch, the images'
    side."""

    clients: int
    batch: int
    eval_batch: int
    image_size: int


def measure(model, method: Method, start: dict[str, Tensor], work: Workload, precision: str, mode=None) -> MemoryEstimate:
    """The peaks of a unit's training step and of an evaluation pass of `model` (a PromptedCLIP) with `method`'s
    forward from its pieces' initial values `start`, counted by `LiveBytes` inside `mode` (a FakeTensorMode: the
    estimate; None: real tensors, a measurement). The base forward where the method's cannot run in `mode`."""
    tracker = LiveBytes()
    for tensor in [*model.parameters(), *model.buffers(), *start.values()]:
        tracker.add(tensor)
    weights = tracker.now
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    trained = [name for name, piece in method.pieces().items() if piece.trains and start[name].numel()]
    whose = f"{type(method).__name__}'s forward"
    for attempt in (method, Method()):  # the base forward where the method's reads its tensors' values
        try:
            with mode or contextlib.nullcontext(), tracker, autocast:
                tracker.peak = tracker.now
                train = _train_step(model, attempt, start, trained, work, tracker)
                tracker.peak = tracker.now
                evaluate = _eval_pass(model, attempt, start, work, tracker)
            break
        except Exception as err:  # noqa: BLE001  a data-dependent op on fake tensors: the base forward instead
            if attempt is not method:
                raise
            whose = f"the base forward with {type(method).__name__}'s pieces ({type(err).__name__} on fake tensors)"
    return MemoryEstimate(train, evaluate, weights, work.clients * work.batch, work.eval_batch, precision,
                          model.checkpointing, whose)


def _train_step(model, method: Method, start: dict[str, Tensor], trained: list[str], work: Workload,
                tracker: LiveBytes) -> int:
    """The peak of a unit's training step: each client's batch, pieces being trained, logits, cross-entropy, backward,
    SGD's momentum (one buffer per trained piece) and its update."""
    model.train()
    try:
        clients, batch, size = work.clients, work.batch, work.image_size
        pieces = [{n: (v.clone().requires_grad_(True) if n in trained else v) for n, v in start.items()} for _ in range(clients)]
        images = [torch.zeros(batch, 3, size, size, device="cpu") for _ in range(clients)]  # (fake tensors)
        states = [ClientState(k, None, None, dict(start)) for k in range(clients)]
        texts = forward.text_sides(method, model, pieces)
        logits = forward.group_logits(method, model, images, pieces, texts, states)
        labels = torch.zeros(batch, dtype=torch.long, device="cpu")
        loss = sum(F.cross_entropy(part.float(), labels) for part in logits)
        loss.backward()
        for p in pieces:
            for name in (n for n in trained if p[n].grad is not None):  # (the base forward reads a method's own pieces not)
                momentum = torch.zeros_like(p[name])
                momentum.add_(p[name].grad)
                p[name].detach().add_(momentum, alpha=-0.1)
        return tracker.peak
    finally:
        model.eval()


def _eval_pass(model, method: Method, start: dict[str, Tensor], work: Workload, tracker: LiveBytes) -> int:
    """The peak of an evaluation (or pseudo-labelling) pass: the text side once, one batch's logits, no gradient."""
    with torch.no_grad():
        state = ClientState(0, None, None, dict(start))
        images = torch.zeros(work.eval_batch, 3, work.image_size, work.image_size, device="cpu")
        logits = method.logits(model, images, start, method.text_side(model, start), state)
        logits.argmax(dim=1)
    return tracker.peak
