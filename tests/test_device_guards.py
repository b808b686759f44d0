"""What a GPU run relies on, checked on the CPU through seams: a stub Fabric whose device is `meta` (meta and CPU
tensors refuse to mix, as CUDA and CPU tensors do, so a tensor left on the CPU is an error here too), a
recording communicator for the collectives, and the settings a CUDA run makes (determinism, precision)."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
import torch

from fedur import plugins
from fedur.app.cli import parse_config
from fedur.config import FabricConfig
from fedur.federated.client import ClientState
from fedur.federated.collectives import CollectiveError, Collectives, DeviceMemoryError
from fedur.labels.base import PseudoLabels
from fedur.launch_env import LaunchEnv, deterministic_environment, nccl_environment, set_determinism
from fedur.methods import GDAU
from fedur.model.precision import full_precision
from fedur.train.progress import QUIET
from fedur.train.run_dir import RunDir
from fedur.train.setup import setup

pytestmark = pytest.mark.slow  # the fast lane stays under a minute: this module's checks run in the full suite

META = torch.device("meta")


class StubFabric:
    """The part of Fabric that setup() and a training step use, on one rank, with `device` as the accelerator."""

    world_size, global_rank, node_rank, local_rank, is_global_zero = 1, 0, 0, 0, True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextlib.contextmanager
    def rank_zero_first(self):
        yield

    def to_device(self, data):
        return tuple(t.to(self.device) for t in data) if isinstance(data, tuple) else data.to(self.device)

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def all_reduce(self, *args, **kwargs):
        raise AssertionError("one rank: no collective")

    all_gather = all_reduce

    def barrier(self, name=None):
        pass


@functools.cache
def rank_on(device: torch.device, *overrides: str):
    """A rank of configs/tiny.yaml set up on `device` (one per method for the module: each test sets the clients'
    state it reads). Without the frozen-feature cache: a meta tower computes no features to cache
    (`test_cached_rows_reach_the_device_in_every_pass_that_reads_them` hands a meta rank a CPU rank's)."""
    cfg = parse_config(["--config", "configs/tiny.yaml", "--run.clients_per_step", "2", "--data.feature_cache", "false",
                        *overrides])
    fabric = StubFabric(device)
    return setup(fabric, Collectives(fabric), cfg, QUIET)[0]


def test_setup_moves_the_model_to_the_device_and_keeps_the_clients_on_the_cpu():
    """A CUDA run stopped at start-up: the zero-shot text features were computed with the tokens on the device
    and CLIP's weights still on the CPU."""
    rank = rank_on(META)
    assert {p.device for p in rank.tuner.parameters()} == {META} and {b.device for b in rank.tuner.buffers()} == {META}
    assert rank.model.zero_shot_text.device == META
    assert {t.device.type for c in rank.clients for t in c.pieces.values()} == {"cpu"}  # between rounds: the CPU


def pseudo_labelled(client: ClientState, num_classes: int, count: int) -> None:
    labels = torch.arange(count) % num_classes
    client.pseudo_labels = PseudoLabels(torch.arange(count), labels, torch.zeros(count, num_classes, dtype=torch.bool),
                                        confidence=torch.linspace(1, 0.5, count))


# Every one of fedur's methods that trains, but FedOTP: its transport plan stops on a value read back from the device,
# which a meta tensor does not hold.
TRAINING = [cls.__name__ for cls in plugins.builtin("method") if cls.trains and cls.__name__ != "FedOTP"]


@pytest.mark.parametrize("method", TRAINING)
@pytest.mark.parametrize("group", [1, 2], ids=["alone", "grouped"])
def test_a_training_step_of_every_method_runs_on_the_device(method, group):
    """Forward and backward of one step, one client alone and two in one fused step, with every tensor the step
    reads on the device: prompts, batches, class weights, the method's own state (pFedPrompt's cache)."""
    rank = rank_on(META, "--method", method)
    tuner, clients = rank.tuner, rank.clients[:group]
    for client in clients:
        pseudo_labelled(client, rank.model.num_classes, 6)
        if method == "PFedPrompt":  # its cache, as after_refresh builds it (on the CPU, with the client)
            client.extra = {"cache_keys": torch.nn.functional.normalize(torch.randn(4, rank.model.zero_shot_text.shape[1])),
                            "cache_labels": torch.arange(4) % 2, "cache_rows": torch.arange(4)}
    on_device = [c.on(META) for c in clients]
    names = tuner.trained_names(clients[0].pieces)
    prompts = [{n: t.clone().requires_grad_(n in names) for n, t in c.pieces.items()} for c in on_device]
    batches = [(torch.zeros(3, 3, 32, 32, dtype=torch.uint8, device=META), torch.zeros(3, dtype=torch.long, device=META),
                torch.zeros(3, rank.model.num_classes, dtype=torch.bool, device=META), torch.arange(3, device=META))
               for _ in clients]
    rank.model.train()  # a training step, as train_unit runs it (the methods' hooks read `model.training`)
    try:
        outs = tuner.training_step(batches, prompts, on_device, torch.ones(rank.model.num_classes, device=META))
    finally:
        rank.model.eval()
    torch.stack([o["loss"] for o in outs]).sum().backward()
    assert all(p[n].grad is not None and p[n].grad.device == META for p in prompts for n in names)


@pytest.mark.parametrize("method", [cls() for cls in plugins.builtin("method") if cls.__name__ != "FedOTP"],
                         ids=lambda m: type(m).__name__)
def test_the_logits_of_every_method_without_training_run_on_the_device(method):
    rank = rank_on(META, "--method", type(method).__name__)
    client = rank.clients[0]
    dim, classes = rank.model.zero_shot_text.shape[1], rank.model.num_classes
    if isinstance(method, GDAU):  # the classifier it downloads after the first round
        client.extra = {"gda_W": torch.zeros(classes, dim, dtype=torch.float64), "gda_b": torch.zeros(classes, dtype=torch.float64)}
    device_client = client.on(META)
    with torch.no_grad():
        text = rank.method.text_side(rank.model, device_client.pieces)
        logits = rank.method.logits(rank.model, torch.zeros(2, 3, 32, 32, dtype=torch.uint8, device=META),
                                    device_client.pieces, text, device_client, None)
    assert logits.shape == (2, classes) and logits.device == META


FROZEN = ["PromptFL", "PFedPrompt", "FedTPG", "FedCoCoOp", "PFedMoAP", "FedPHA", "GDAU"]  # a tower without a prompt


@pytest.mark.parametrize("method", FROZEN)
def test_cached_rows_reach_the_device_in_every_pass_that_reads_them(method):
    """The frozen-feature cache's rows, read on the CPU (a CPU rank built the cache), go to the device with the batch:
    a training step of two clients (one fused step where the class keeps the base's logits), and the logits."""
    cpu = rank_on(torch.device("cpu"), "--method", method, "--data.feature_cache", "true")
    rank = rank_on(META, "--method", method)
    assert cpu.tower == "features" and rank.reads() is None
    rank.features, rank.tower = cpu.features, cpu.tower
    clients = rank.clients[:2]
    for client in clients:
        pseudo_labelled(client, rank.model.num_classes, 6)
    on_device = [c.on(META) for c in clients]
    names = rank.tuner.trained_names(clients[0].pieces)
    prompts = [{n: t.clone().requires_grad_(n in names) for n, t in c.pieces.items()} for c in on_device]
    rows = [rank.features.batch("train", c.train_indices[:3], rank.reads()) for c in clients]
    batches = [rank.fabric.to_device((x, torch.zeros(3, dtype=torch.long, device="cpu"),
                                      torch.zeros(3, rank.model.num_classes, dtype=torch.bool, device="cpu"),
                                      torch.arange(3, device="cpu"))) for x in rows]
    assert all(b[0].features.device == META for b in batches)
    if rank.method.trains:
        rank.model.train()
        try:
            outs = rank.tuner.training_step(batches, prompts, on_device, torch.ones(rank.model.num_classes, device=META))
        finally:
            rank.model.eval()
        torch.stack([o["loss"] for o in outs]).sum().backward()
        assert all(p[n].grad is not None and p[n].grad.device == META for p in prompts for n in names)
    with torch.no_grad():
        text = rank.method.text_side(rank.model, on_device[0].pieces)
        logits = rank.method.logits(rank.model, batches[0][0], on_device[0].pieces, text, on_device[0], None)
    assert logits.shape == (3, rank.model.num_classes) and logits.device == META


def test_a_client_on_the_device_is_a_copy_and_its_checkpoint_state_is_moved_to_the_cpu():
    client = ClientState(0, np.arange(3), np.arange(2), {"visual": torch.zeros(2)}, extra={"cache_keys": torch.ones(2)})
    moved = client.on(META)
    assert moved.pieces["visual"].device == META and moved.extra["cache_keys"].device == META
    assert client.pieces["visual"].device.type == "cpu" and client.extra["cache_keys"].device.type == "cpu"
    client.optimizer_state = {0: {"momentum_buffer": torch.zeros(2, device=META)}}  # SGD's state of a device run
    with pytest.raises(NotImplementedError, match="meta"):  # a copy to the CPU is attempted (meta has no data)
        client.state_dict()
    client.optimizer_state = {0: {"momentum_buffer": torch.ones(2)}}
    state = client.state_dict()["optimizer_state"]
    assert torch.equal(state[0]["momentum_buffer"], torch.ones(2))
    assert state[0]["momentum_buffer"] is not client.optimizer_state[0]["momentum_buffer"]


# ---------------------------------------------------------------- collectives, through the Communicator seam

NCCL_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool}


class RecordingComm:
    """A communicator for two ranks whose peer contributes nothing (zeros to every sum, its signature equal to
    this rank's), recording every tensor handed to a collective. Results come back as CPU tensors of the right
    shape, so the `device` may be one that holds no data (meta)."""

    world_size, global_rank = 2, 0

    def __init__(self, device: torch.device) -> None:
        self.device, self.handed = device, []

    def _record(self, kind: str, data: torch.Tensor) -> None:
        self.handed.append((kind, data.device, data.is_contiguous(), data.dtype, tuple(data.shape)))

    def _host(self, data: torch.Tensor) -> torch.Tensor:
        return torch.zeros(data.shape, dtype=data.dtype) if data.device.type == "meta" else data.detach().clone()

    def all_reduce(self, data, group=None, reduce_op="mean"):
        assert reduce_op == "sum", reduce_op  # fabric's default is the mean
        self._record("all_reduce", data)
        return self._host(data)

    def all_gather(self, data, group=None, sync_grads=False):
        self._record("all_gather", data)
        return torch.stack([self._host(data)] * self.world_size)

    def barrier(self, name=None):
        pass

    def check(self) -> None:
        assert self.handed, "no collective was called"
        for kind, device, contiguous, dtype, shape in self.handed:
            assert device == self.device and contiguous and dtype in NCCL_DTYPES, (kind, device, contiguous, dtype, shape)


def test_every_tensor_a_collective_is_handed_is_on_the_communicators_device():
    comm = RecordingComm(META)
    collectives = Collectives(comm)
    rows = collectives.gather_clients({0: torch.ones(3, 2)[:, 0]}, 4, like=torch.zeros(3), what="a strided value")
    assert rows.device.type == "cpu" and rows.shape == (4, 3)
    collectives.gather_clients({1: torch.ones(2, dtype=torch.int64)}, 3, like=torch.zeros(2, dtype=torch.int64), what="counts")
    assert collectives.gather_ranks(torch.tensor([0, 1]), what="placement").shape == (2, 2)
    assert collectives.max_over_ranks(3, what="stop request") == 0  # meta holds no values: the fake peer sums zeros
    comm.check()
    with pytest.raises(CollectiveError, match="complex64"):  # NCCL has no complex sums: refused before any call
        collectives.gather_clients({}, 2, like=torch.zeros(1, dtype=torch.complex64), what="spectra")
    with pytest.raises(CollectiveError, match="client 0 sends"):
        collectives.gather_clients({0: torch.zeros(2, dtype=torch.float64)}, 2, like=torch.zeros(2), what="prompt")


class FailingComm(RecordingComm):
    """NCCL reports a failure when the result is used (its copy to the host), or runs out of memory."""

    def __init__(self, failure: Exception, late: bool) -> None:
        super().__init__(torch.device("cpu"))
        self.failure, self.late = failure, late

    def all_reduce(self, data, group=None, reduce_op="mean"):
        if not self.late:
            raise self.failure
        failure = self.failure

        class Pending(torch.Tensor):
            def cpu(self):
                raise failure
        return data.as_subclass(Pending)


@pytest.mark.parametrize("late", [False, True], ids=["in the call", "at the copy to the host"])
def test_a_collective_that_fails_is_fedurs_one_line_and_out_of_memory_is_not_a_dead_peer(late):
    collectives = Collectives(FailingComm(RuntimeError("NCCL error: remote process exited"), late))
    collectives._agree = lambda what, tensor: None  # the signature exchange succeeds
    with pytest.raises(CollectiveError, match="a peer died") as err:
        collectives.gather_clients({}, 2, like=torch.zeros(2), what="visual uploads")
    assert not isinstance(err.value, DeviceMemoryError)
    collectives = Collectives(FailingComm(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.70 GiB"), late))
    collectives._agree = lambda what, tensor: None
    with pytest.raises(DeviceMemoryError, match="visual uploads ran out of device memory on rank 0 .*4.70 GiB"):
        collectives.gather_clients({}, 2, like=torch.zeros(2), what="visual uploads")


@pytest.mark.slow  # whole runs
@pytest.mark.parametrize("method", [cls.__name__ for cls in plugins.builtin("method")])
def test_every_collective_of_a_run_takes_tensors_nccl_accepts(tmp_path, monkeypatch, method):
    """A whole (tiny) run as rank 0 of two whose peer hosts clients that contribute nothing: every tensor the
    round loop hands a collective is contiguous, of a dtype NCCL takes, on the communicator's device."""
    import fedur.train.fit as fit_module

    recording = {}

    class Recorded(Collectives):
        def __init__(self, comm, peer_timeout=None):
            recording["comm"] = comm
            super().__init__(comm, peer_timeout)

    class TwoRankStub(RecordingComm, StubFabric):  # rank 0 of two: the recording collectives, the stub's rest
        def __init__(self):
            RecordingComm.__init__(self, torch.device("cpu"))

        strategy = None

    monkeypatch.setattr(fit_module, "Collectives", Recorded)
    cfg = parse_config(["--config", "configs/tiny.yaml", "--method", method, "--federation.rounds", "2",
                                     "--run.output_dir", str(tmp_path / "run"), "--run.progress", "false"])
    fit_module.fit(TwoRankStub(), cfg, RunDir(tmp_path / "run"))
    comm = recording["comm"]
    comm.check()
    assert {kind for kind, *_ in comm.handed} == {"all_reduce", "all_gather"}


# ---------------------------------------------------------------- no tensor made without saying where

ROUND_PATH = ("train", "channel", "methods", "labels", "federated", "model", "privacy")  # fedur/data and the demo model's trainer are not
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "eye", "rand", "randn", "randint",
             "linspace", "randperm"}


def test_every_tensor_the_round_path_makes_names_its_device():
    """A tensor made without a device lands on the CPU: in the round path each one says where it goes, the
    accelerator (`device=x.device`) or the CPU by design (`device="cpu"`: host-side bookkeeping, pseudo-label
    math on CPU predictions, what a collective sends after moving it)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "fedur"
    missing = []
    for folder in ROUND_PATH:
        for path in sorted((package / folder).rglob("*.py")):
            if path.name == "demo_clip.py":  # trains the demo CLIP offline, not part of a run
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                        and not any(k.arg in ("device", None) for k in node.keywords)):
                    missing.append(f"{path.relative_to(package.parent)}:{node.lineno}: torch.{node.func.attr}")
    assert not missing, "tensors made without a device:\n" + "\n".join(missing)


# ---------------------------------------------------------------- settings a CUDA run makes

@pytest.fixture
def restore_global_settings():
    state = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
             torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    yield
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    for enable, on in zip((torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.enable_mem_efficient_sdp,
                           torch.backends.cuda.enable_cudnn_sdp, torch.backends.cuda.enable_math_sdp), state[2:]):
        enable(on)


def test_a_deterministic_cuda_run_uses_strictly_deterministic_kernels_and_math_attention(restore_global_settings):
    """With warn_only, the flash and memory-efficient attention backward kernels warned once and stayed
    nondeterministic: a resumed GPU run was not bitwise the uninterrupted one."""
    set_determinism(True, torch.device("cuda", 0))
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cuda.math_sdp_enabled()
    assert not (torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled()
                or torch.backends.cuda.cudnn_sdp_enabled())
    environ = {}
    deterministic_environment(True, environ)
    nccl_environment(environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_a_cpu_run_keeps_its_attention_kernels(restore_global_settings):
    set_determinism(True, torch.device("cpu"))  # CPU kernels are deterministic: CPU results stay bitwise the same
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cuda.flash_sdp_enabled()


def test_precision_auto_is_bf16_only_on_gpus_with_bf16_units(monkeypatch):
    env, auto = LaunchEnv.read({}), FabricConfig(accelerator="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)  # a V100
    assert env.resolved_precision(auto) == "32-true" and env.precision_warning(auto) is None
    assert "emulated" in env.precision_warning(FabricConfig(accelerator="cuda", precision="bf16-mixed"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100 or later
    assert env.resolved_precision(auto) == "bf16-mixed" and env.precision_warning(auto) is None
    assert env.resolved_precision(FabricConfig(accelerator="cpu")) == "32-true"


@pytest.mark.parametrize("api", ["legacy", "per backend"])
def test_full_precision_sections_pin_ieee_float32_matmuls_and_restore_the_setting(api):
    """Lightning's Tensor Core hint invites `torch.set_float32_matmul_precision('high')` (TF32 on a GPU, bf16
    passes on a CPU with AMX); the logits, transport plans and caches must stay float32 inside."""
    backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)
    saved = [b.fp32_precision for b in backends]
    try:
        if api == "legacy":
            torch.set_float32_matmul_precision("high")
            with full_precision("cpu"):
                assert torch.get_float32_matmul_precision() == "highest"
            assert torch.get_float32_matmul_precision() == "high"
        else:
            torch.backends.cuda.matmul.fp32_precision = "tf32"  # the newer switches: the legacy getter now refuses
            with full_precision("cuda"):
                assert [b.fp32_precision for b in backends] == ["ieee", "ieee"]
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        for backend, value in zip(backends, saved):
            backend.fp32_precision = value
        torch.set_float32_matmul_precision("highest")
    with torch.autocast("cpu", dtype=torch.bfloat16), full_precision("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with full_precision("meta"):  # a device type without autocast
        pass
