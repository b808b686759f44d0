"""What a round reports (one line of metrics.jsonl) and what the run summary adds for domain splits."""

from __future__ import annotations

import torch
from torch import Tensor

from fedur.config import Config
from fedur.data.datasets import ImageDataset
from fedur.data.partition import client_domains
from fedur.train.recorder import accuracies, mean
from fedur.train.refresh import Refresh


def round_record(
    round_idx: int,
    rounds: int,
    refresh: Refresh,
    refreshed: bool,
    joined: Tensor,
    weights: Tensor,
    accuracy: Tensor,
    losses: Tensor,
    uploads: Tensor,
    lr: float,
    seconds: float,
) -> dict:
    """One line of metrics.jsonl: every per-client list is indexed by client id."""
    trained = (weights > 0).tolist()
    client_acc = accuracies(accuracy)

    def per_trained(column: int) -> list[float | None]:
        return [float(losses[k, column]) if t else None for k, t in enumerate(trained)]

    return {
        "round": round_idx,
        "rounds": rounds,
        "mean_accuracy": mean(client_acc),
        "client_accuracy": client_acc,
        "pseudo_label_accuracy": accuracies(refresh.label_hits),
        "selected": refresh.selected.sum(dim=1).tolist(),
        "selected_per_class": refresh.selected.sum(dim=0).tolist(),
        "selection": refresh.selected.tolist() if refreshed else None,  # (K, C)
        "class_weights": refresh.class_weights.tolist() if refreshed and refresh.class_weights is not None else None,
        "refreshed": refreshed,
        "participants": torch.nonzero(joined).flatten().tolist(),
        "lr": lr,
        "loss": per_trained(0),
        "loss_pos": per_trained(1),
        "loss_neg": per_trained(2),
        "round_seconds": seconds,
        "bytes_sent": uploads.tolist(),
    }


def domain_summary(rounds: list[dict], dataset: ImageDataset, cfg: Config) -> dict:
    """Feature-skew tables report each domain's accuracy as the mean over that domain's clients."""
    fed = cfg.federation
    domains = client_domains(fed.partition, fed.num_clients, fed.clients_per_domain)
    if domains is None or not rounds or not dataset.domain_names:
        return {}
    final = rounds[-1]["client_accuracy"]
    per_domain = {
        name: mean([acc for acc, dom in zip(final, domains) if dom == d]) for d, name in enumerate(dataset.domain_names)
    }
    return {"final_domain_accuracy": per_domain, "final_domain_mean": mean(list(per_domain.values()))}
