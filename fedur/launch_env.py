"""The launch environment, read in one place: what `fabric run`, torchrun, srun or Fabric's own launcher
told this process, and the Fabric built from it.

`fabric run` passes its flags to the processes it starts as LT_* variables and constructs the process
group when `Fabric(...)` is built; a plain `python fedur/main.py` leaves the launch to `fabric.launch()`.
Before a process group exists, the launcher's variables are the only way to know this process's rank
(so that an error is printed once, by rank 0) and how many processes there will be (so that DDP gets
fedur's timeout). After the launch, `fabric.world_size` and `fabric.global_rank` answer.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from fedur.config import FabricConfig
from fedur.errors import ConfigError

SUPPORTED_PRECISION = {"32-true": "32-true", "32": "32-true", "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed"}


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher set for this process (None: not set)."""

    cli: bool  # started by `fabric run`: the processes and the process group already exist
    is_rank_zero: bool  # the first (or only) process of the job: the one that prints
    world_size: int | None  # processes in the job, when a launcher said so
    accelerator: str | None  # `fabric run --accelerator`, ...
    devices: str | None
    num_nodes: int | None
    strategy: str | None
    precision: str | None
    elastic: bool = False  # started by torchrun itself (not through `fabric run`): its processes already exist
    local_world_size: int | None = None  # torchrun's processes per node

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> LaunchEnv:
        world_size = environ.get("WORLD_SIZE")  # torchrun (`fabric run`), Fabric's own launcher
        if world_size is None and _under_slurm():
            world_size = environ.get("SLURM_NTASKS")
        if "RANK" in environ:
            rank_zero = environ["RANK"] == "0"
        elif _under_slurm() and "SLURM_PROCID" in environ:
            rank_zero = environ["SLURM_PROCID"] == "0"
        else:  # Fabric's own launcher sets LOCAL_RANK (and NODE_RANK) in the processes it starts
            rank_zero = environ.get("LOCAL_RANK", "0") == "0" and environ.get("NODE_RANK", "0") == "0"
        nodes = environ.get("LT_NUM_NODES")
        return cls(
            cli=environ.get("LT_CLI_USED") == "1",
            is_rank_zero=rank_zero,
            world_size=int(world_size) if world_size and world_size.isdigit() else None,
            accelerator=environ.get("LT_ACCELERATOR"),
            devices=environ.get("LT_DEVICES"),
            num_nodes=int(nodes) if nodes else None,
            strategy=environ.get("LT_STRATEGY"),
            precision=environ.get("LT_PRECISION"),
            elastic="TORCHELASTIC_RUN_ID" in environ and environ.get("LT_CLI_USED") != "1",
            local_world_size=int(local) if (local := environ.get("LOCAL_WORLD_SIZE", "")).isdigit() else None,
        )

    def layout(self, settings: FabricConfig) -> tuple[int | str, int]:
        """(devices, num_nodes) for Fabric: the settings', except under torchrun, whose processes exist already: there
        fabric.devices auto is torchrun's processes per node and fabric.num_nodes 1 (the default) its nodes, so that
        `torchrun --nproc-per-node N fedur/main.py ...` needs no fabric flag. A ConfigError when the settings name
        another number of processes than torchrun started."""
        if not self.elastic or self.world_size is None:
            return settings.devices, settings.num_nodes
        per_node = self.local_world_size or self.world_size
        devices = per_node if str(settings.devices) == "auto" else settings.devices
        count = len([d for d in devices.split(",") if d.strip()]) if isinstance(devices, str) and "," in devices else int(devices)
        nodes = max(1, self.world_size // max(count, 1)) if settings.num_nodes == 1 else settings.num_nodes
        if count * nodes != self.world_size:
            raise ConfigError(
                f"torchrun started {self.world_size} processes ({per_node} per node), but fabric.devices={settings.devices} "
                f"x fabric.num_nodes={settings.num_nodes} makes {count * nodes}; leave fabric.devices auto and "
                "fabric.num_nodes 1 (fedur takes torchrun's) or make them match"
            )
        return devices, nodes

    def expected_world_size(self, settings: FabricConfig) -> int:
        """The number of processes this launch will have, known before any process group exists."""
        if self.world_size is not None:
            return self.world_size
        devices = self.devices if self.devices is not None else settings.devices
        if isinstance(devices, str) and "," in devices:
            count = len([d for d in devices.split(",") if d.strip()])
        elif str(devices) in ("auto", "-1"):
            count = torch.cuda.device_count() if self.uses_cuda(settings) else 1
        else:
            count = int(devices)
        return max(count, 1) * (self.num_nodes or settings.num_nodes)

    def uses_cuda(self, settings: FabricConfig) -> bool:
        accelerator = self.accelerator or settings.accelerator
        return accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())

    def precision_error(self) -> str | None:
        """Why `fabric run --precision` cannot be used, or None."""
        if self.precision is None or self.precision in SUPPORTED_PRECISION:
            return None
        return (
            f"precision {self.precision!r} from `fabric run --precision` is not supported; use 32-true or bf16-mixed "
            "(16-mixed keeps one GradScaler per process, which would couple the clients sharing a rank)"
        )

    def resolved_precision(self, settings: FabricConfig) -> str:
        """The precision the run computes in: `fabric run --precision`, else `fabric.precision`, where auto is
        bf16-mixed on a GPU with bf16 units (compute capability 8.0 and later: A100, H100, ...) and 32-true on
        older GPUs (where bf16 is emulated, slower than float32) and on CPU (bf16 matmuls on CPUs without AMX
        are 20-45x slower)."""
        if self.precision is not None:
            return SUPPORTED_PRECISION.get(self.precision, self.precision)
        if settings.precision != "auto":
            return settings.precision
        return "bf16-mixed" if self.uses_cuda(settings) and native_bf16() else "32-true"

    def precision_warning(self, settings: FabricConfig) -> str | None:
        """A warning for bf16-mixed asked for on a GPU that only emulates bf16 (None: nothing to say)."""
        if self.resolved_precision(settings) == "bf16-mixed" and self.uses_cuda(settings) and not native_bf16():
            return ("bf16-mixed on a GPU without bf16 units (compute capability < 8.0) is emulated and slower than "
                    "32-true; fabric.precision auto picks 32-true there")
        return None


def native_bf16() -> bool:
    """Whether the (first visible) GPU computes bf16 natively. Reads the device's properties without creating a
    context on it."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def nccl_environment(environ: dict = os.environ) -> None:
    """Blocking waits for NCCL collectives: a failed or timed-out collective then raises in the thread that
    called it (fedur's one-line error, federated/collectives.py) instead of ending the process from NCCL's
    watchdog thread. fedur reads every exchanged tensor back at once, so nothing overlaps that could be lost."""
    environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")


def _under_slurm() -> bool:
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect()


def make_fabric(settings: FabricConfig, env: LaunchEnv, wait_timeout: float = 10800.0):
    """Fabric, launched, with DDP's process-group timeout set to `wait_timeout`: how long a rank waits in a
    collective for live peers (dead peers are caught sooner by the heartbeat in federated/collectives.py)."""
    from lightning import Fabric
    from lightning.fabric.strategies import DDPStrategy

    if env.uses_cuda(settings):
        nccl_environment()  # read when the process group is made: by Fabric(...) under `fabric run`
    strategy = env.strategy or settings.strategy
    if strategy in ("auto", "ddp", "ddp_spawn") and env.expected_world_size(settings) > 1:
        os.environ.pop("LT_STRATEGY", None)  # `fabric run --strategy ddp`: the same strategy, built here
        strategy = DDPStrategy(
            timeout=timedelta(seconds=wait_timeout), start_method="spawn" if strategy == "ddp_spawn" else "popen"
        )
    devices, num_nodes = env.layout(settings)
    fabric = Fabric(
        accelerator=settings.accelerator,
        strategy=strategy,
        devices=devices,
        num_nodes=num_nodes,
        precision=None if env.precision is not None else env.resolved_precision(settings),  # fabric run's flag wins
    )
    if not env.cli:  # under `fabric run` the processes already exist
        if env.elastic and env.expected_world_size(settings) > 1:
            attempt_process_group(fabric.device, timedelta(seconds=wait_timeout))
        fabric.launch()
    return fabric


def attempt_process_group(device: torch.device, timeout: timedelta, environ: Mapping[str, str] = os.environ) -> bool:
    """Under torchrun with its agent's store (TORCHELASTIC_USE_AGENT_STORE=True, its default): the default process group,
    made here on keys of this attempt's own, before Fabric's launch (which then takes it as it is). Returns whether it
    made the group.

    torchrun's agent serves one TCPStore, at MASTER_ADDR:MASTER_PORT, for the whole job: every attempt it restarts
    (`--max-restarts`) meets the same port and the keys the attempts before it wrote. A gloo or NCCL group publishes
    each rank's address under a key that is named alike in every attempt (default_pg/<group>/...), and a rank reads
    its peers' keys as soon as they exist: a restarted rank that looks before its peer has written again reads the
    killed attempt's address and fails to connect (gloo: "Connection refused"; NCCL: the old unique id), or hangs. Which
    rank looks first is a race, which a group the ranks reach at different times (the heartbeat's,
    federated/collectives.py) loses most. Here every key lives under
    fedur/attempt_<TORCHELASTIC_RESTART_COUNT>: the agent starts an attempt's workers only after the last attempt's
    are gone, and on one node it gives them all the same count, so a rank reads only what this attempt wrote.

    On several nodes each agent counts its own restarts (an agent whose workers were still healthy when another
    node asked for a new rendezvous counts none), so there the count names no attempt: restarts there need a store
    per attempt, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun (with --rdzv-backend c10d), and without it a
    ConfigError stops the run before any compute."""
    import torch.distributed as dist

    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or dist.is_initialized():
        return False  # a store of this attempt's own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), or a group already made
    world_size, per_node = int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"]))
    if world_size != per_node and environ.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
        raise ConfigError(
            f"torchrun restarts on several nodes (--max-restarts {environ['TORCHELASTIC_MAX_RESTARTS']}, {world_size} "
            f"processes, {per_node} per node) need a store per attempt: start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --rdzv-backend c10d (its shared store keeps a killed attempt's "
            "addresses, which the restarted ranks would read), or with --max-restarts 0"
        )
    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout)
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # what Fabric's launch does before it makes the group
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",  # Lightning's choice for the device
        store=dist.PrefixStore(f"fedur/attempt_{attempt}", store),
        rank=int(environ["RANK"]), world_size=world_size, timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    return True


def set_threads(fabric, threads: int | None) -> int:
    """Compute threads per rank from the config, not from the launcher (fabric run sets OMP_NUM_THREADS)."""
    ranks_here = getattr(fabric.strategy, "num_processes", 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # SLURM's cpus
    threads = threads or max(1, cores // ranks_here)
    torch.set_num_threads(threads)
    return threads


def set_determinism(enabled: bool, device: torch.device) -> None:
    """run.deterministic: every kernel of the run deterministic, or a RuntimeError naming the one that is not.

    `torch.use_deterministic_algorithms(True)` strictly (with `warn_only`, kernels without a deterministic
    form warn once and stay nondeterministic); on CUDA also the math attention backend only: the flash,
    memory-efficient and cuDNN kernels of scaled_dot_product_attention (open_clip's attention, fedur's text
    tower) have backward passes whose sums depend on the launch, so a resumed run, a rerun and another
    placement would differ in the last bits. On the CPU the attention kernels are deterministic and stay as
    they are (so are CPU results: bitwise those of earlier versions). CUBLAS_WORKSPACE_CONFIG must be set
    before CUDA starts: `deterministic_environment` does that before the launch.
    """
    if not enabled:
        return
    torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)


def deterministic_environment(enabled: bool, environ: dict = os.environ) -> None:
    """What cuBLAS needs before CUDA starts for deterministic matmuls (a fixed workspace per stream)."""
    if enabled:
        environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def stop_with_launcher(environ: Mapping[str, str] = os.environ) -> bool:
    """Under `fabric run` or torchrun (TORCHELASTIC_RUN_ID set) every rank runs in a process session of its own,
    so killing the launcher's process group (what a terminal or a job runner does) would leave the ranks
    running, finishing the run and racing any resume. Here the kernel ends this rank when its parent, the
    launcher, dies (Linux's parent-death signal; SIGKILL: no more rounds, the committed checkpoints are intact).
    Returns whether the guard is set."""
    if "TORCHELASTIC_RUN_ID" not in environ or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the launcher died before the guard was set
        os.kill(os.getpid(), signal.SIGKILL)
    return True


PR_SET_PDEATHSIG = 1


# CPU kernels choose their vector instructions from the machine; these variables cap the choice at AVX2, so that
# an AVX2 and an AVX-512 machine compute the same bits (docs/learning.md; benchmarks/demo_learning.py sets them).
AVX2_CAP = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def software_environment(device: torch.device, environ: Mapping[str, str] = os.environ,
                         device_name: Callable[[torch.device], str] = torch.cuda.get_device_name) -> dict:
    """What computed the run, for summary.json: the versions, the device, and the CPU's vector instructions.
    Runs that differ here may differ in the last bits of every float (on one machine fedur's runs are bitwise
    reproducible; another CPU or GPU, or another torch, computes its sums in another order). `device_name`
    names a CUDA device (a seam for the tests)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    cuda = device.type == "cuda"
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,  # with its build: 2.14.1+cu130
        **{name: installed(package) for name, package in
           (("lightning", "lightning"), ("open_clip", "open_clip_torch"), ("torchmetrics", "torchmetrics"))},
        "cuda": torch.version.cuda if cuda else None,
        "device": device_name(device) if cuda else device.type,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_isa_caps": {name: environ[name] for name in AVX2_CAP if name in environ},
    }


@dataclass
class Startup:
    """Where this process's time before round 1 goes (summary.json's startup_seconds): wall-clock marks (time.time())
    of its start, of the end of its imports (what a run uses), and the seconds of the phases the round loop times."""

    started: float  # the process's start (Linux: its start time in /proc; elsewhere: when fedur's entry began)
    imported: float | None = None  # the run's modules imported
    phases: dict[str, float] = field(default_factory=dict)  # setup, zero_shot: seconds

    @classmethod
    def now(cls, fallback: float) -> Startup:
        """From this process's start where the system tells it, else from `fallback`."""
        return cls(process_start() or fallback)

    @contextlib.contextmanager
    def timing(self, phase: str):
        """The seconds of what runs inside, as the phase's."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] = time.perf_counter() - begin

    def seconds(self, until: float) -> dict[str, float]:
        """{imports, setup, zero_shot, other, total}: seconds up to `until` (round 1's start); other is the rest
        (parsing, the launch, the run directory, the files written before round 1)."""
        total = until - self.started
        imports = 0.0 if self.imported is None else self.imported - self.started
        parts = {"imports": imports, "setup": self.phases.get("setup", 0.0), "zero_shot": self.phases.get("zero_shot", 0.0)}
        return {**parts, "other": total - sum(parts.values()), "total": total}


def process_start() -> float | None:
    """The wall-clock time this process started (Linux: from /proc, to 10 ms); None where it cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: the start, in clock ticks since boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
