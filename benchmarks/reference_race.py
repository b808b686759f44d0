"""fedur against the reference code (FedCoPL, krumpguo/FedCoPL), side by side, on identical work.

One federated round of FedCoPL on the same CIFAR-10 JPEGs, with the same random ViT-B/32 weights, the same
split across clients and the same pseudo-label selections, run as separate processes in turn (reference,
fedur cold, fedur warm, reference, ...). fedur runs with its caches cold (a new cache folder: every image decoded
and its frozen features computed before round 1) and warm (the folder its cold run of the pair left: what every
later run of the same data and model finds), `--fedur-cache`. Per side: the whole process (wall), the time before round 1 and the round's
phases (refresh, train, aggregate, evaluate); the report gives fedur / reference per phase (medians over the
pairs) and exits non-zero when a side fails or the two did different work.

    python benchmarks/reference_race.py --reference /path/to/FedCoPL --reference-python /work/venv-ref/bin/python
    python benchmarks/reference_race.py --reference ... --smoke          # a tiny CLIP, 50/20 images, 2 clients

The reference's own code runs unedited (none of it is copied here). It is started through this file
(`--_reference-child`, with the reference's interpreter), which patches the reference in memory to run
here (the patches are listed in the report and in benchmarks/results/reference_race/README.md, with the
setup of the reference's environment) and times its functions:

  refresh    from its "Global Round 0" log line (methods/main_UL.py:417) to "Trian for client 0" (:528):
             zero-shot labelling of every client's train images, the filters, the quotas, the selection
  train      from "Trian for client 0" to the call of `average_weights` (:550): every client's local epochs
  aggregate  `average_weights` (:550)
  evaluate   from the end of `average_weights` to "The avg local test acc in round 0" (:558): every client's
             test images with the global visual prompt and its own text prompt
  round      "Global Round 0" to "The avg local test acc"

fedur's phases are its own `phase_seconds` and `round_seconds` (<run>/metrics.jsonl). The round's end is the
time metrics.jsonl was written (its mtime, written once for one round), its start that minus round_seconds;
"before round 1" runs from the process's start (this script's clock just before it starts the process) to
the round's start, the same for both sides; "after" from the round's end to the process's exit.

Identical work, and how it is made identical (the report checks the first two and says the rest):
- images: the first n/C files (sorted names) of every class folder of cifar10-jpg.tar.gz, train and test, in
  one folder that both read: the reference's layout (class_names.txt, train.txt, test.txt, train/, test/ under
  DATASET_DIR/cifar10) is fedur's ImageFolder layout plus three text files.
- the split: the reference's noniid (Dirichlet 0.1) from its random sequence; fedur replays it with
  `--federation.partition_seed reference`. That replay includes the reference's discarded class-name draw
  (utils/prepare_data.py:142-145) only for a dataset whose key is "cifar10", and fedur's ImageFolder's key is
  "imagefolder" (plain RandomState(500): another split). So fedur reads the folder through
  `ReferenceCIFAR10Folder` below: fedur's ImageFolder under the key "cifar10" (--dataset
  reference_race.ReferenceCIFAR10Folder, with benchmarks/ on PYTHONPATH).
- the weights: one random init saved once in OpenAI's format (a float16 state dict, OpenAI's key names);
  the reference's `clip.load(path)` (VIS_ENCODER=path) and fedur's `--model.pretrained path` load it; fedur's
  model name is ViT-B-32-quickgelu (OpenAI's CLIP uses QuickGELU; open_clip's plain ViT-B-32 uses GELU).
- the pseudo-labels: zero-shot CLIP, the median confidence and entropy filters, M = ceil(sum u / C), the
  quotas in the reference's float32 (`--labeller.quota_arithmetic reference`), the top-quota selection.
- the round: one round, `--epochs` local epochs (default 1: the reference's EPOCHS), batch 64 for training,
  labelling and testing (the reference's BATCH_SIZE and its hard-coded 64), lr 0.1, SGD momentum 0.9, weight
  decay 0.05, cosine over 5 x epochs, fp32, `--threads` CPU threads, momentum carried from client to client
  (`--optim.optimizer_state shared`, as the reference's one optimizer); fedur also tests its server's model
  (its default `--evaluation.global_model true`, unless --global-model off), which the reference does not: fedur
  scores it in the clients' own pass (docs/performance.md).
- what cannot be switched off in fedur: its zero-shot test of every client before round 1
  (fedur/train/fit.py, `record_zero_shot`), which the reference does not do; it falls in "before round 1". With a
  warm cache it reads the frozen features (data.feature_cache), as the round's zero-shot refresh does.

Results: <out>/<name>.md and .json (name: cpu, cpu-smoke, or --name); the runs' files under --work (a
temporary folder, removed unless --keep-work).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
DEFAULT_ARCHIVE = Path(os.environ.get("FEDUR_SHARED_DIR") or REPO.parent / "shared") / "data" / "cifar10-jpg.tar.gz"
DEFAULT_OUT = HERE / "results" / "reference_race"
PHASES = ("before_round1", "refresh", "train", "aggregate", "evaluate", "round", "after", "wall")
REFERENCE_CONFIG = "FedCoPL_config_PLL.yml"  # methods_config/, as run-textPT_ALL.sh passes it
REFERENCE_MODEL = "our_dual_local_prompt"  # the branch of methods/main_UL.py:390 that runs FedCoPL
SMOKE_MODEL = {  # a narrow CLIP with OpenAI's shapes where the reference needs them (see make_weights)
    "embed_dim": 64,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 12, "head_width": 64, "mlp_ratio": 4.0},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2, "mlp_ratio": 4.0},
}
SMOKE_MODEL_NAME = "race-smoke-clip"
BUSY_SHARE = 0.1  # other processes' share of the cores above which a run's times are flagged as not clean

if __name__ != "__main__":  # imported by fedur's CLI for --dataset reference_race.ReferenceCIFAR10Folder
    from fedur.data.datasets import ImageFolder

    class ReferenceCIFAR10Folder(ImageFolder):
        """fedur's ImageFolder under the key "cifar10", so that `federation.partition_seed reference` replays
        FedCoPL's CIFAR-10 random sequence (its class-name draw included) on these folders.

        Args:
            root: Dataset directory holding train/<class>/ and test/<class>/ image folders.
        """

        key = "cifar10"

        def __init__(self, root: str | None = None):
            super().__init__(root)

        def load(self, seed: int):
            dataset = super().load(seed)
            dataset.name = self.key
            return dataset


# ---------------------------------------------------------------------------------------------------------
# The reference's side: runs in the reference's interpreter, in its checkout, with the patches it needs here.
# ---------------------------------------------------------------------------------------------------------


def install_reference_patches(spec: dict) -> list[str]:
    """Patch what the reference needs to run on this Python / torch, in memory; return what was patched."""
    import types

    done = []
    try:
        import pkg_resources  # noqa: F401
    except ImportError:  # clip/clip.py:6 `from pkg_resources import packaging`; setuptools >= 81 has no pkg_resources
        import packaging.version

        sys.modules["pkg_resources"] = types.SimpleNamespace(packaging=packaging)
        done.append("pkg_resources: a stand-in module holding `packaging` (clip/clip.py:6 imports "
                    "`from pkg_resources import packaging`; the setuptools here has no pkg_resources)")

    import torch

    jit_load = torch.jit.load

    @functools.wraps(jit_load)
    def rewinding_jit_load(f, *args, **kwargs):
        position = f.tell() if hasattr(f, "tell") else None
        try:
            return jit_load(f, *args, **kwargs)
        except Exception:
            if position is not None:
                f.seek(position)
            raise

    torch.jit.load = rewinding_jit_load
    done.append("torch.jit.load rewinds the file when it fails: clip/clip.py:129 tries the weights as a TorchScript "
                "archive and then, on the same open file, torch.load (:136), which torch 2.x starts at the end of "
                "the file (EOFError)")

    import inspect

    from torch.optim import lr_scheduler

    if "verbose" not in inspect.signature(lr_scheduler.LambdaLR.__init__).parameters:
        lambda_init = lr_scheduler.LambdaLR.__init__

        @functools.wraps(lambda_init)
        def init_without_verbose(self, *args, verbose=None, **kwargs):
            lambda_init(self, *args, **kwargs)

        lr_scheduler.LambdaLR.__init__ = init_without_verbose
        done.append("LambdaLR accepts and ignores `verbose`: utils/schedulers.py:47 passes verbose=True, which "
                    "torch removed")

    workers = spec.get("num_workers")
    if workers is not None:
        from torch.utils.data import DataLoader

        loader_init = DataLoader.__init__

        @functools.wraps(loader_init)
        def init_with_workers(self, *args, **kwargs):
            kwargs["num_workers"] = workers
            loader_init(self, *args, **kwargs)

        DataLoader.__init__ = init_with_workers
        done.append(f"DataLoader num_workers={workers} (--reference-workers) instead of the code's 8 or 6")
    return done


def reference_child(spec_path: str) -> int:
    """The reference's run: methods/main_UL.py's main() as run_main.py calls it, its functions timed."""
    started = time.time()
    spec = json.loads(Path(spec_path).read_text())
    out_path = Path(spec["result"])
    record: dict = {"child_started": started, "events": [], "timers": {}, "split": None, "estimated": [],
                    "quotas": [], "selection": [], "accuracy": [], "patches": [], "error": None}

    def write() -> None:
        out_path.write_text(json.dumps(record))

    try:
        os.environ.update(spec["env"])
        os.chdir(spec["reference"])  # the config is read from methods_config/ relative to the working directory
        sys.path.insert(0, spec["reference"])
        sys.argv = ["run_main.py", "--model_config", REFERENCE_CONFIG]
        record["patches"] = install_reference_patches(spec)
        import logging

        marks = (
            ("------------------------Global Round ", "round_start"),
            ("--------------------------Trian for client ", "train_client"),
            ("The local test acc of client ", "tested_client"),
            ("The avg local test acc in round ", "round_end"),
            ("----------------------MODEL INFO", "data_ready"),
        )

        class Marks(logging.Handler):  # the reference's own log lines mark its phase boundaries
            def emit(self, rec: logging.LogRecord) -> None:
                if isinstance(rec.msg, str):
                    msg = rec.msg.lstrip("\n")
                    for prefix, name in marks:
                        if msg.startswith(prefix):
                            record["events"].append([time.time(), name, msg.strip("-\n ")])

        logging.getLogger().addHandler(Marks())
        import methods.main_UL as main_ul  # noqa: I001  the reference's pipeline (sets 2 threads, builds its Accelerator)
        import torch
        from methods.unsupervised_learning_new.fedcopl import FedCoPL

        record["imported"] = time.time()
        if spec["threads"] != torch.get_num_threads():  # main_UL.py:33 sets 2
            torch.set_num_threads(spec["threads"])
            record["patches"].append(f"torch.set_num_threads({spec['threads']}) after main_UL.py:33's 2")
        import accelerate
        import numpy

        record["versions"] = {"python": platform.python_version(), "torch": torch.__version__,
                              "accelerate": accelerate.__version__, "numpy": numpy.__version__,
                              "threads": torch.get_num_threads()}

        def timed(owner, name: str, key: str, capture=None) -> None:
            original = getattr(owner, name)

            @functools.wraps(original)
            def wrapper(*args, **kwargs):
                begin = time.time()
                out = original(*args, **kwargs)
                record["timers"].setdefault(key, []).append([begin, time.time()])
                if capture is not None:
                    capture(args, kwargs, out)
                return out

            setattr(owner, name, wrapper)

        def split(args, kwargs, out) -> None:  # prepare_dataset_UL_fed's per-client label lists -> (K, C) counts
            classes, label_to_idx = args[0], out[6]
            test_fed, train_fed = out[3], out[5]

            def counts(fed):
                return [[sum(1 for lb in fed[k] if label_to_idx[lb] == c) for c in range(len(classes))]
                        for k in sorted(fed)]

            record["split"] = {"classes": list(classes), "train": counts(train_fed), "test": counts(test_fed)}

        def estimated(args, kwargs, out) -> None:  # _create_training_dataset_pre: u_k, the filtered histogram
            record["estimated"].append([int(v) for v in out[1].tolist()])

        def selected(args, kwargs, out) -> None:  # create_training_dataset_prototype: quotas in, selection out
            record["quotas"].append([int(v) for v in kwargs["sample_per_class"].tolist()])
            record["selection"].append([int(v) for v in out[5].tolist()])

        def tested(args, kwargs, out) -> None:
            record["accuracy"].append(float(out))

        timed(main_ul, "get_labeled_and_unlabeled_data", "list_images")
        timed(main_ul, "prepare_dataset_UL_fed", "partition", split)
        timed(main_ul, "average_weights", "aggregate")
        timed(FedCoPL, "__init__", "load_clip")
        timed(FedCoPL, "define_model", "define_model")
        timed(FedCoPL, "_create_training_dataset_pre", "label_client", estimated)
        timed(FedCoPL, "create_training_dataset_prototype", "select_client", selected)
        timed(FedCoPL, "train", "train_client")
        timed(FedCoPL, "test_predictions", "test_client", tested)
        main_ul.main()
        record["finished"] = time.time()
    except BaseException as err:  # noqa: BLE001  reported to the parent, which fails the race
        record["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
        write()
        return 1
    write()
    return 0


# ---------------------------------------------------------------------------------------------------------
# Shared inputs: the images and the weights.
# ---------------------------------------------------------------------------------------------------------


def per_class(total: int, classes: int) -> list[int]:
    return [total // classes + (1 if c < total % classes else 0) for c in range(classes)]


def prepare_images(archive: Path, root: Path, n_train: int, n_test: int) -> dict:
    """root = DATASET_DIR/cifar10: train/<class>/<file>, test/<class>/<file> (the first files by name of every
    class) and the reference's class_names.txt, train.txt, test.txt in fedur's ImageFolder order."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.lower().endswith(".jpg")]
        by_split: dict[str, dict[str, list[tarfile.TarInfo]]] = {"train": {}, "test": {}}
        for m in members:
            parts = Path(m.name).parts
            if len(parts) >= 3 and parts[-3] in by_split:
                by_split[parts[-3]].setdefault(parts[-2], []).append(m)
        classes = sorted(by_split["train"])
        if classes != sorted(by_split["test"]):
            raise SystemExit(f"{archive}: train and test class folders differ")
        chosen = []
        for split, total in (("train", n_train), ("test", n_test)):
            for c, count in zip(classes, per_class(total, len(classes))):
                files = sorted(by_split[split][c], key=lambda m: Path(m.name).name)
                if len(files) < count:
                    raise SystemExit(f"{archive}: {split}/{c} has {len(files)} images, {count} wanted")
                chosen += [(split, c, m) for m in files[:count]]
        for split, c, m in sorted(chosen, key=lambda t: t[2].offset_data):  # forward through the stream
            dest = root / split / c / Path(m.name).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(dest, "wb") as f:
                shutil.copyfileobj(src, f)
    (root / "class_names.txt").write_text("".join(f"{c}\n" for c in classes))
    for split in ("train", "test"):
        lines = [f"{split}/{c}/{name} {label}\n" for label, c in enumerate(classes)
                 for name in sorted(p.name for p in (root / split / c).iterdir())]
        (root / f"{split}.txt").write_text("".join(lines))
    return {"classes": classes, "train_per_class": per_class(n_train, len(classes)),
            "test_per_class": per_class(n_test, len(classes))}


def make_weights(kind: str, folder: Path, seed: int) -> dict:
    """A random init saved once as OpenAI's CLIP files are: a float16 state dict with OpenAI's key names (open_clip's
    CLIP uses the same names), without input_resolution/context_length/vocab_size, which open_clip's strict load
    refuses and the reference's build_model does not need. float16, so that the reference's convert_weights
    (half) and .float() give back exactly the values fedur loads. ViT-B/32: open_clip's ViT-B-32-quickgelu.
    Smoke: a narrow CLIP whose shapes fit the reference: 12 visual blocks (it prompts 11, methods/
    unsupervised_learning_new/fedcopl.py:912), 64-wide heads (clip/model.py infers heads = width // 64) and a
    77-token text context (clip.tokenize pads to 77)."""
    import open_clip
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "smoke":
        config = folder / f"{SMOKE_MODEL_NAME}.json"
        config.write_text(json.dumps(SMOKE_MODEL, indent=2) + "\n")
        open_clip.add_model_config(config)
        name, fedur_flags = SMOKE_MODEL_NAME, ["--model.config_file", str(config), "--model.name", SMOKE_MODEL_NAME]
    else:
        name, fedur_flags = "ViT-B-32-quickgelu", ["--model.name", "ViT-B-32-quickgelu"]
    path = folder / f"{name}-random-seed{seed}.pt"
    if not path.exists():
        torch.manual_seed(seed)
        model = open_clip.create_model(name, pretrained=None)
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
    return {"name": name, "path": str(path), "fedur_flags": fedur_flags + ["--model.pretrained", str(path)],
            "bytes": path.stat().st_size}


# ---------------------------------------------------------------------------------------------------------
# Running the two sides.
# ---------------------------------------------------------------------------------------------------------


class Timestamped:
    """Reads a process's merged stdout/stderr line by line into a log file, noting when each marked line came."""

    def __init__(self, stream, log: Path, marks: dict[str, str]):
        self.marks, self.times = marks, {}
        self.thread = threading.Thread(target=self._read, args=(stream, log), daemon=True)
        self.thread.start()

    def _read(self, stream, log: Path) -> None:
        with open(log, "w") as f:
            for line in stream:
                now = time.time()
                f.write(line)
                for prefix, name in self.marks.items():
                    if line.startswith(prefix) and name not in self.times:
                        self.times[name] = now


def busy_core_seconds() -> float | None:
    """Core-seconds the whole machine has spent busy since boot (/proc/stat; None where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the processes this one has waited for, and theirs
    return usage.ru_utime + usage.ru_stime


def run_process(cmd: list[str], env: dict, cwd: Path, log: Path, timeout: float, marks: dict[str, str]) -> dict:
    """Run `cmd`; its wall time, its CPU time (with its own children, e.g. DataLoader workers) and the CPU time
    every other process on the machine used meanwhile (`others`: the load this run shared the cores with)."""
    busy_before, cpu_before = busy_core_seconds(), children_cpu_seconds()
    spawned = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    reader = Timestamped(proc.stdout, log, marks)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        rc = rc if rc else -9
    exited = time.time()
    cpu = children_cpu_seconds() - cpu_before
    busy_after = busy_core_seconds()
    others = None if busy_before is None or busy_after is None else max(0.0, busy_after - busy_before - cpu)
    reader.thread.join(timeout=10)
    wall = exited - spawned
    return {"rc": rc, "spawned": spawned, "exited": exited, "wall": wall, "lines": reader.times, "cpu": cpu,
            "others": others, "others_share": None if others is None else others / (wall * (os.cpu_count() or 1))}


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # so that the log lines arrive when they are printed
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # each side sets its own threads
        env.pop(key, None)
    return env


def reference_env(args, data_dir: Path, weights: dict, out_dir: Path) -> dict:
    """The variables run-textPT_ALL.sh exports (utils/utils.py:14-68 reads them), at its values but for the
    data, the weights, the round count, the clients and the epochs."""
    return {
        "OPTIM_SEED": str(args.seed), "VIS_ENCODER": weights["path"], "DATASET_NAME": "cifar10",
        "MODEL": REFERENCE_MODEL, "DATASET_DIR": str(data_dir), "OUTPUT_DIR": str(out_dir),
        "EPOCHS": str(args.epochs), "LR": "0.1", "DECAY": "0.05", "CONF_QUANTILE": "50", "ENT_QUANTILE": "50",
        "BATCH_SIZE": "64", "TEMPERATURE": "1.0", "Device_ID": "", "CUDA_VISIBLE_DEVICES": "",
        "Round": "1", "Client_Num": str(args.clients), "Partition": "noniid", "Local_Epoch": str(args.epochs),
        "Beta": "0.1", "LR_attention": "0.5", "Num_repesudo_round": "5", "Scheduler": "cosine", "Joining_rate": "1",
    }


def fedur_command(args, data_root: Path, weights: dict, run_dir: Path, cache_dir: Path) -> list[str]:
    return [
        sys.executable, str(REPO / "fedur" / "main.py"), "--config", str(REPO / "configs" / "cifar10.yaml"),
        "--dataset", "reference_race.ReferenceCIFAR10Folder", "--dataset.root", str(data_root),
        *weights["fedur_flags"],
        "--method", "FedCoPL", "--labeller", "CoPL", "--labeller.quota_arithmetic", "reference",
        "--federation.rounds", "1", "--federation.num_clients", str(args.clients),
        "--federation.local_epochs", str(args.epochs), "--federation.refresh_every", "5",
        "--federation.partition", "dirichlet", "--federation.beta", "0.1", "--federation.partition_seed", "reference",
        "--optim.lr", "0.1", "--optim.momentum", "0.9", "--optim.weight_decay", "0.05", "--optim.schedule", "cosine",
        "--optim.batch_size", "64", "--optim.eval_batch_size", "64", "--optim.optimizer_state", "shared",
        "--evaluation.global_model", "true" if args.global_model == "on" else "false",
        "--run.seed", str(args.seed), "--run.threads", str(args.threads), "--run.output_dir", str(run_dir),
        "--run.progress", "false",
        "--fabric.accelerator", "cpu", "--fabric.devices", "1", "--fabric.precision", "32-true",
        "--data.cache_dir", str(cache_dir),
        *args.fedur_arg,
    ]


def reference_side(args, work: Path, data_dir: Path, weights: dict, index: int) -> dict:
    folder = work / "runs" / f"reference-{index}"
    folder.mkdir(parents=True)
    spec = {"reference": str(Path(args.reference).resolve()), "result": str(folder / "result.json"),
            "env": reference_env(args, data_dir, weights, folder / "output"), "threads": args.threads,
            "num_workers": args.reference_workers}
    (folder / "spec.json").write_text(json.dumps(spec, indent=2))
    cmd = [args.reference_python, str(Path(__file__).resolve()), "--_reference-child", str(folder / "spec.json")]
    proc = run_process(cmd, child_env(args.threads), Path(spec["reference"]), folder / "log.txt", args.timeout, {})
    side = {"side": "reference", "index": index, "command": cmd, "folder": str(folder), **proc}
    result = folder / "result.json"
    child = json.loads(result.read_text()) if result.exists() else {"error": "no result.json (see log.txt)"}
    side["child"] = child
    side["error"] = child.get("error") or (f"exit code {proc['rc']}" if proc["rc"] else None)
    if side["error"]:
        return side
    try:
        events = child["events"]
        first = {}
        for t, name, _ in events:
            first.setdefault(name, t)
        start, train_start, end = first["round_start"], first["train_client"], first["round_end"]
        agg_start, agg_end = child["timers"]["aggregate"][0]
        side["phases"] = {
            "before_round1": start - proc["spawned"], "refresh": train_start - start, "train": agg_start - train_start,
            "aggregate": agg_end - agg_start, "evaluate": end - agg_end, "round": end - start,
            "after": proc["exited"] - end, "wall": proc["wall"],
        }
        timers = child["timers"]
        side["detail"] = {
            "python start + imports": child["imported"] - proc["spawned"],
            "load CLIP (clip.load, in FedCoPL.__init__)": _span(timers, "load_clip"),
            "prompted model (define_model)": _span(timers, "define_model"),
            "list images + split": _span(timers, "list_images") + _span(timers, "partition"),
            "refresh: labelling (zero-shot, per client)": _span(timers, "label_client"),
            "refresh: selection (per client)": _span(timers, "select_client"),
            "train: local epochs (per client)": _span(timers, "train_client"),
            "evaluate: test (per client)": _span(timers, "test_client"),
        }
        side["split"], side["selection"] = child["split"], child["selection"]
        side["accuracy"] = child["accuracy"]
    except (KeyError, IndexError, TypeError) as err:
        side["error"] = f"the reference's log lacks a phase mark ({type(err).__name__}: {err}); see {folder}/log.txt"
    return side


def fedur_side(args, work: Path, data_root: Path, weights: dict, index: int, cache: str = "cold") -> dict:
    """fedur's run of pair `index` with its caches `cache`: "cold" (a new folder: the process decodes every image and
    computes the frozen features first) or "warm" (the folder of the pair's cold run)."""
    folder = work / "runs" / f"fedur-{cache}-{index}"
    folder.mkdir(parents=True)
    run_dir, cache_dir = folder / "run", work / "runs" / f"cache-{index}"
    cmd = fedur_command(args, data_root, weights, run_dir, cache_dir)
    env = child_env(args.threads)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    marks = {"fedur: ": "described", "zero-shot CLIP": "zero_shot_printed", "round ": "round_printed"}
    proc = run_process(cmd, env, REPO, folder / "log.txt", args.timeout, marks)
    side = {"side": f"fedur {cache}", "index": index, "command": cmd, "folder": str(folder), **proc,
            "error": f"exit code {proc['rc']}" if proc["rc"] else None}
    if side["error"]:
        return side
    try:
        metrics_file = run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
        row = rows[0]
        end = metrics_file.stat().st_mtime_ns / 1e9  # written once, at the end of the round
        start = end - row["round_seconds"]
        ph = row["phase_seconds"]
        side["phases"] = {
            "before_round1": start - proc["spawned"], "refresh": ph["refresh"], "train": ph["train"],
            "aggregate": ph["aggregate"], "evaluate": ph["evaluate"], "round": row["round_seconds"],
            "after": proc["exited"] - end, "wall": proc["wall"],
        }
        partition = json.loads((run_dir / "partition.json").read_text())
        written = {name: (run_dir / name).stat().st_mtime_ns / 1e9 for name in ("partition.json", "zero_shot.json")
                   if (run_dir / name).exists()}
        side["detail"] = {
            "start to partition.json (imports, data, CLIP, image cache, split)":
                written.get("partition.json", float("nan")) - proc["spawned"],
            "partition.json to zero_shot.json (heatmaps, zero-shot test of every client)":
                written.get("zero_shot.json", float("nan")) - written.get("partition.json", float("nan")),
            "zero_shot.json to round 1": start - written.get("zero_shot.json", float("nan")),
        }
        startup = json.loads((run_dir / "summary.json").read_text()).get("startup_seconds") or {}
        side["detail"].update({f"summary.json startup {k}": v for k, v in startup.items()})  # fedur's own clock
        side["split"] = {"classes": partition["classnames"], "train": partition["train"], "test": partition["test"]}
        side["selection"] = row["selection"]
        side["accuracy"] = row["client_accuracy"]  # percent
    except (OSError, KeyError, IndexError, TypeError, ValueError) as err:
        side["error"] = f"cannot read fedur's run ({type(err).__name__}: {err}); see {folder}"
    return side


def _span(timers: dict, key: str) -> float:
    return sum(e - s for s, e in timers.get(key, []))


# ---------------------------------------------------------------------------------------------------------
# Checks and the report.
# ---------------------------------------------------------------------------------------------------------


def differences(a, b, what: str) -> list[str]:
    if a is None or b is None:
        return [f"{what}: missing on one side"]
    if len(a) != len(b):
        return [f"{what}: {len(a)} clients vs {len(b)}"]
    out = []
    for k, (ra, rb) in enumerate(zip(a, b)):
        if list(ra) != list(rb):
            out.append(f"{what}, client {k}: reference {list(ra)} vs fedur {list(rb)}")
    return out


def check_work(sides: list[dict]) -> list[str]:
    """The split (train and test counts per client and class) and the selection (per client and class) of every
    run against the first reference run's; [] when all did the same work."""
    refs = [s for s in sides if s["side"] == "reference" and not s.get("error")]
    problems = [f"{side}: no run finished, nothing to compare" for side in side_names(sides)
                if not any(s["side"] == side and not s.get("error") for s in sides)]
    if not refs:
        return problems
    base = refs[0]
    for s in sides:
        if s.get("error"):
            continue
        tag = f"{s['side']} run {s['index']}"
        for part in ("train", "test"):
            problems += [f"{tag}: {d}" for d in differences(base["split"][part], s["split"][part], f"{part} split")]
        problems += [f"{tag}: {d}" for d in differences(base["selection"], s["selection"], "selection")]
    return problems


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def side_names(sides: list[dict]) -> list[str]:
    """"reference", then fedur's sides in the order run ("fedur cold", "fedur warm")."""
    return ["reference", *dict.fromkeys(s["side"] for s in sides if s["side"] != "reference")]


def summarize(sides: list[dict]) -> dict:
    """Per side, the median seconds of each phase; per fedur side, its ratio to the reference's (`ratio`: of the
    medians; `ratio_median_of_pairs`: the median of each pair's ratio)."""
    out = {"sides": side_names(sides), "ratio": {}, "ratio_median_of_pairs": {}}
    for side in out["sides"]:
        runs = [s for s in sides if s["side"] == side and not s.get("error")]
        out[side] = {p: median([r["phases"][p] for r in runs]) for p in PHASES}
    pairs = {}
    for s in sides:
        if not s.get("error"):
            pairs.setdefault(s["index"], {})[s["side"]] = s
    for side in out["sides"][1:]:
        out["ratio"][side] = {p: (out[side][p] / out["reference"][p]) if out["reference"][p] else float("nan")
                              for p in PHASES}
        per_pair = [{p: both[side]["phases"][p] / both["reference"]["phases"][p] for p in PHASES
                     if both["reference"]["phases"][p]} for _, both in sorted(pairs.items()) if side in both and "reference" in both]
        out["ratio_median_of_pairs"][side] = {p: median([r[p] for r in per_pair if p in r]) for p in PHASES}
    return out


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "host": platform.node(),
            "python": platform.python_version()}


def git_head(path: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{head}{' (with uncommitted changes)' if dirty else ''}" if head else "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def report(args, setup: dict, sides: list[dict], problems: list[str], summary: dict, started: float) -> str:
    lines = [
        f"# fedur vs the reference code (FedCoPL): one round, side by side{' (smoke)' if args.smoke else ''}",
        "",
        f"Written by `benchmarks/reference_race.py` on {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, "
        f"{time.time() - started:.0f} s in all.",
        "",
        "    " + " ".join(shlex.quote(a) for a in setup["argv"]),
        "",
        f"Machine: {setup['machine']['cpu']}, {setup['machine']['cores']} cores; {args.threads} compute threads per side. "
        f"fedur {setup['fedur_commit']} (Python {setup['machine']['python']}); reference {setup['reference_commit']} at "
        f"`{args.reference}` (interpreter `{args.reference_python}`"
        + (f", torch {setup['reference_versions'].get('torch')}, accelerate {setup['reference_versions'].get('accelerate')}"
           if setup.get("reference_versions") else "") + ").",
        "",
        f"Work: {args.train} CIFAR-10 train and {args.test} test images (the first of each class folder: "
        f"{setup['images']['train_per_class'][0]} / {setup['images']['test_per_class'][0]} per class), {args.clients} clients, "
        f"Dirichlet 0.1 (the reference's split), 1 round of FedCoPL with {args.epochs} local epoch(s), batch 64, "
        f"{setup['weights']['name']} with random weights (seed {args.weight_seed}, {setup['weights']['bytes'] / 1e6:.0f} MB, "
        "both sides the same file), fp32, CPU. Bytecode: " + setup["bytecode"] + ".",
        "",
        "## Same work?",
        "",
    ]
    if problems:
        lines += ["**No.** " + f"{len(problems)} difference(s):", ""] + [f"- {p}" for p in problems[:40]]
    else:
        ok = [s for s in sides if not s.get("error")]
        lines += [f"Yes: every run ({len(ok)}) has the same split (train and test images per client and class) and the "
                  "same pseudo-label selection (selected images per client and class) as the first reference run."]
    base = next((s for s in sides if s["side"] == "reference" and not s.get("error")), None)
    if base is not None:
        lines += ["", "| client | train | test | selected | selected per class |", "| --- | --- | --- | --- | --- |"]
        for k, sel in enumerate(base["selection"]):
            lines.append(f"| {k} | {sum(base['split']['train'][k])} | {sum(base['split']['test'][k])} | {sum(sel)} | "
                         f"{' '.join(map(str, sel))} |")
    failed = [s for s in sides if s.get("error")]
    if failed:
        lines += ["", "## Failed runs", ""]
        for s in failed:
            lines += [f"- {s['side']} run {s['index']} ({s['folder']}): " + s["error"].strip().splitlines()[0]]
    lines += ["", "## Seconds per phase (medians over the pairs) and fedur / reference", "",
              "| | " + " | ".join(PHASES) + " |", "| --- |" + " --- |" * len(PHASES)]
    for side in summary["sides"]:
        lines.append(f"| {side} | " + " | ".join(fmt(summary[side][p]) for p in PHASES) + " |")
    for side in summary["sides"][1:]:
        lines.append(f"| {side} / reference | " + " | ".join(fmt(summary["ratio"][side][p]) for p in PHASES) + " |")
        lines.append(f"| {side}: median of the pairs' ratios | "
                     + " | ".join(fmt(summary["ratio_median_of_pairs"][side][p]) for p in PHASES) + " |")
    lines += ["", "Every run, in the order run (cpu: the process's CPU core-seconds, its DataLoader workers included; "
              "others: what every other process on the machine used meanwhile, core-seconds and share of the cores):", "",
              "| run | " + " | ".join(PHASES) + " | cpu | others |", "| --- |" + " --- |" * (len(PHASES) + 2)]
    for s in sides:
        if not s.get("error"):
            others = "n/a" if s.get("others") is None else f"{s['others']:.0f} ({100 * s['others_share']:.0f}%)"
            lines.append(f"| {s['side']} {s['index']} | " + " | ".join(fmt(s["phases"][p]) for p in PHASES)
                         + f" | {s['cpu']:.0f} | {others} |")
    shared = [s for s in sides if (s.get("others_share") or 0) > BUSY_SHARE]
    if shared:
        which = ", ".join(f"{s['side']} {s['index']}" for s in shared)
        lines += ["", f"**The machine was not quiet**: other processes used more than {100 * BUSY_SHARE:.0f}% of the cores "
                  f"during {which}; those times hold waiting for the CPU and are not clean. Rerun on a quiet machine."]
    lines += ["", "Where the time before round 1 and inside the phases goes (seconds, first run of each side):", ""]
    for side in summary["sides"]:
        run = next((s for s in sides if s["side"] == side and not s.get("error")), None)
        if run is not None:
            lines += [f"- {side}: " + "; ".join(f"{k} {fmt(v)}" for k, v in run["detail"].items())]
    lines += [
        "",
        "## How each phase is measured",
        "",
        "- before_round1: this script's clock just before it starts the process, to the round's start.",
        "- reference: the round starts at its \"Global Round 0\" log line (methods/main_UL.py:417); refresh runs to "
        "\"Trian for client 0\" (:528), train to the call of average_weights (:550), aggregate is that call, evaluate "
        "runs from its end to \"The avg local test acc in round 0\" (:558), the round's end.",
        "- fedur: refresh, train, aggregate, evaluate and round are metrics.jsonl's phase_seconds and round_seconds; the "
        "round ends when metrics.jsonl is written (its mtime) and starts round_seconds earlier. fedur's aggregate also "
        "holds its prompt-divergence monitoring; its evaluate, the gathering of the losses.",
        "- after: from the round's end to the process's exit (fedur: checkpoint, prompts, summary, TensorBoard; the "
        "reference: nothing but exiting).",
        "- wall: the whole process, as this script saw it.",
        "",
        "## What differs in the work",
        "",
        "- fedur tests zero-shot CLIP on every client's test images before round 1 (fedur/train/fit.py, "
        "record_zero_shot; no switch turns it off); the reference does not. It is inside fedur's before_round1.",
        "- fedur decodes every image once into its image cache, and computes every image's frozen features once into its "
        "feature cache (data.feature_cache), before round 1: cold, a new cache folder; warm, the one the pair's cold run "
        "left, whose zero-shot test and zero-shot refresh then read the features instead of running the image tower. "
        "The reference decodes JPEGs in every pass (labelling, each epoch, testing) with DataLoader workers (8 in its "
        f"code{'' if args.reference_workers is None else f', {args.reference_workers} here (--reference-workers)'}); "
        "fedur's data.num_workers is 2.",
        "- fedur writes TensorBoard logs, heatmaps of the split, a checkpoint and the prompts; the reference writes its log.",
        "- The prompt inits differ (each side draws its own from its seed), so the losses and test accuracies differ; "
        "the images put through each tower, the batches and the pseudo-labels are the same.",
        "",
        "## Patches the reference ran with (in memory, by this script)",
        "",
    ]
    lines += [f"- {p}" for p in setup.get("patches", [])] or ["- none recorded"]
    lines += [
        f"- Not patches, but settings: MODEL={REFERENCE_MODEL} (methods/main_UL.py:390; run-textPT_ALL.sh's "
        "MODEL=FedCoPL matches no branch, and the released script trains nothing), VIS_ENCODER=<the weights file> "
        "(fedcopl.py:144 passes it to clip.load, which takes a path), Device_ID= and CUDA_VISIBLE_DEVICES= (CPU), "
        f"EPOCHS={args.epochs}, Round=1, Client_Num={args.clients}; the rest as run-textPT_ALL.sh.",
        "",
        "## Commands",
        "",
    ]
    for side in summary["sides"]:
        s = next(s for s in sides if s["side"] == side)
        lines += [f"{s['side']}:", "", "    " + " ".join(shlex.quote(a) for a in s["command"]), ""]
    lines += ["The reference's environment variables: spec.json in its run folder (reference-<i>/)."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", required=True, help="a checkout of krumpguo/FedCoPL")
    p.add_argument("--reference-python", default=sys.executable,
                   help="the interpreter that runs the reference (default: this one)")
    p.add_argument("--pairs", type=int, default=2, help="reference-then-fedur pairs (default 2)")
    p.add_argument("--train", type=int, default=500, help="CIFAR-10 train images, balanced over the classes")
    p.add_argument("--test", type=int, default=100, help="CIFAR-10 test images, balanced over the classes")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1, help="local epochs of the round (the reference's EPOCHS)")
    p.add_argument("--threads", type=int, default=2, help="CPU compute threads per side")
    p.add_argument("--seed", type=int, default=1, help="run seed of both sides (prompt init, data order)")
    p.add_argument("--weight-seed", type=int, default=0, help="seed of the random CLIP weights")
    p.add_argument("--model", choices=("vit-b-32", "smoke"), default="vit-b-32")
    p.add_argument("--smoke", action="store_true",
                   help="a quick check that both sides run and agree: the smoke CLIP, 50 train / 20 test, 2 clients, 1 pair")
    p.add_argument("--archive", default=str(DEFAULT_ARCHIVE),
                   help="cifar10-jpg.tar.gz (default: $FEDUR_SHARED_DIR/data/, else ../shared/data/ beside the repository)")
    p.add_argument("--reference-workers", type=int, default=None,
                   help="DataLoader workers for the reference (default: its code's own, 8)")
    p.add_argument("--global-model", choices=("on", "off"), default="on",
                   help="fedur also tests its server's model every round (its default, on: the evaluation protocols "
                   "at the cost of one pass); the reference tests none")
    p.add_argument("--fedur-cache", default="cold,warm", help="fedur's runs per pair, by the state of its caches: cold (a "
                   "new cache folder), warm (the folder of the pair's cold run); default both")
    p.add_argument("--fedur-arg", action="append", default=[], help="an extra fedur flag (repeatable), e.g. "
                   "--fedur-arg=--data.cache=false")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder of the report (<name>.md, <name>.json)")
    p.add_argument("--name", default=None, help="report name (default cpu, or cpu-smoke)")
    p.add_argument("--work", default=None, help="folder for the images, weights and runs (default: a temporary one)")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary --work folder")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    args = p.parse_args(argv)
    args.fedur_cache = args.fedur_cache.split(",")
    if args.fedur_cache not in (["cold"], ["cold", "warm"]):
        p.error("--fedur-cache takes cold or cold,warm (a warm run reads the folder the pair's cold run filled)")
    if args.smoke:
        args.model, args.train, args.test, args.clients, args.pairs = "smoke", 50, 20, 2, 1
    return args


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--_reference-child":
        return reference_child(argv[1])
    started = time.time()
    args = parse_args(argv)
    reference = Path(args.reference).resolve()
    if not (reference / "methods" / "main_UL.py").is_file():
        raise SystemExit(f"--reference {reference}: no methods/main_UL.py there; point it at a FedCoPL checkout")
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="reference_race-"))
    work.mkdir(parents=True, exist_ok=True)
    if (work / "runs").exists():
        shutil.rmtree(work / "runs")
    print(f"reference_race: work folder {work}", flush=True)
    try:
        data_dir = work / "data"
        root = data_dir / "cifar10"
        stamp = root / "images.json"
        wanted = {"archive": str(Path(args.archive).resolve()), "train": args.train, "test": args.test}
        if stamp.exists() and json.loads(stamp.read_text()).get("wanted") == wanted:
            images = json.loads(stamp.read_text())["images"]
        else:
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            images = prepare_images(Path(args.archive), root, args.train, args.test)
            stamp.write_text(json.dumps({"wanted": wanted, "images": images}))
        weights = make_weights(args.model, work / "weights", args.weight_seed)
        print(f"reference_race: {args.train}/{args.test} images in {root}; weights {weights['path']}", flush=True)
        for path in [Path(weights["path"]), *root.rglob("*.jpg")]:  # into the page cache, for the first run as the rest
            path.read_bytes()
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # not written: every process compiles what has no valid .pyc
            bytecode = "not written beforehand (PYTHONDONTWRITEBYTECODE is set): each process compiles what has no valid .pyc"
        else:  # so that the first run of a side does not compile for the others
            subprocess.run([args.reference_python, "-m", "compileall", "-q", str(reference)], capture_output=True)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "fedur"), str(HERE / "reference_race.py")],
                           capture_output=True)
            bytecode = "compiled beforehand (python -m compileall on both code trees)"
        sides = []
        for i in range(args.pairs):
            for side in ("reference", *(f"fedur {cache}" for cache in args.fedur_cache)):
                run = reference_side(args, work, data_dir, weights, i) if side == "reference" else \
                    fedur_side(args, work, root, weights, i, side.split()[1])
                status = "failed: " + run["error"].strip().splitlines()[0] if run.get("error") else \
                    " ".join(f"{p} {run['phases'][p]:.2f}" for p in PHASES)
                print(f"reference_race: pair {i + 1}/{args.pairs} {side}: {status}", flush=True)
                sides.append(run)
        problems = check_work(sides)
        summary = summarize(sides)
        ref_run = next((s for s in sides if s["side"] == "reference" and "child" in s), {})
        setup = {"argv": [sys.executable, str(Path(__file__).resolve()), *argv], "machine": machine(),
                 "fedur_commit": git_head(REPO), "reference_commit": git_head(reference), "images": images,
                 "weights": weights, "patches": ref_run.get("child", {}).get("patches", []),
                 "reference_versions": ref_run.get("child", {}).get("versions", {}), "bytecode": bytecode}
        name = args.name or ("cpu-smoke" if args.smoke else "cpu")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        text = report(args, setup, sides, problems, summary, started)
        (out / f"{name}.md").write_text(text)
        slim = [{k: v for k, v in s.items() if k != "child"} | {"child_error": s.get("child", {}).get("error")}
                for s in sides]
        (out / f"{name}.json").write_text(json.dumps({"setup": setup, "summary": summary, "problems": problems,
                                                      "runs": slim}, indent=2, default=str) + "\n")
        print(text)
        print(f"reference_race: report {out / (name + '.md')}", flush=True)
        failed = [s for s in sides if s.get("error")]
        return 1 if failed or problems else 0
    finally:
        if not args.work and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
