"""fedur-export: one client's model of a finished run as one file that labels new images without fedur's run directory.

    fedur-export RUN --client K OUT [--model personal|server|zero-shot|chosen] [--round N]

OUT holds what the client's model needs (fedur/methods/export.py): the open_clip backbone's name, its weights (a tag, a
local file with its digest, or fedur's own) and the model config of a custom architecture, fedur's prompt settings, the
method's class and settings, the pieces its logits read and its per-client state, the server's text side where its
model has one, the class names and the zero-shot template. `fedur.methods.export.load_exported(OUT)` gives it back as
an nn.Module from preprocessed images to logits, with `.preprocess` and `.classnames`.

--model: the client's personal model (default; after the last round, or after round N of a kept checkpoint), the
server's model (Method.global_model), zero-shot CLIP, or the model it chose without labels (evaluation.select
label_free: prompts/chosen/). docs/label-free.md shows a round trip.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fedur.errors import FedurError
from fedur.methods.base import GlobalView
from fedur.methods.export import FORMAT, ExportError, backbone_record, build_backbone
from fedur.methods.pieces import initial_values
from fedur.train import checkpoint

MODELS = ("personal", "server", "zero-shot", "chosen")


def run_files(run_dir: Path) -> tuple[dict, dict]:
    """(summary.json, partition.json) of a finished run, or an ExportError saying what the directory lacks."""
    if not run_dir.is_dir() or not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir} is not a fedur run directory (no config.yaml); give a finished run's run.output_dir")
    for name in ("summary.json", "partition.json"):
        if not (run_dir / name).is_file():
            raise ExportError(f"{run_dir} has no {name}: finish or resume the run first (--run.resume true)")
    return json.loads((run_dir / "summary.json").read_text()), json.loads((run_dir / "partition.json").read_text())


def round_folder(run_dir: Path, number: int | None) -> tuple[Path | None, int]:
    """The committed checkpoint after round `number` (None: the newest; (None, 0) for a run without rounds) and the
    rounds it completed; an ExportError naming the kept rounds where that one is not kept."""
    kept = checkpoint.committed_rounds(run_dir)
    if number is None:
        last = checkpoint.latest(run_dir)
        return (None, 0) if last is None else (last.folder, last.round_idx + 1)
    for folder_number, folder in kept:
        committed = checkpoint.Marker.read(folder / checkpoint.MARKER, folder_number)
        if committed.round_idx + 1 == number:
            return folder, number
    rounds = [checkpoint.Marker.read(f / checkpoint.MARKER, n).round_idx + 1 for n, f in kept]
    raise ExportError(f"--round {number}: {run_dir} keeps the checkpoints of round(s) {rounds or 'none'} only "
                      "(run.keep_checkpoints); choose one of them, or leave --round out for the final model")


def exported(run_dir: str | Path, client: int, model: str = "personal", round_number: int | None = None) -> dict:
    """The content of an export (fedur/methods/export.py) of client `client`'s `model` in the finished run `run_dir`."""
    from fedur.app.cli import parse_config  # the entry point's parser: the run's own settings
    from fedur.train.setup import load_data

    run_dir = Path(run_dir).expanduser().resolve()
    summary, partition = run_files(run_dir)
    num_clients = len(partition["train_sizes"])
    if not 0 <= client < num_clients:
        raise ExportError(f"--client {client}: the run has clients 0 .. {num_clients - 1}")
    if model not in MODELS:
        raise ExportError(f"--model {model}: choose one of {', '.join(MODELS)}")
    cfg = parse_config(["--config", str(run_dir / "config.yaml"), "--run.progress", "false"])
    method, classnames = cfg.method, partition["classnames"]
    template = summary.get("template") or load_data(cfg).template  # a run from before summaries recorded it
    record = backbone_record(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.run.seed,
                             {key: getattr(cfg.model, key) for key in ("n_ctx", "visual_tokens", "visual_depth", "ctx_init_std",
                                                                       "ctx_suffix", "shared_prefix_text")})
    kind, pieces, extra, text, estimate = model.replace("-", "_"), {}, {}, None, None
    if kind != "zero_shot" and not method.rounds(1):
        raise ExportError(f"{type(method).__name__} has no rounds and no model of its own: export --model zero-shot")
    done = summary.get("rounds_completed", 0)
    number = done if round_number is None else round_number
    if model == "chosen":
        file = run_dir / "prompts" / "chosen" / f"client_{client:03d}.pt"
        if not file.is_file():
            raise ExportError(f"{run_dir} kept no label-free choice (prompts/chosen/ is missing): run it with "
                              "--evaluation.select label_free, or export --model personal or server")
        chosen = torch.load(file, map_location="cpu", weights_only=True)
        kind, number, estimate = chosen["model"], chosen["round"], chosen["estimate"]
        pieces, extra, text = chosen.get("pieces") or {}, chosen.get("extra") or {}, chosen.get("text")
    elif kind == "personal" and round_number is None:  # the final model (a new client's after its adaptation)
        final = torch.load(run_dir / "prompts" / f"client_{client:03d}.pt", map_location="cpu", weights_only=True)
        declared = method.pieces()
        pieces = {name: t for name, t in final.items() if name in declared}
        extra = {name: t for name, t in final.items() if name not in declared and name != "client_id"}
    elif kind == "personal":
        folder, number = round_folder(run_dir, round_number)
        state = checkpoint.load(folder / f"client_{client:03d}.pt")
        pieces, extra = dict(state["prompts"]), dict(state["extra"])
    elif kind == "server":
        folder, number = round_folder(run_dir, round_number)
        pieces, extra, text = server_model(run_dir, folder, cfg, record, classnames, template, summary)
    if kind == "zero_shot":
        number = 0
    return {"fedur_export": FORMAT, "kind": kind, "client": client, "round": number, "estimate": estimate,
            "run": str(run_dir), "backbone": record, "classnames": list(classnames), "template": template,
            "method": None if kind == "zero_shot" else cfg.settings["method"], "pieces": pieces, "extra": extra, "text": text}


def server_model(run_dir: Path, folder: Path | None, cfg, record: dict, classnames: list[str], template: str,
                 summary: dict) -> tuple[dict, dict, torch.Tensor | None]:
    """(pieces, extra, text) of the server's model (Method.global_model) after the checkpoint in `folder`: its shared
    pieces and state, the training clients' pieces for the means it reads, over the run's classes."""
    from fedur.train.server import ServerState

    method = cfg.method
    model, _ = build_backbone(record, classnames, template, torch.device("cpu"))
    start = initial_values(method.pieces(), model, cfg.run.seed)
    server = ServerState.start(method, model, start)
    if folder is not None:
        saved = checkpoint.load(folder / "global.pt")
        server.shared = {**server.shared, **{k: t for k, t in saved["shared"].items() if k in server.shared}}
        server.method = dict(saved.get("method", {}))
    new = set(summary.get("new_clients") or [])
    clients = [] if folder is None else [checkpoint.load(p)["prompts"] for p in sorted(folder.glob("client_*.pt"))
                                         if int(p.stem.removeprefix("client_")) not in new]

    def client_mean(name: str) -> torch.Tensor:
        return torch.stack([c[name] for c in clients]).mean(dim=0)

    held = method.global_model(model, GlobalView(dict(server.shared), dict(server.method), start, client_mean))
    if held is None:
        raise ExportError(f"{type(method).__name__} has no server's model (its global_model gives none): export --model "
                          "personal")
    text = held.text if isinstance(held.text, torch.Tensor) else None
    if held.text is not None and text is None:
        raise ExportError(f"{type(method).__name__}'s server model has a text side that is not a tensor; it cannot be "
                          "written to a file: export --model personal")
    return dict(held.pieces), dict(held.extra), text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedur-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished fedur run (its run.output_dir)")
    parser.add_argument("--client", type=int, required=True, help="the client whose model to export (0 .. K-1)")
    parser.add_argument("out", type=Path, help="the file to write (e.g. client_3.pt)")
    parser.add_argument("--model", choices=MODELS, default="personal",
                        help="personal (default), the server's, zero-shot CLIP, or the one chosen without labels")
    parser.add_argument("--round", type=int, default=None, help="after this round (a kept checkpoint; default: the last)")
    args = parser.parse_args(argv)
    try:
        content = exported(args.run_dir, args.client, args.model, args.round)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(content, args.out)
    except FedurError as err:
        print(f"fedur-export: error: {err.one_line()}", file=sys.stderr)
        return 2
    print(f"client {args.client}'s {content['kind'].replace('_', '-')} model after round {content['round']} "
          f"({len(content['classnames'])} classes) written to {args.out}; load it with "
          f"fedur.methods.export.load_exported({str(args.out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
