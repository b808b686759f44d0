"""Evaluation without labels, in the run: each client's accuracy estimated every round from the logits of its
unlabelled images (its label-free validation split where there is one, else the test images' logits the evaluation
computes anyway), for its personal model, the server's model and zero-shot CLIP; calibration where labels exist; and
with evaluation.select label_free, the model each client keeps (docs/label-free.md).

The math is fedur/evaluation/ (pure functions of logits and of the recorded numbers); this module runs it on each
client's rank, gathers the per-client values in client-id order (placement-free), and keeps in each ClientState what
the next rounds need (`client.label_free`): zero-shot CLIP's predictions on its estimate images (the reference of
agreement_zero_shot) and the model chosen so far, with its pieces."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from fedur.evaluation.calibration import calibration_bins, empty_bins
from fedur.evaluation.choice import label_free_choice
from fedur.evaluation.estimators import ESTIMATORS, as_percent, estimates
from fedur.federated.client import ClientState, to_cpu
from fedur.methods.base import GlobalModel
from fedur.train.host import Host, LabelFreeSettings, Model

MODELS = ("personal", "server")  # a round's models (zero-shot CLIP: once, before the first round)
CHOSEN = "chosen"  # client.label_free's key of the model chosen so far
ZERO_SHOT = "zero_shot_predictions"  # client.label_free's key of zero-shot CLIP's (n,) predictions on its estimate images


@dataclass
class Seen:
    """What an evaluation pass saw that the estimates read: each hosted client's logits and labels on its test images
    (its personal model; zero-shot CLIP in the zero-shot pass), the server's model's where it shares the pass, and the
    server's calibration bins on the training clients' test images together."""

    personal: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    server: dict[int, list[tuple[Tensor, Tensor]]] | None = None  # {client: [(logits, labels) per batch]} of every image,
    # where the server's model shares the personal pass ({} then, on every rank; None where it does not)
    server_bins: Tensor = field(default_factory=empty_bins)  # (BINS, 3): each test image once (its owner's)

    def add_server(self, client_id: int, logits: Tensor, labels: Tensor) -> None:
        self.server.setdefault(client_id, []).append((logits, labels))

    def server_logits(self, client_id: int) -> tuple[Tensor, Tensor] | None:
        parts = (self.server or {}).get(client_id)
        return None if not parts else (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))


@dataclass
class LabelFree:
    """A round's label-free evaluation, the same on every rank, for all K clients."""

    estimates: dict[str, dict[str, list[float | None]] | None]  # {model: {estimator: [K] %} or None (no estimate)}
    server_counts: Tensor | None  # (K, 2) the server's model on each client's own test set (None: not computed)
    personal_bins: Tensor  # (K, BINS, 3) each client's personal model on its test set (zeros without test labels)
    server_bins: Tensor | None  # (BINS, 3) the server's model on the training clients' test images together
    estimator: str = ""  # evaluation.estimator


def _vector(values: dict[str, float | None]) -> Tensor:
    """(E,) float64 in ESTIMATORS order, NaN for None (what the gather carries)."""
    return torch.tensor([math.nan if values.get(name) is None else values[name] for name in ESTIMATORS],
                        dtype=torch.float64, device="cpu")


def _lists(table: Tensor) -> dict[str, list[float | None] | None] | None:
    """{estimator: [K] values, None for NaN} of a gathered (K, E) table; an estimator without any value is None, and a
    table without any value None (no estimate images: no test labels and no validation split)."""
    out = {name: [None if math.isnan(v) else v for v in table[:, e].tolist()] for e, name in enumerate(ESTIMATORS)}
    out = {name: None if all(v is None for v in values) else values for name, values in out.items()}
    return None if all(values is None for values in out.values()) else out


def _percent(logits: Tensor, references: dict[str, Tensor | None]) -> Tensor:
    return _vector(as_percent(estimates(logits, references)))


def zero_shot(host: Host, seen: Seen, settings: LabelFreeSettings) -> dict:
    """Zero-shot CLIP's estimates and calibration, from the zero-shot pass over the test images (`seen`) or a pass over
    the validation images; each hosted client keeps zero-shot's predictions on its estimate images (agreement_zero_shot's
    reference) and, choosing, zero-shot as its first choice. Returns {"estimates": {estimator: [K] %} or None,
    "bins": (K, BINS, 3)}. Every rank calls this."""
    images = host.predict("validation", zero_shot=True) if settings.validation else seen.personal
    values = {}
    for client in host.clients:
        logits = images.get(client.client_id, (None,))[0]
        if logits is None:
            continue
        predictions = logits.argmax(dim=-1)
        values[client.client_id] = _percent(logits, {"zero_shot": None})  # (no agreement: it is the reference)
        client.label_free[ZERO_SHOT] = predictions
        if settings.select:
            estimate = values[client.client_id][ESTIMATORS.index(settings.estimator)].item()
            client.label_free[CHOSEN] = {"model": "zero_shot", "round": 0,
                                         "estimate": None if math.isnan(estimate) else estimate}
    like = torch.full((len(ESTIMATORS),), math.nan, dtype=torch.float64, device="cpu")
    table = host.gather(values, like=like, what="zero-shot estimates")
    bins = {k: calibration_bins(logits, labels) for k, (logits, labels) in seen.personal.items()}
    return {"estimates": _lists(table), "bins": host.gather(bins, like=empty_bins(), what="zero-shot calibration")}


def round_label_free(host: Host, seen: Seen, server: Model | None, held: GlobalModel | None, round_idx: int,
                     settings: LabelFreeSettings, labelled: bool) -> LabelFree:
    """The round's estimates (personal and server's model, on each client's estimate images), the server's model's
    accuracy on each client's test set (where it is free: its logits came from the personal pass, or a validation split
    asks for it), the calibration bins; choosing, each hosted client keeps the candidate of this round its estimator
    rates above its choice so far. `server`: the server's model as Host.predict scores with it (None: none). Every
    rank calls this (and makes the same collectives)."""
    if settings.validation:
        personal = host.predict("validation")
        theirs = None if server is None else host.predict("validation", model_of=server)
    else:
        personal = seen.personal
        theirs = None if seen.server is None else {k: seen.server_logits(k) for k in seen.server}
    with_server = server is not None and (settings.validation or seen.server is not None)
    values: dict[int, Tensor] = {}
    for client in host.clients:
        if client.client_id not in personal:
            continue
        logits = personal[client.client_id][0]
        server_logits = None if theirs is None or theirs.get(client.client_id) is None else theirs[client.client_id][0]
        zero = client.label_free.get(ZERO_SHOT)
        server_predictions = None if server_logits is None else server_logits.argmax(dim=-1)
        row = [_percent(logits, {"zero_shot": zero, "server": server_predictions})]
        row.append(_percent(server_logits, {"zero_shot": zero}) if server_logits is not None
                   else torch.full((len(ESTIMATORS),), math.nan, dtype=torch.float64, device="cpu"))
        values[client.client_id] = torch.stack(row)  # (2, E)
        if settings.select:
            keep_better(client, round_idx, row, held, settings.estimator)
    like = torch.full((2, len(ESTIMATORS)), math.nan, dtype=torch.float64, device="cpu")
    table = host.gather(values, like=like, what="estimated accuracies")  # (K, 2, E)
    found = {"personal": _lists(table[:, 0]), "server": _lists(table[:, 1]) if with_server else None}
    bins = {k: calibration_bins(logits, labels) for k, (logits, labels) in seen.personal.items()} if labelled else {}
    personal_bins = host.gather(bins, like=empty_bins(), what="calibration")
    return LabelFree(found, server_counts(host, seen, server, settings, labelled), personal_bins, None, settings.estimator)


def server_counts(host: Host, seen: Seen, server: Model | None, settings: LabelFreeSettings, labelled: bool) -> Tensor | None:
    """(K, 2) [correct, total] of the server's model on each client's own test set: from the personal pass where it
    scored the same features there (`seen.server`), else, with a validation split, from a pass of its own (None
    otherwise, and without a server's model or test labels). Every rank calls this."""
    if server is None or not labelled or (seen.server is None and not settings.validation):
        return None
    found = {}
    scored = {k: seen.server_logits(k) for k in seen.server} if seen.server is not None else \
        host.predict("test", model_of=server)
    for client in host.clients:
        logits, labels = scored.get(client.client_id) or (torch.zeros(0, 1, device="cpu"),
                                                           torch.zeros(0, dtype=torch.long, device="cpu"))
        correct = int((logits.argmax(dim=-1) == labels).sum()) if len(labels) else 0
        found[client.client_id] = torch.tensor([correct, len(labels)], dtype=torch.long, device="cpu")
    return host.gather(found, like=torch.zeros(2, dtype=torch.long, device="cpu"), what="the server's accuracy per client")


def keep_better(client: ClientState, round_idx: int, row: list[Tensor], held: GlobalModel | None, estimator: str) -> None:
    """evaluation.select label_free: the client's personal model, then the server's, replaces its choice so far where
    its estimate is higher (a candidate without one is passed over; fedur/evaluation/choice.py::choose compares the
    recorded values in the same order)."""
    e = ESTIMATORS.index(estimator)
    for model, values in zip(MODELS, row):
        estimate = values[e].item()
        chosen = client.label_free.get(CHOSEN) or {}
        if math.isnan(estimate) or (chosen.get("estimate") is not None and not estimate > chosen["estimate"]):
            continue
        if model == "personal":
            pieces, extra, text = client.pieces, client.extra, None
        else:
            pieces, extra = held.pieces, held.extra
            text = held.text if isinstance(held.text, Tensor) else None
        client.label_free[CHOSEN] = {"model": model, "round": round_idx + 1, "estimate": estimate,
                                     "pieces": to_cpu(dict(pieces)), "extra": to_cpu(dict(extra)), "text": to_cpu(text)}


def summary(rows: list[dict], zero_shot: dict, settings: LabelFreeSettings, training: list[int]) -> dict:
    """summary.json's label-free entries: the estimator, each estimator's error where labels exist
    (fedur/evaluation/choice.py::estimator_errors), the final calibration, and choosing, the label-free choice."""
    from fedur.evaluation.choice import estimator_errors

    out: dict = {"estimator": settings.estimator, "validation_split": settings.validation,
                 "final_estimated_mean": final_estimate(rows, zero_shot, settings.estimator, training)}
    if rows and rows[-1].get("estimated_accuracy") is not None:
        out["estimator_errors"] = estimator_errors(rows, zero_shot, list(ESTIMATORS), training)
    if rows and rows[-1].get("ece") is not None:
        out["final_ece"] = rows[-1]["ece"]
    if settings.select:
        out["label_free_choice"] = label_free_choice(rows, zero_shot, settings.estimator, training)
    return out


def final_estimate(rows: list[dict], zero_shot: dict, estimator: str, training: list[int]) -> float | None:
    """The mean over the training clients of the last round's personal models' estimate (zero-shot CLIP's for a run of
    no rounds): what fedur-tables ranks a grid's runs by, without labels."""
    if rows:
        values = ((rows[-1].get("estimated_accuracy") or {}).get("personal") or {}).get(estimator)
    else:
        values = (zero_shot.get("zero_shot_estimated_accuracy") or {}).get(estimator)
    present = [values[k] for k in training if values is not None and values[k] is not None]
    return sum(present) / len(present) if present else None


def check_and_save_choice(host: Host, choice: dict, folder: Path) -> None:
    """Each hosted client's chosen model to `folder`/client_XXX.pt (its pieces, the method's state, the server's text
    side where it had one; model, round, estimate), after checking that the choice kept round by round is the one the
    recorded estimates give (a mismatch is fedur's bug). Every rank calls this."""
    kinds = ("zero_shot", *MODELS)
    mine = {c.client_id: torch.tensor([kinds.index(c.label_free[CHOSEN]["model"]), c.label_free[CHOSEN]["round"]], device="cpu")
            for c in host.clients}
    kept = host.gather(mine, like=torch.zeros(2, dtype=torch.long, device="cpu"), what="the chosen models")
    recorded = [[kinds.index(c["model"]), c["round"]] if c["model"] else [0, 0] for c in choice["clients"]]
    if kept.tolist() != recorded:  # internal: the running choice and the recorded estimates disagree
        raise RuntimeError(f"label-free choice kept {kept.tolist()} but the recorded estimates choose {recorded}")
    folder.mkdir(parents=True, exist_ok=True)
    for client in host.clients:
        chosen = client.label_free[CHOSEN]
        torch.save({"client_id": client.client_id, **chosen}, folder / f"client_{client.client_id:03d}.pt")
