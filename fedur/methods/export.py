"""A client's trained model as one file, and the function that loads it: images in, logits out.

    from fedur.methods.export import load_exported
    model = load_exported("client_3.pt")                 # an nn.Module, in eval mode, on the CPU
    images = torch.stack([model.preprocess(Image.open(p).convert("RGB")) for p in paths])
    logits = model(images)                               # (B, C), over model.classnames
    names = [model.classnames[i] for i in logits.argmax(dim=-1)]

The file (written by `fedur-export RUN --client K OUT`, fedur/app/export.py) is a torch.save'd dict of plain values and
tensors, loadable with `torch.load(..., weights_only=True)`: the open_clip backbone it was trained on (its model name,
its weights as an open_clip tag, a local file or fedur's own, and the model-config JSON of a custom architecture, with
the seed of a random init), fedur's prompt settings, the method's class and its settings, the pieces its logits read and
the method's per-client state, the server's text side where its model has one, the class names and the zero-shot
template. Loading rebuilds the frozen backbone from those, with fedur installed (the method's class computes the
logits exactly as the run did), and checks a local weights file against the digest recorded at export.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedur import plugins
from fedur.errors import FedurError
from fedur.federated.client import ClientState
from fedur.methods import forward
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import load_clip, zero_shot_weights

FORMAT = 1
KINDS = ("personal", "server", "zero_shot")


class ExportError(FedurError, ValueError):
    """An exported model cannot be written or loaded as asked; the message says why and what to do."""


def file_digest(path: str | Path) -> str:
    """sha256 of a weights file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def backbone_record(name: str, pretrained: str | None, config_file: str | None, seed: int, settings: dict) -> dict:
    """What an exported file records of the frozen backbone: the open_clip model name, the weights (tag, local file with
    its digest, fedur's own, or None: a random init drawn after torch.manual_seed(seed)), the model config's JSON (a
    custom architecture), and fedur's prompt settings (n_ctx, visual_tokens, ... as in the run's `model:`)."""
    local = pretrained is not None and Path(pretrained).expanduser().is_file()
    return {"name": name, "pretrained": str(Path(pretrained).expanduser().resolve()) if local else pretrained,
            "weights_sha256": file_digest(Path(pretrained).expanduser()) if local else None,
            "config": json.loads(Path(config_file).expanduser().read_text()) if config_file else None, "seed": seed,
            "settings": dict(settings)}


def build_backbone(record: dict, classnames: list[str], template: str, device: torch.device,
                   weights: str | None = None) -> tuple[PromptedCLIP, Callable]:
    """The frozen PromptedCLIP over `classnames` (zero-shot text from `template`) and the image preprocess, as the run
    built them (fedur/train/setup.py) from a `backbone_record`; `weights`: the local weights file to read instead of
    the recorded path (the same file moved), checked against the recorded digest."""
    pretrained = weights if weights is not None else record["pretrained"]
    if record["weights_sha256"] is not None:
        if not Path(pretrained).expanduser().is_file():
            raise ExportError(f"the backbone's weights {pretrained} are not here; give the same file with weights=PATH "
                              "(fedur-predict: --weights PATH)")
        if file_digest(Path(pretrained).expanduser()) != record["weights_sha256"]:
            raise ExportError(f"{pretrained} is not the weights file this model was trained on (its sha256 differs); "
                              "give the run's own weights file")
    settings = record["settings"]
    with tempfile.TemporaryDirectory() as folder:
        config = None
        if record["config"] is not None:  # open_clip registers a custom architecture from a file named after it
            config = str(Path(folder) / f"{record['name']}.json")
            Path(config).write_text(json.dumps(record["config"]))
        torch.manual_seed(record["seed"])  # a random-init backbone is the run's (fedur/train/setup.py)
        clip = load_clip(record["name"], pretrained, config, None)
    model = PromptedCLIP(clip, classnames, settings["n_ctx"], settings["visual_tokens"], settings["visual_depth"],
                         settings["ctx_init_std"], record["seed"], settings.get("ctx_suffix", ""))
    model.shared_prefix_text = settings.get("shared_prefix_text", True)
    model = model.to(device).eval()
    model.zero_shot_text = zero_shot_weights(clip, classnames, template, device)
    return model, clip.preprocess


class ExportedModel(nn.Module):
    """One client's model: (B, 3, S, S) images, preprocessed with `preprocess`, -> (B, C) logits over `classnames`,
    computed as the run computed them (its method's logits with the client's pieces; zero-shot CLIP's; or the server's
    model). `kind`, `client`, `round`: what it is."""

    def __init__(self, model: PromptedCLIP, method: Any, pieces: dict[str, Tensor], extra: dict[str, Tensor],
                 text: Tensor | None, preprocess: Callable, info: dict) -> None:
        super().__init__()
        self.model, self.method, self.preprocess = model, method, preprocess
        self.classnames: list[str] = list(info["classnames"])
        self.kind, self.client, self.round = info["kind"], info["client"], info["round"]
        self._names = {"piece": list(pieces), "extra": list(extra)}
        for kind, tensors in (("piece", pieces), ("extra", extra)):
            for i, value in enumerate(tensors.values()):
                self.register_buffer(f"{kind}_{i}", value.clone(), persistent=False)
        self.register_buffer("server_text", None if text is None else text.clone(), persistent=False)
        self._text: tuple[torch.device, Any] | None = None  # the text side, computed once per device

    def _tensors(self, kind: str) -> dict[str, Tensor]:
        return {name: getattr(self, f"{kind}_{i}") for i, name in enumerate(self._names[kind])}

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        model = self.model
        if self.method is None:  # zero-shot CLIP
            return model.logits(model.image_features(images, prompted=False), model.zero_shot_text)
        pieces = self._tensors("piece")
        client = ClientState(-1, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), pieces, extra=self._tensors("extra"))
        if self._text is None or self._text[0] != images.device:
            text = self.server_text if self.server_text is not None else forward.text_sides(self.method, model, [pieces])[0]
            self._text = (images.device, text)
        return forward.group_logits(self.method, model, [images], [pieces], [self._text[1]], [client], [None])[0]

    def _apply(self, fn, recurse=True):
        self._text = None  # moved: the text side is computed again on the new device
        return super()._apply(fn, recurse)


def load_exported(path: str | Path, device: str | torch.device = "cpu", weights: str | None = None) -> ExportedModel:
    """The model a `fedur-export` file holds, as an nn.Module (eval mode, on `device`) from preprocessed images to
    logits, with `.preprocess` (PIL image -> tensor) and `.classnames`. `weights`: the backbone's local weights file
    where it lies elsewhere than at export (checked against its digest). Raises an ExportError that says what to do."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ExportError(f"{path} is not a file; give the file fedur-export wrote")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise ExportError(f"{path} is not a fedur export ({type(err).__name__}: {err}); give the file fedur-export "
                          "wrote") from err
    if not isinstance(saved, dict) or saved.get("fedur_export") != FORMAT:
        raise ExportError(f"{path} is not a fedur export of format {FORMAT}; export the model again with this fedur")
    return from_export(saved, device, weights)


def from_export(saved: dict, device: str | torch.device = "cpu", weights: str | None = None) -> ExportedModel:
    """The ExportedModel of an export's content (`load_exported` reads it from its file; fedur-predict builds it from a
    run directory without writing one)."""
    device = torch.device(device)
    model, preprocess = build_backbone(saved["backbone"], saved["classnames"], saved["template"], device, weights)
    method = None
    if saved["kind"] != "zero_shot":
        method_cls = plugins.by_path("method", saved["method"]["class_path"])
        if method_cls is None:
            raise ExportError(f"its method {saved['method']['class_path']} cannot be imported here; install the "
                              "package that defines it")
        method = method_cls(**saved["method"]["init_args"])
    exported = ExportedModel(model, method, saved["pieces"], saved["extra"], saved["text"], preprocess, saved)
    return exported.to(device).eval()
