"""The pseudo-label refresh: every client labels its data with its current model and the labeller selects
its training samples (for the cooperative labellers, from the combined histograms of all clients: FedUR
sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from fedur.federated import streams
from fedur.federated.attacks import flipped_labels
from fedur.federated.client import check_tensors
from fedur.labels.base import Labeller, PseudoLabels
from fedur.privacy.mechanism import released_counts

if TYPE_CHECKING:
    from fedur.privacy import Privacy
    from fedur.train.host import Host


@dataclass
class Refresh:
    """What every rank knows after a refresh, for all clients (rows are client ids)."""

    estimated: Tensor  # (K, C) u_k: filtered argmax histograms, the clients' uploads (else `selected`)
    quotas: Tensor  # (K, C) allocated u~_k (equal to `selected` for labellers that do not cooperate)
    selected: Tensor  # (K, C) realized selected counts
    label_hits: Tensor | None  # (K, 2) selected samples whose pseudo-label is right, and selected samples
    # (monitoring; None when the train images have no labels)
    class_weights: Tensor | None  # (C,) global weights of L_pos
    agreement: Tensor | None = None  # (K, 2) images selected at this refresh and the previous one with the same
    # pseudo-label both times, and images selected both times (label-free monitoring; None at the first refresh)
    released: Tensor | None = None  # privacy on: (K, C) what each client's histogram (the cooperative estimate, else its
    # selected counts) released to the others (local: noised; central: nothing, a row of zeros), and
    released_totals: Tensor | None = None  # (C,) the released sum (the quotas' denominators, or the class weights')
    lost: Tensor | None = None  # (K,) bool: whose histograms were lost on the way (federation.drop_rate; None: none)


@dataclass(frozen=True)
class Answering:
    """Who answers a refresh: `members` (K,) bool label and cooperate (None: `host.training`; the others keep their
    pseudo-labels and have zero rows); of them, `lost` (K,) bool lose their histograms on the way (federation.drop_rate;
    None: none); `flipped`: the attackers whose pseudo-labels are flipped (federation.attack label_flip)."""

    members: Tensor | None = None
    lost: Tensor | None = None
    flipped: tuple[int, ...] = ()


def refresh_pseudo_labels(
    host: Host, zero_shot: bool, refresh_idx: int, labeller: Labeller, n_total: int, train_labels: np.ndarray | None,
    answering: Answering = Answering(), privacy: Privacy | None = None,
) -> Refresh:
    """Label every local client's train set with zero-shot CLIP (the first refresh) or with the client's
    current model (the method's logits with its prompts), then let `labeller` select. Every rank calls this.

    Sets `client.pseudo_labels` of the local clients and lets the method build what it keeps per client.
    The rank's train split has no labels: `train_labels` (the true label of every train row, None when the
    data has none) is read only here, and only to count `label_hits` for monitoring. `n_total`: the size of
    the whole train set (the cooperative allocation's fallback). `members`: (K,) bool, the clients that label
    and cooperate (default: `host.training`); the others keep their pseudo-labels and have zero rows.

    With `privacy`, what the federation computes from other clients' histograms comes from their release only: each
    client's quotas from its own estimate and the noised sum of all, the class weights from the noised sum of the
    selected counts (fedur/privacy/releases.py). The true counts are still gathered for the run's monitoring
    (metrics.jsonl's selection, the pseudo-label accuracy): the experimenter's instrument, not a release.

    A client whose histograms are lost (`answering.lost`): the allocation and the class weights read the others' only,
    and it takes its quotas from its own estimate against the others' sum with its own added (what it can know). An
    attacker in `answering.flipped` flips its pseudo-labels after its selection: it trains on, and reports counts of,
    the flipped labels.
    """
    num_classes = host.model.num_classes
    members = host.training if answering.members is None else answering.members
    lost, flipped = answering.lost, answering.flipped
    answered = members if lost is None else members & ~lost  # whose histograms arrived
    hosted = [c for c in host.clients if members[c.client_id]]
    predictions = host.predict("train", zero_shot, desc="pseudo-labelling clients", clients=hosted)
    probs = {k: logits.softmax(dim=-1) for k, (logits, _) in predictions.items()}
    quotas = released = None
    if labeller.cooperative and privacy is not None:
        all_estimated, quotas, released = private_quotas(host, labeller, privacy, probs, hosted, members, n_total, refresh_idx)
    elif labeller.cooperative:
        estimated = {k: labeller.estimate(p) for k, p in probs.items()}
        like = torch.zeros(num_classes, dtype=torch.long, device="cpu")
        all_estimated = host.gather(estimated, like, what="pseudo-label histograms")  # the clients' only upload
        quotas = torch.zeros_like(all_estimated)  # the members' allocation among themselves; zeros for the others
        if bool(answered.any()):
            quotas[answered] = labeller.allocate(all_estimated[answered], n_total, refresh_idx)
        for k in torch.nonzero(members & ~answered).flatten().tolist():  # its histogram lost: its own against the rest
            own = all_estimated[k:k + 1]
            quotas[k] = labeller.allocate(own, n_total, refresh_idx, totals=all_estimated[answered].sum(dim=0) + own[0],
                                          num_clients=int(answered.sum()) + 1)[0]
    local = {}
    for client in hosted:
        previous = client.pseudo_labels
        client.pseudo_labels = chosen = labeller.select(
            probs[client.client_id], None if quotas is None else quotas[client.client_id], refresh_idx, previous=previous
        )
        if client.client_id in flipped:  # an attacker's data poisoning
            labels, mask = flipped_labels(chosen.labels, chosen.mask, num_classes)
            client.pseudo_labels = chosen = replace(chosen, labels=labels, mask=mask)
        host.method.after_refresh(client, host.client_data)
        check_tensors(client.extra, f"{type(host.method).__name__}.after_refresh's client.extra")
        counts = torch.bincount(chosen.labels, minlength=num_classes)
        local[client.client_id] = torch.cat([counts, label_hits(chosen, client.train_indices, train_labels),
                                             agreement(previous, chosen)])
    gathered = host.gather(local, torch.zeros(num_classes + 4, dtype=torch.long, device="cpu"), what="selected counts")
    selected, hits, agreed = gathered[:, :num_classes], gathered[:, num_classes:num_classes + 2], gathered[:, num_classes + 2:]
    if quotas is None:
        all_estimated = quotas = selected
    if privacy is None or not privacy.releases_selected:  # (a labeller without class weights reads no counts)
        if lost is None:
            weights = labeller.class_weights(quotas, selected)
        else:  # the histograms that arrived (all lost: every member's own, as if none were)
            heard = answered if bool(answered.any()) else members
            weights = labeller.class_weights(quotas[heard], selected[heard])
    else:  # from the noised sum of the selected counts alone
        sent = {c.client_id: privacy.histogram(torch.bincount(c.pseudo_labels.labels, minlength=num_classes), c.client_id,
                                               refresh_idx, streams.NOISE_SELECTED) for c in hosted}
        like = torch.zeros(num_classes, dtype=torch.float64, device="cpu")
        rows = host.gather(sent, like, what="selected histograms")
        total = privacy.totals(rows, members, refresh_idx, streams.NOISE_SELECTED)
        weights = labeller.class_weights(total[None], total[None])
        if not labeller.cooperative:  # the selected counts are all a client's pseudo-labels release
            released = (rows if privacy.local else torch.zeros_like(rows), total)
    return Refresh(all_estimated, quotas, selected, None if train_labels is None else hits,
                   weights, None if zero_shot else agreed, *(released or (None, None)), lost=lost)


def private_quotas(host: Host, labeller: Labeller, privacy: Privacy, probs: dict[int, Tensor], hosted: list,
                   members: Tensor, n_total: int, refresh_idx: int) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
    """The cooperative allocation with privacy on: every client's estimate leaves its rank clipped (and noised,
    local), the noised sum over the members is released, and each client's quotas are its own estimate's share of
    it (Labeller.allocate with `totals`). Returns the gathered estimates as counts (K, C), every client's quotas, and
    what was released: each client's row to the others (local: noised; central: none, zeros) and the sum (C,)."""
    num_classes = host.model.num_classes
    estimated = {k: labeller.estimate(p) for k, p in probs.items()}
    released = {k: privacy.histogram(e, k, refresh_idx, streams.NOISE_ESTIMATES) for k, e in estimated.items()}
    gathered = host.gather(released, torch.zeros(num_classes, dtype=torch.float64, device="cpu"), what="pseudo-label histograms")
    totals = privacy.totals(gathered, members, refresh_idx, streams.NOISE_ESTIMATES)
    own = {c.client_id: labeller.allocate(estimated[c.client_id][None], n_total, refresh_idx, totals=totals,
                                          num_clients=int(members.sum()))[0] for c in hosted}
    quotas = host.gather(own, torch.zeros(num_classes, dtype=torch.long, device="cpu"), what="quotas")
    rows = gathered if privacy.local else torch.zeros_like(gathered)
    return released_counts(gathered), quotas, (rows, totals)


def label_hits(chosen: PseudoLabels, train_indices: np.ndarray, train_labels: np.ndarray | None) -> Tensor:
    """(2,) [selected samples whose pseudo-label is the true label, selected samples]; zeros without labels."""
    if train_labels is None:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    truth = torch.from_numpy(train_labels[train_indices[chosen.indices.numpy()]])
    return torch.tensor([int((chosen.labels == truth).sum()), len(chosen.labels)], device="cpu")


def agreement(previous: PseudoLabels | None, chosen: PseudoLabels) -> Tensor:
    """(2,) [samples selected at both refreshes with the same pseudo-label, samples selected at both]."""
    if previous is None:
        return torch.zeros(2, dtype=torch.long, device="cpu")
    before = dict(zip(previous.indices.tolist(), previous.labels.tolist()))
    both = [(before[i], label) for i, label in zip(chosen.indices.tolist(), chosen.labels.tolist()) if i in before]
    return torch.tensor([sum(a == b for a, b in both), len(both)], device="cpu")
