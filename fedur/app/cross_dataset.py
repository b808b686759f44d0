"""fedur-cross-dataset: test a finished run's server model on another dataset's test split (the cross-dataset
protocol, FedTPG's `cross_data` and FLiP's `xdataset`; docs/protocols.md).

    fedur-cross-dataset RUN_DIR --dataset CIFAR100 --dataset.root /data/cifar100 [more fedur settings]

The run is rebuilt from its own config.yaml (its backbone, its method with its settings) and its last committed
checkpoint (the global pieces, the method's server state, the training clients' pieces); the flags after
RUN_DIR choose the target dataset, as `fedur` takes them (`--dataset CLASS --dataset.<arg> ...`, and
`--data.template`, `--data.classnames_file`, `--data.test_fraction` for it). The server's model
(`Method.global_model`) classifies the target's test images among the target's own class names, and so does
zero-shot CLIP beside it. It writes RUN_DIR/cross_dataset/<target>.json and prints one line; one process, on
the run's accelerator setting (a GPU when there is one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from lightning import Fabric

from fedur.data.cache import CacheOptions, prepare_splits
from fedur.data.datasets import DataOptions, ImageSplit, prepare_dataset
from fedur.data.features import split_identity
from fedur.data.loaders import ImageLoader, in_batches
from fedur.errors import FedurError
from fedur.launch_env import LaunchEnv
from fedur.methods.base import GlobalView
from fedur.methods.forward import frozen_reads
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import load_clip, zero_shot_weights
from fedur.train import checkpoint
from fedur.train.evaluate import prepared, scored_counts
from fedur.train.features import open_run_features, text_spec, tower_spec, wanted_files, zero_shot_text
from fedur.train.setup import data_seed


class CrossDatasetError(FedurError, ValueError):
    """The run cannot be tested as asked; the message says why and what to do."""


def cross_dataset(run_dir: Path, settings: list[str]) -> dict:
    """Test the server model of the finished run in `run_dir` on the test split of the dataset `settings` name
    (fedur flags); returns (and writes to run_dir/cross_dataset/<key>.json) what was measured."""
    from fedur.app.cli import parse_config  # the entry point's parser: the same settings as the run's

    run_dir = Path(run_dir).expanduser().resolve()
    committed = checkpoint.latest(run_dir)
    summary_file, config = run_dir / "summary.json", run_dir / "config.yaml"
    if not config.is_file():
        raise CrossDatasetError(f"{run_dir} holds no config.yaml: give the directory of a fedur run")
    if not summary_file.is_file():
        raise CrossDatasetError(f"{run_dir} has not finished (no summary.json): finish or resume it first")
    summary = json.loads(summary_file.read_text())
    if committed is None and summary.get("rounds_completed"):
        raise CrossDatasetError(f"{run_dir} holds no committed round: its checkpoints were removed")
    trained_on = json.loads((run_dir / "partition.json").read_text())["classnames"]
    cfg = parse_config(["--config", str(config), "--data.classnames_file", "null", "--data.template", "null",
                           "--data.test_fraction", "1.0", *settings])
    fabric = Fabric(accelerator=cfg.fabric.accelerator, devices=1, precision=LaunchEnv.read().resolved_precision(cfg.fabric))
    torch.manual_seed(cfg.run.seed)  # a random-init backbone is the run's (fedur/train/setup.py)
    clip = load_clip(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
    d = cfg.data
    target = prepare_dataset(cfg.dataset, DataOptions(d.classnames_file, d.template, 1.0, d.test_fraction), data_seed(cfg))
    if not target.test.labelled or len(target.test) == 0:
        raise CrossDatasetError(f"{target.name}'s test split has no labelled images to test on")
    no_train = ImageSplit(np.zeros(0, dtype=np.int64), arrays=np.zeros((0, 8, 8, 3), dtype=np.uint8))
    loading = prepare_splits(no_train, target.test, clip.preprocess, clip.image_size, cfg.dataset.cache_key,
                             CacheOptions(d.cache, d.cache_dir, d.corrupt_images))
    model = PromptedCLIP(clip, target.classnames, cfg.model.n_ctx, cfg.model.visual_tokens, cfg.model.visual_depth,
                         cfg.model.ctx_init_std, cfg.run.seed, cfg.model.ctx_suffix)
    model.shared_prefix_text, model.normalize = cfg.model.shared_prefix_text, loading.normalize
    tower = tower_spec(fabric, model, cfg.model.name, clip.preprocess) if d.feature_cache else None  # weights on the CPU
    text = text_spec(fabric, clip, cfg.model.name) if d.feature_cache else None
    model = model.to(fabric.device).eval()
    model.zero_shot_text = zero_shot_weights(clip, target.classnames, target.template, fabric.device) if text is None \
        else zero_shot_text(fabric, clip, text, target.classnames, target.template, cfg.dataset.cache_key, d.cache_dir)

    method = cfg.method
    start = initial_values(method.pieces(), model, cfg.run.seed)
    # The last committed round's server and training clients; a run of no rounds (zero-shot CLIP) has none.
    server = {"shared": {}, "method": {}} if committed is None else checkpoint.load(committed.folder / "global.pt")
    new = set(summary.get("new_clients") or [])
    clients = [] if committed is None else [checkpoint.load(path)["prompts"] for path in sorted(committed.folder.glob("client_*.pt"))
                                            if int(path.stem.removeprefix("client_")) not in new]

    def client_mean(name: str) -> torch.Tensor:
        return torch.stack([pieces[name] for pieces in clients]).mean(dim=0)

    view = GlobalView(dict(server["shared"]), dict(server.get("method", {})), start, client_mean,
                      other_classes=list(target.classnames) != list(trained_on))
    server_model = method.global_model(model, view)
    if server_model is None:
        raise CrossDatasetError(f"{type(method).__name__} has no server model (its global_model gives None)")
    images = ImageLoader({"test": loading.test}, loading.transform, d.num_workers, pin_memory=fabric.device.type == "cuda")
    labels = torch.from_numpy(loading.test.labels)
    plan = in_batches(np.arange(len(labels)), cfg.optim.eval_batch_size)
    reads, features = None, None
    if d.feature_cache:  # the target's frozen features, computed once (also for other runs tested on it)
        reads = frozen_reads(method, model, {name: t.to(fabric.device) for name, t in server_model.pieces.items()})
        identity = split_identity(target.test, "test", cfg.dataset.cache_key, loading.test_kept)
        wanted = wanted_files(model, tower, cfg.dataset.cache_key, {"test": (identity, len(loading.test))}, reads)
        features = open_run_features(fabric, model, images, wanted, d.cache_dir)

    def batches(zero_shot: bool):
        use = "features" if zero_shot and features is not None else reads
        read = images.batches("test", plan) if use is None else (features.batch("test", rows, use) for rows in plan)
        return zip(read, (labels[rows] for rows in plan))
    counts = {"server": scored_counts(fabric, method, model, prepared(fabric, method, model, server_model), batches(False)),
              "zero_shot": scored_counts(fabric, method, model, None, batches(True))}
    images.close()
    result = {
        "run": str(run_dir), "method": method.key, "trained_on": summary.get("dataset"), "dataset": target.name,
        "classes": len(target.classnames), "test_images": int(counts["server"][1]), "same_classes": not view.other_classes,
        "accuracy": 100.0 * float(counts["server"][0]) / float(counts["server"][1]),
        "zero_shot_accuracy": 100.0 * float(counts["zero_shot"][0]) / float(counts["zero_shot"][1]),
        "round": 0 if committed is None else committed.round_idx + 1,
        "target_settings": {"dataset": cfg.settings["dataset"], "data": cfg.settings["data"]},
    }
    digest = hashlib.sha256(json.dumps(result["target_settings"], sort_keys=True).encode()).hexdigest()[:8]
    out = run_dir / "cross_dataset" / f"{cfg.dataset.key}-{digest}.json"  # one file per target and its settings
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({**result, "file": str(out)}, indent=2) + "\n")
    return {**result, "file": str(out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedur-cross-dataset", description=__doc__.split("\n\n")[0],
        epilog="Everything after RUN_DIR is a fedur setting naming the target dataset, e.g. --dataset CIFAR10 "
               "--dataset.root /data/cifar10 (fedur --help lists them).")
    parser.add_argument("run_dir", type=Path, help="a finished fedur run (its run.output_dir)")
    args, settings = parser.parse_known_args(argv)
    if not any(s == "--dataset" or s.startswith("--dataset=") for s in settings):
        parser.error("name the target dataset: --dataset CLASS (and its --dataset.<arg> settings)")
    try:
        result = cross_dataset(args.run_dir, settings)
    except FedurError as err:
        print(f"fedur-cross-dataset: error: {err.one_line()}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"fedur-cross-dataset: error: {err}", file=sys.stderr)
        return 2
    print(f"{result['method']} trained on {result['trained_on']}, tested on {result['dataset']} ({result['classes']} classes, "
          f"{result['test_images']} test images): {result['accuracy']:.2f}% (zero-shot CLIP {result['zero_shot_accuracy']:.2f}%)"
          f"; written to {result['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
