"""fedur-attack: what a finished run's models leak of the clients' images (membership inference) and what the server
learns of each client's label distribution (the histogram attack); docs/privacy-attacks.md.

    fedur-attack RUN [--device cpu|cuda] [--batch-size N] [--seed S]

The run is rebuilt from its own config.yaml (its model, data and split, as the run made them) and its last committed
checkpoint. Members are each training client's train images, non-members its test images (the same distribution:
fedur's label-skew splits give a client's test images its own skew), balanced per client. Attacked: the server's model
(Method.global_model) on every client's images pooled, each client's personal model on its own, and zero-shot CLIP
for reference (it saw none of the images: its AUC should be near 0.5). Writes RUN/attack/membership.json and
RUN/attack/histograms.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from lightning import Fabric
from torch import Tensor

from fedur.data.loaders import in_batches
from fedur.errors import FedurError
from fedur.federated.client import ClientState
from fedur.federated.collectives import Collectives
from fedur.launch_env import LaunchEnv
from fedur.privacy.histogram_attack import histogram_attack
from fedur.privacy.membership_attack import attack_scores, balanced, mean_rows, measured
from fedur.train import checkpoint
from fedur.train.evaluate import ServerModel, global_model_of, prepared
from fedur.train.host import Host
from fedur.train.progress import QUIET
from fedur.train.server import ServerState
from fedur.train.setup import setup

ATTACKS = {
    "loss": "Yeom et al. 2018: score = -cross-entropy of the true label (without labels: max softmax)",
    "calibrated": "Watson et al. 2022, difficulty calibration: score = -(loss under the attacked model - loss under "
                  "zero-shot CLIP), the reference model that saw none of the clients' images (offline: no extra "
                  "training). Not LiRA (Carlini et al. 2022): its reference models must be trained with and without each "
                  "client's images, K more runs of the federation",
}


class AttackError(FedurError, ValueError):
    """The directory cannot be attacked as asked; the message says why and what to do."""


@dataclass
class Rebuilt:
    """A finished run as its last committed round left it, on one process."""

    run_dir: Path
    host: Host  # its model, data, split and clients (their final pieces)
    server: ServerModel | None  # the server's model (None: the method has none)
    train_labels: np.ndarray | None  # (N,) the true label of every train row (None: the data has none)
    summary: dict
    round: int  # rounds completed at the checkpoint (0: none)


def finished_run(run_dir: Path) -> dict:
    """summary.json of a finished fedur run, or an AttackError saying what the directory lacks."""
    if not run_dir.is_dir():
        raise AttackError(f"{run_dir} is not a directory: give a finished fedur run's directory (its run.output_dir)")
    if not (run_dir / "config.yaml").is_file():
        raise AttackError(f"{run_dir} holds no config.yaml: give a finished fedur run's directory (its run.output_dir)")
    if not (run_dir / "summary.json").is_file():
        raise AttackError(f"{run_dir} has not finished (no summary.json): finish or resume it first (--run.resume true)")
    if not (run_dir / "partition.json").is_file():
        raise AttackError(f"{run_dir} holds no partition.json: it was not written by a fedur run; give a finished run")
    return json.loads((run_dir / "summary.json").read_text())


def rebuild(run_dir: Path, device: str) -> Rebuilt:
    """The run's host (its own data and split, the clients restored from the last committed round: a split that
    differs from the checkpoint's is refused) and the server's model, on `device`."""
    from fedur.app.cli import parse_config  # the entry point's parser: the run's own settings

    summary = finished_run(run_dir)
    committed = checkpoint.latest(run_dir)
    if committed is None and summary.get("rounds_completed"):
        raise AttackError(f"{run_dir} holds no committed round: its checkpoints were removed, so its models are lost")
    if device == "cuda" and not torch.cuda.is_available():
        raise AttackError("--device cuda: no CUDA device is visible here; leave --device at cpu")
    cfg = parse_config(["--config", str(run_dir / "config.yaml"), "--run.progress", "false"])
    fabric = Fabric(accelerator=device, devices=1, precision=LaunchEnv.read().resolved_precision(replace(cfg.fabric, accelerator=device)))
    host, truth, _ = setup(fabric, Collectives(fabric), cfg, QUIET)
    server = ServerState.start(host.method, host.model, host.start)
    if committed is not None:
        saved = checkpoint.restore(committed, host.clients)  # the final pieces; a changed split is a CheckpointError
        server.shared = {**server.shared, **{k: t for k, t in saved["shared"].items() if k in server.shared}}
        server.method = dict(saved.get("method", {}))
    held = global_model_of(host, server, host.model)
    server_model = None if held is None else prepared(fabric, host.method, host.model, held)
    return Rebuilt(run_dir, host, server_model, truth.train_labels, summary, 0 if committed is None else committed.round_idx + 1)


@torch.no_grad()
def logits_of(run: Rebuilt, client: ClientState, split: str, rows: np.ndarray, batch_size: int) -> dict[str, Tensor]:
    """{"zero_shot", "personal", "server"}: (n, C) float32 logits on the CPU of the images at `rows` of `split`, each
    image read once (its features from the frozen-feature cache where it is on: zero-shot CLIP's, and the models' where
    their image tower carries no prompt). Every model is queried as a black box, without the image's position among the client's train
    images (`rows=None`: what a method does for an image it does not hold)."""
    host, server = run.host, run.server
    fabric, model, method = host.fabric, host.model, host.method
    own = client.on(fabric.device)
    out: dict[str, list[Tensor]] = {"zero_shot": [], "personal": [], **({} if server is None else {"server": []})}
    plan = in_batches(rows, batch_size)
    frozen = None if host.features is None else host.batches(split, plan, zero_shot=True)  # the reference's features
    with fabric.autocast():
        text = method.text_side(model, own.pieces)
        for images in host.batches(split, plan):
            images = fabric.to_device(images)
            reference = images if frozen is None else fabric.to_device(next(frozen))
            logits = {"zero_shot": model.logits(model.image_features(reference, prompted=False), model.zero_shot_text),
                      "personal": method.logits(model, images, own.pieces, text, own, None)}
            if server is not None:
                logits["server"] = method.logits(model, images, server.client.pieces, server.text, server.client, None)
            for name, x in logits.items():
                out[name].append(x.float().cpu())  # device-to-host copy per batch and model
    num_classes = model.num_classes
    return {name: torch.cat(parts) if parts else torch.zeros(0, num_classes, device="cpu") for name, parts in out.items()}


Scores = dict[str, dict[str, np.ndarray]]  # model ("personal", "server", "zero_shot") -> attack -> (n,) scores


def client_scores(run: Rebuilt, client: ClientState, kept: tuple[np.ndarray, np.ndarray], labelled: bool,
                  batch_size: int) -> tuple[Scores, Scores]:
    """(members', non-members') scores of every model and attack: the client's train and test images at the `kept`
    positions, each image's reference the zero-shot logits of the same image."""
    sides = []
    for split, indices, positions in (("train", client.train_indices, kept[0]), ("test", client.test_indices, kept[1])):
        picked = indices[positions]
        labels = run.train_labels if split == "train" else run.host.dataset.test.labels
        truth = torch.from_numpy(labels[picked]).long() if labelled else None
        logits = logits_of(run, client, split, picked, batch_size)
        sides.append({name: attack_scores(x, logits["zero_shot"], truth) for name, x in logits.items()})
    return sides[0], sides[1]


def membership(run: Rebuilt, batch_size: int, seed: int) -> dict:
    """membership.json: every attacked model's AUC and TPR at 1% FPR for each attack (and the notes that qualify
    them). Prints a progress line per client on stderr."""
    host = run.host
    labelled = run.train_labels is not None and host.dataset.test.labelled
    training = [c for c in host.clients if host.training[c.client_id]]
    notes = notes_on(run, labelled, len(training))
    pooled: dict[str, list[tuple[Scores, Scores]]] = {"server": [], "zero_shot": []}  # each client's part
    personal, started = [], time.perf_counter()
    for i, client in enumerate(training):
        kept = balanced(len(client.train_indices), len(client.test_indices), seed, client.client_id)
        if len(kept[0]) == 0:
            empty = "train" if len(client.train_indices) == 0 else "test"
            notes.append(f"client {client.client_id} has no {empty} images: not attacked")
            continue
        members, non_members = client_scores(run, client, kept, labelled, batch_size)
        for name in pooled:
            if name in members:
                pooled[name].append((members[name], non_members[name]))
        personal += result_rows(f"client_{client.client_id:03d}", members["personal"], non_members["personal"], labelled)
        print(f"fedur-attack: client {client.client_id} scored ({i + 1}/{len(training)}): {len(kept[0])} members, "
              f"{len(kept[1])} non-members, {len(members)} models, {time.perf_counter() - started:.1f}s",
              file=sys.stderr, flush=True)
    together = {}  # the server's model and the reference on every client's images together
    for name, parts in pooled.items():
        if parts:
            merged = [{a: np.concatenate([part[side][a] for part in parts]) for a in parts[0][side]} for side in (0, 1)]
            together[name] = result_rows(name, merged[0], merged[1], labelled)
    rows = [*together.get("server", []), *personal, *together.get("zero_shot", [])]
    means = mean_rows(personal, "personal_mean")
    return {"run": str(run.run_dir), "method": host.method.key, "round": run.round, "seed": seed,
            "members": "each training client's train images", "non_members": "its test images, balanced per client",
            "reference": "zero-shot CLIP (the frozen backbone before any federated training)", "attacks": ATTACKS,
            "results": rows, "personal_mean": means, "notes": notes, "summary": headline(rows, means)}


def headline(rows: list[dict], means: list[dict]) -> dict[str, float]:
    """membership.json's "summary": one number per model and attack, as fedur-tables reads them ("server_auc",
    "server_calibrated_auc", "personal_auc" (the mean over the personal models), "zero_shot_auc", and each one's
    "..._tpr_at_1pct_fpr")."""
    out = {}
    for row in [r for r in rows if r["model"] in ("server", "zero_shot")] + means:
        name = "personal" if row["model"] == "personal_mean" else row["model"]
        suffix = "" if row["attack"] == "loss" else f"_{row['attack']}"
        out[f"{name}{suffix}_auc"] = row["auc"]
        out[f"{name}{suffix}_tpr_at_1pct_fpr"] = row["tpr_at_1pct_fpr"]
    return out


def notes_on(run: Rebuilt, labelled: bool, clients: int) -> list[str]:
    """What qualifies the run's numbers: the scores without labels, the clients and models left out, a shared test
    set."""
    host, notes = run.host, []
    if not labelled:
        notes.append("the run's data lacks train or test labels: 'loss' is the confidence attack (max softmax) and "
                     "'calibrated' reads the attacked model's prediction as the label")
    if host.new_clients:
        notes.append(f"new clients {host.new_clients} are left out: they took part in no round")
    if run.server is None:
        notes.append(f"{type(host.method).__name__} has no server model (its global_model gives None): not attacked")
    if json.loads((run.run_dir / "partition.json").read_text()).get("test_ids", []) is None and clients > 1:
        notes.append("every client is tested on the same test set: its non-members do not follow its own class shares, "
                     "so an AUC mixes membership with the class skew")
    return notes


def result_rows(model: str, members: dict[str, np.ndarray], non_members: dict[str, np.ndarray], labelled: bool) -> list[dict]:
    return [{"model": model, "attack": attack, "score": "loss" if labelled else "confidence",
             **measured(members[attack], non_members[attack])} for attack in members]


def histograms(run_dir: Path, summary: dict, training: list[int]) -> dict:
    """histograms.json: the histogram attack on the run's records (metrics.jsonl, partition.json)."""
    partition = json.loads((run_dir / "partition.json").read_text())
    settings = summary.get("settings") or {}
    mode = (summary.get("privacy") or {}).get("mode") or (settings.get("privacy") or {}).get("mode") or "none"
    if partition.get("train") is None:
        return {"privacy": mode, "available": False, "reason": "the run's train images have no labels: their true class "
                "shares are unknown"}
    metrics = run_dir / "metrics.jsonl"  # none: a run of no rounds
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    result = histogram_attack(partition["train"], lines, mode, training)
    if not result["per_refresh"] and not result["missing"]:
        return {**result, "available": False, "reason": "the run has no pseudo-label refresh (it ran no round, or "
                "its method uses no labeller): no histogram was sent"}
    return {**result, "available": result["mean_tv"] is not None}


def attack(run_dir: Path, device: str = "cpu", batch_size: int | None = None, seed: int = 0) -> tuple[dict, dict]:
    """(membership.json, histograms.json) of the finished run in `run_dir`, written to run_dir/attack/."""
    run_dir = Path(run_dir).expanduser().resolve()
    run = rebuild(run_dir, device)
    size = batch_size or run.host.work.eval_batch_size
    try:
        members = {**membership(run, size, seed), "device": str(run.host.fabric.device), "batch_size": size}
    finally:
        run.host.images.close()
    leak = {"run": str(run_dir), **histograms(run_dir, run.summary, [k for k in range(run.host.num_clients) if run.host.training[k]])}
    out = run_dir / "attack"
    out.mkdir(exist_ok=True)
    (out / "membership.json").write_text(json.dumps(members, indent=1) + "\n")
    (out / "histograms.json").write_text(json.dumps(leak, indent=1) + "\n")
    return members, leak


def table(members: dict, leak: dict) -> str:
    """The console's summary of both attacks."""
    head = f"{'model':<14} {'attack':<11} {'score':<10} {'AUC':>6} {'TPR@1%FPR':>9} {'members':>8} {'non-members':>11}"
    lines = [f"membership inference on {members['run']} ({members['method']}, round {members['round']}): members are train "
             "images, non-members test images; calibrated = loss less zero-shot CLIP's (Watson et al. 2022)", head]
    for row in members["results"] + members["personal_mean"]:
        lines.append(f"{row['model']:<14} {row['attack']:<11} {row['score']:<10} {row['auc']:>6.3f} {row['tpr_at_1pct_fpr']:>9.3f} "
                     f"{row['members']:>8} {row['non_members']:>11}")
    lines += [f"note: {note}" for note in members["notes"]]
    if not leak.get("available"):
        lines.append(f"histogram attack (privacy {leak['privacy']}): " + (leak.get("reason") or "; ".join(
            f"round {m['round']}: {m['missing']}" for m in leak["missing"])))
        return "\n".join(lines)
    lines += [f"histogram attack (privacy {leak['privacy']}, refresh of round {leak['round']}, from {leak['source']}): total "
              "variation between each client's true class shares and the server's estimate (0: exact, 1: disjoint)",
              f"{'client':>6} {'TV estimate':>11} {'TV uniform':>10} {'TV global':>9}"]
    for c in leak["clients"]:
        lines.append(f"{c['client']:>6} {c['tv']:>11.3f} {c['tv_uniform']:>10.3f} {c['tv_global']:>9.3f}")
    lines.append(f"{'mean':>6} {leak['mean_tv']:>11.3f} {leak['mean_tv_uniform']:>10.3f} {leak['mean_tv_global']:>9.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedur-attack", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished fedur run (its run.output_dir)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the models run (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=None, help="images per forward pass (default: the run's "
                        "optim.eval_batch_size)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the balancing subsample (default: 0)")
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    try:
        members, leak = attack(args.run_dir, args.device, args.batch_size, args.seed)
    except FedurError as err:
        print(f"fedur-attack: error: {err.one_line()}", file=sys.stderr)
        return 2
    print(table(members, leak))
    out = Path(members["run"]) / "attack"
    print(f"wrote {out / 'membership.json'}, {out / 'histograms.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
