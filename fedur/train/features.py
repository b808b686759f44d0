"""A process's frozen-feature cache (data.feature_cache; the files: fedur/data/features.py): opened at setup, built
first where absent from the process's images and frozen tower, and read by `Host.batches` wherever a pass's image
tower carries no prompt (the zero-shot passes; every pass of a method whose tower carries none:
`fedur.methods.forward.frozen_reads`); and the classes' zero-shot text features (`zero_shot_text`)."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import open_clip
import torch
from lightning import Fabric
from torch import Tensor

from fedur.data.cache import Progress, cache_directory
from fedur.data.features import FeatureFile, Kind, TowerSpec, Wanted, open_features
from fedur.data.loaders import ImageLoader
from fedur.model.classifier import PromptedCLIP, feature_dim
from fedur.model.clip import FrozenCLIP, zero_shot_weights
from fedur.model.frozen import FrozenImages, Reads, tower_digest


@dataclass
class RunFeatures:
    """The open feature files of the splits a process reads: {(split, kind): file}."""

    files: dict[tuple[str, Kind], FeatureFile]
    built: tuple[str, ...] = ()  # "<split> <kind>" of the files this process built (the others were opened)

    def batch(self, split: str, rows: np.ndarray, reads: Reads) -> FrozenImages:
        """The images of `split` at `rows` as cached rows: their features, and their tokens where `reads` is "tokens"."""
        return FrozenImages(self.features(split, rows), self.files[(split, "tokens")].rows(rows) if reads == "tokens" else None)

    def features(self, split: str, rows: np.ndarray) -> Tensor:
        """(len(rows), D) the frozen tower's unit-norm features of the images of `split` at `rows`, on the CPU."""
        return self.files[(split, "features")].rows(rows)


def computed_on(fabric: Fabric) -> str:
    """How this process computes a tower: its device and the device's kind, the autocast dtype, deterministic
    kernels, library versions (the key's part that no weight says)."""
    device = fabric.device
    kind = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}"
    with fabric.autocast():
        on = torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
        autocast = str(torch.get_autocast_dtype(device.type)) if on else "no autocast"
    return (f"{device.type} {kind}; {autocast}; deterministic {torch.are_deterministic_algorithms_enabled()}; "
            f"torch {torch.__version__}; open_clip {open_clip.__version__}")


def tower_spec(fabric: Fabric, model: PromptedCLIP, name: str, preprocess: Callable) -> TowerSpec:
    """The image features' key, but for the images: `name` (model.name), the image tower's architecture and weights
    (read where they are: call it before the model moves to an accelerator), the preprocess, `computed_on`."""
    return TowerSpec(name, tower_digest(model.clip.visual), repr(preprocess), computed_on(fabric))


def text_spec(fabric: Fabric, clip: FrozenCLIP, name: str) -> TowerSpec:
    """The zero-shot class features' key, but for the prompts: `name`, the text tower's weights (CLIP but its image
    tower; call it before the model moves), `computed_on`."""
    return TowerSpec(name, tower_digest(clip.model, skip="visual."), "zero_shot_weights", computed_on(fabric))


def zero_shot_text(fabric: Fabric, clip: FrozenCLIP, spec: TowerSpec, classnames: list[str], template: str,
                   dataset_key: str, cache_dir: str | None) -> Tensor:
    """(C, D) zero-shot CLIP's class features of `template` (`zero_shot_weights`'s bits) on the device, from the
    frozen-feature cache (computed first where absent, keyed by the prompts' token ids and the text tower)."""
    tokens = clip.tokenizer([template.format(name) for name in classnames])  # (C, L) what the text tower reads
    identity = hashlib.sha256(json.dumps([list(tokens.shape), tokens.flatten().tolist()]).encode()).hexdigest()
    wanted = Wanted(dataset_key, "classes", "text", identity, len(classnames), (feature_dim(clip.model),), spec)

    def compute(plan: list[np.ndarray]) -> Iterator[Tensor]:
        yield zero_shot_weights(clip, classnames, template, fabric.device)  # every class in one batch, as uncached
    file, _ = open_features(cache_directory(cache_dir), wanted, compute)
    return file.rows(np.arange(len(classnames))).to(fabric.device)


def wanted_files(model: PromptedCLIP, tower: TowerSpec, dataset_key: str, splits: dict[str, tuple[str, int]],
                 reads: Reads | None) -> list[Wanted]:
    """The feature files a process reads of `splits` ({split: (its `split_identity`, its number of images)}): the
    features of each, and its output tokens where the method reads them (`reads` "tokens")."""
    kinds: list[Kind] = ["features", *(["tokens"] if reads == "tokens" else [])]
    return [Wanted(dataset_key, split, kind, identity, count,
                   (model.feature_dim,) if kind == "features" else (model.image_token_count, model.feature_dim), tower)
            for split, (identity, count) in splits.items() for kind in kinds]


def open_run_features(fabric: Fabric, model: PromptedCLIP, images: ImageLoader, wanted: list[Wanted],
                      cache_dir: str | None, progress: Progress | None = None) -> RunFeatures:
    """The `wanted` files (`wanted_files`) in data.cache_dir, each built first where absent, in this process's
    precision on its device from `images` (call it on rank 0 first: the others then open what it built)."""
    directory = cache_directory(cache_dir)
    files, built = {}, []
    for want in wanted:
        encode = (lambda x: model.image_features(x, prompted=False)) if want.kind == "features" else model.image_tokens
        files[(want.split, want.kind)], new = open_features(directory, want, _computed(fabric, images, want.split, encode),
                                                            progress)
        if new:
            built.append(f"{want.split} {want.kind}")
    return RunFeatures(files, tuple(built))


def _computed(fabric: Fabric, images: ImageLoader, split: str, encode: Callable[[Tensor], Tensor]):
    def compute(plan: list[np.ndarray]) -> Iterator[Tensor]:
        for batch in images.batches(split, plan):
            with torch.no_grad(), fabric.autocast():
                out = encode(fabric.to_device(batch))
            yield out
    return compute
