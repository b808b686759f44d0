"""What a round reports (one line of metrics.jsonl) and what the run summary adds for domain splits. Every key of the
line is declared in fedur/train/round_fields.py (what it is, its TensorBoard tags, its round-line piece, its
fedur-report column)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedur.data.datasets import ImageDataset
from fedur.data.partition import client_domains
from fedur.evaluation.calibration import ece
from fedur.federated.clock import Arrivals
from fedur.metrics import accuracies, harmonic_mean, mean, pooled
from fedur.train.label_free import LabelFree
from fedur.train.refresh import Refresh
from fedur.train.round_fields import undeclared


@dataclass(kw_only=True)
class RoundOutcome:
    """What every rank knows at the end of a round, for all K clients (rows are client ids)."""

    round_idx: int
    rounds: int  # how many the run has
    refreshed: bool  # the round began with a pseudo-label refresh
    refresh: Refresh | None  # the last refresh (None: a method without a labeller)
    joined: Tensor  # (K,) bool: sampled to take part (federation.join_rate)
    weights: Tensor  # (K,) aggregation weight of each client that took part (Method.client_weights), else 0
    accuracy: Tensor | None  # (K, 2) [correct, total] on the client's test set after aggregation (None: an asynchronous
    # server's step that did not evaluate, server.evaluate_every)
    confusion: Tensor | None = None  # (K, C, C) the clients' confusion matrices, where the round asked for them
    losses: Tensor  # (K, 4) mean loss, loss_pos, loss_neg and the first learning rate of each client that trained
    uploads: Tensor  # (K,) bytes each client sent
    seconds: float
    phase_seconds: dict[str, float]  # refresh, train, aggregate, evaluate
    trains: bool = True  # the clients that took part trained with SGD (False: a training-free method)
    piece_bytes: dict[str, int] | None = None  # {shared piece or message: bytes} of one client's upload
    method_metrics: dict[str, float] | None = None  # what the method's aggregate reported
    divergence: dict[str, dict] | None = None  # {piece: {drift_diversity, cosine_distance}} of the local updates
    training: Tensor | None = None  # (K,) bool: the clients that take part in rounds (None: all; else evaluation.new_clients)
    global_counts: Tensor | None = None  # (2,) [correct, total] of the server's model on the training clients' test union
    held_out_counts: dict[str, Tensor | None] | None = None  # {held-out set: (2,) counts} of the server's model
    privacy: dict | None = None  # privacy on: epsilon at delta after the round, the clip (Privacy.round_record)
    arrivals: Arrivals | None = None  # who was asked, lost, late, taken, and when (fedur/federated/clock.py)
    trained: Tensor | None = None  # (K,) bool: the clients that trained (None: those with weight > 0)
    kept_global: bool = False  # fewer uploads than clock.min_uploads: the global state stayed
    virtual_clock: float = 0.0  # the run's virtual seconds after this round
    poisoned: list[int] | None = None  # the attackers whose upload the round took
    label_free: LabelFree | None = None  # the estimates without labels and the calibration (fedur/train/label_free.py)
    server: dict | None = None  # an asynchronous server's step: its version, arrivals, their staleness, who started
    # (fedur/train/asynchronous.py; None: a round)


def round_record(outcome: RoundOutcome, first_round: int = 1) -> dict:
    """One line of metrics.jsonl: "round" is its number (from `first_round`: 1, as on the console; 0 in runs
    from before), every per-client list is indexed by client id. Without pseudo-labels (a method without a
    labeller: `refresh` None) the pseudo-label entries are None."""
    refresh, rounds, divergence = outcome.refresh, outcome.rounds, outcome.divergence or {}
    trained = (((outcome.weights > 0) if outcome.trained is None else outcome.trained) & outcome.trains).tolist()  # losses
    # exist for the clients that trained (also one whose upload was then lost or late)
    refreshed, losses = outcome.refreshed, outcome.losses
    num_clients = len(trained)

    def per_trained(column: int) -> list[float | None]:
        return [float(losses[k, column]) if t else None for k, t in enumerate(trained)]

    client_acc = [None] * num_clients if outcome.accuracy is None else accuracies(outcome.accuracy)
    training = torch.ones(num_clients, dtype=torch.bool, device="cpu") if outcome.training is None else outcome.training
    personal = mean([acc for acc, t in zip(client_acc, training.tolist()) if t])
    global_acc = None if outcome.global_counts is None else accuracies(outcome.global_counts.view(1, 2))[0]
    new = torch.nonzero(~training).flatten().tolist()
    held_out = {name: None if counts is None else accuracies(counts.view(1, 2))[0]
                for name, counts in (outcome.held_out_counts or {}).items()}
    row = {
        "round": outcome.round_idx + first_round,
        "rounds": rounds,
        "mean_accuracy": personal,  # personal: the plain mean over the training clients of each one's own test accuracy
        "client_accuracy": client_acc,  # every client's, new ones too
        "weighted_accuracy": None if outcome.accuracy is None else pooled(outcome.accuracy[training]),  # the same clients,
        # weighted by their test images
        "global_accuracy": global_acc,  # the server's model on the training clients' test images together
        "dual_accuracy": harmonic_mean(personal, global_acc),
        "new_clients": new,  # held out of every round (evaluation.new_clients)
        "new_client_accuracy": mean([client_acc[k] for k in new]) if new else None,  # as they arrive: the shared pieces
        # the server's model on test images no client holds: {"novel": ..., "domain:<name>": ...} (None: no global model)
        "held_out_accuracy": held_out,
        "base_novel_harmonic": harmonic_mean(personal, held_out["novel"]) if "novel" in held_out else None,
        "pseudo_label_accuracy": [None] * num_clients if refresh is None or refresh.label_hits is None
        else accuracies(refresh.label_hits),  # None without train labels
        # % of the images selected at this refresh and the previous one that kept their pseudo-label (no labels needed)
        "pseudo_label_agreement": accuracies(refresh.agreement) if refreshed and refresh.agreement is not None
        else [None] * num_clients,
        "selected": [None] * num_clients if refresh is None else refresh.selected.sum(dim=1).tolist(),
        "selected_per_class": None if refresh is None else refresh.selected.sum(dim=0).tolist(),
        "selection": refresh.selected.tolist() if refreshed else None,  # (K, C)
        "class_weights": refresh.class_weights.tolist() if refreshed and refresh.class_weights is not None else None,
        # what the other clients and the server received of each client's pseudo-labels at this refresh (the
        # cooperative estimates; privacy on: the noised rows of local privacy, or under central privacy only the
        # noised sum "released_totals")
        **(released(refresh, outcome.privacy is not None) if refreshed and refresh is not None else {}),
        "refreshed": refreshed,
        "participants": torch.nonzero(outcome.joined).flatten().tolist(),
        "lr": next((float(losses[k, 3]) for k, t in enumerate(trained) if t), None),  # the same for every client
        "loss": per_trained(0),
        "loss_pos": per_trained(1),
        "loss_neg": per_trained(2),
        "round_seconds": outcome.seconds,
        "phase_seconds": outcome.phase_seconds,
        "bytes_sent": outcome.uploads.tolist(),
        "upload_bytes": outcome.piece_bytes or {},  # {shared piece or message: bytes} of one client's upload
        "prompt_divergence": divergence,  # {piece: {drift_diversity, cosine_distance}} of the local updates
        "method": outcome.method_metrics or {},  # the method's own metrics of the round (Aggregated.metrics)
        **(outcome.privacy or {}),  # privacy on: "epsilon" (at "delta") spent so far, "clip" (and per client, local)
        **(answers(outcome.arrivals, outcome) if outcome.arrivals is not None else {}),
        **label_free_fields(outcome.label_free, training),
        **(outcome.server or {}),  # an asynchronous server's step (fedur/train/asynchronous.py)
    }
    if undeclared(row):  # internal: a key without its declaration (what it is, where it is shown)
        raise RuntimeError(f"metrics.jsonl keys {undeclared(row)} are not declared in fedur/train/round_fields.py")
    return row


def ids(mask: Tensor) -> list[int]:
    return torch.nonzero(mask).flatten().tolist()


def answers(arrivals: Arrivals, outcome: RoundOutcome) -> dict:
    """Who of the round's asked clients answered, and when (docs/system.md): client ids, and virtual seconds."""
    return {
        "asked": ids(arrivals.asked),  # drawn and uploading (privacy: every drawn client)
        "answered": ids(arrivals.answered),  # whose upload arrived, in time or late
        "dropped": ids(arrivals.lost),  # trained and sent; the upload was lost (clock.drop_rate)
        "late": ids(arrivals.late),  # past the deadline: left out, or cut short (clock.late partial)
        "surplus": ids(arrivals.surplus),  # arrived after the first wanted ones (clock.over_select): not taken
        "accepted": ids(arrivals.accepted),  # whose upload the server aggregated (unless kept_global)
        # whose pseudo-label histograms were lost at this round's refresh (clock.drop_rate)
        "histograms_lost": ids(outcome.refresh.lost) if outcome.refreshed and outcome.refresh.lost is not None else [],
        "attackers_accepted": outcome.poisoned or [],  # the attackers among them (adversary.attackers)
        "kept_global": outcome.kept_global,  # fewer than clock.min_uploads: nothing aggregated
        "virtual_seconds": arrivals.round_seconds,  # the round's virtual duration
        "virtual_clock": outcome.virtual_clock,  # the run's, after this round
        "deadline_seconds": arrivals.deadline_seconds,
        "client_virtual_seconds": [round(float(t), 6) if a else None for t, a in zip(arrivals.seconds, arrivals.asked.tolist())],
        "local_steps": [int(b) if a else None for b, a in zip(arrivals.budget, arrivals.asked.tolist())],
    }


def label_free_fields(found: LabelFree | None, training: Tensor) -> dict:
    """The round's estimates without labels ({model: {estimator: [K] %}}; None where the clients have no estimate
    images: no test labels and no validation split), the server's model's accuracy on each client's test set, and
    where labels exist the expected calibration error of each client's model and of the server's, with the bins of
    the reliability diagram (the personal models' pooled over the training clients). None each without `found`."""
    if found is None:
        return dict.fromkeys(("estimated_accuracy", "server_client_accuracy", "ece", "calibration_bins"))
    estimates = {"estimator": found.estimator, **found.estimates} if any(v is not None for v in found.estimates.values()) \
        else None
    personal_ece = [ece(bins) for bins in found.personal_bins]
    labelled = any(e is not None for e in personal_ece)
    return {
        "estimated_accuracy": estimates,
        "server_client_accuracy": None if found.server_counts is None else accuracies(found.server_counts),
        "ece": {"personal": personal_ece, "server": None if found.server_bins is None else ece(found.server_bins)}
        if labelled else None,
        "calibration_bins": {"personal": found.personal_bins[training].sum(dim=0).tolist(),
                             "server": None if found.server_bins is None else found.server_bins.tolist()} if labelled else None,
    }


def released(refresh: Refresh, private: bool) -> dict:
    """{"released_histograms": (K, C) or None, "released_totals": (C,) or None} of a refresh: the rows a client's
    histogram upload carried (the estimates in the clear without privacy; the noised rows under local privacy; none
    under central privacy, whose only release is the noised sum; neither under privacy with no histogram to release,
    a labeller that neither cooperates nor weighs its classes)."""
    if not private:  # the estimates went as they are (the selection, not cooperating)
        return {"released_histograms": refresh.estimated.tolist(), "released_totals": refresh.estimated.sum(dim=0).tolist()}
    if refresh.released_totals is None:
        return {"released_histograms": None, "released_totals": None}
    rows = refresh.released
    return {"released_histograms": None if not bool(rows.any()) else [[round(float(v), 3) for v in row] for row in rows],
            "released_totals": refresh.released_totals.tolist()}


def domain_summary(final: list[float | None] | None, dataset: ImageDataset, partition: str, num_clients: int,
                   clients_per_domain: int) -> dict:
    """Feature-skew tables report each domain's accuracy as the mean over that domain's clients (`final`: every
    client's final accuracy; zero-shot CLIP's for a run of no rounds)."""
    domains = client_domains(partition, num_clients, clients_per_domain)
    if domains is None or not final or not dataset.domain_names:
        return {}
    per_domain = {
        name: mean([acc for acc, dom in zip(final, domains) if dom == d]) for d, name in enumerate(dataset.domain_names)
    }
    return {"final_domain_accuracy": per_domain, "final_domain_mean": mean(list(per_domain.values()))}
