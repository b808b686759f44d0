"""The pseudo-label refresh: every client labels its data with its current model and the labeller selects
its training samples (for the cooperative labellers, from the combined histograms of all clients: FedUR
sec. 3.3-3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from fedur.federated import streams
from fedur.federated.client import check_tensors
from fedur.labels.base import Labeller, PseudoLabels, weighs_classes

if TYPE_CHECKING:
    from fedur.channel import Channel
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
    lost: Tensor | None = None  # (K,) bool: whose histograms were lost on the way (clock.drop_rate; None: none)


@dataclass(frozen=True)
class Histograms:
    """What the federation learns of one kind of histogram at a refresh (every rank the same; rows are client ids)."""

    rows: Tensor  # (K, C) what each member sent as it arrived (privacy: clipped, local noised; float64), zeros otherwise
    total: Tensor  # (C,) int64 the released sum over the members whose histograms arrived (privacy: noised)
    answered: Tensor  # (K,) bool: the members whose histograms arrived
    record: tuple[Tensor, Tensor] | None  # privacy on: (what each row showed the others, the released sum); else None

    def seen_by(self, own: Tensor, client_id: int) -> tuple[Tensor, int]:
        """(the sum, the number of clients) client `client_id` reads the federation's histograms as: the released
        ones, with its own row `own` added where its histogram was lost on the way (it knows its own)."""
        lost = int(not bool(self.answered[client_id]))
        return self.total + own * lost, int(self.answered.sum()) + lost


def exchange_histograms(host: Host, channel: Channel, counts: dict[int, Tensor], over: Tensor, refresh_idx: int, what: int,
                        name: str) -> Histograms:
    """The (C,) int64 histograms `counts` (of the clients this rank hosts) through the channel: each leaves its rank
    (privacy: clipped, local noised), every rank gathers them in client-id order, and the federation learns the sum
    over `over` ((K,) bool: the members whose histograms arrived; central privacy: noised). `what`:
    streams.NOISE_ESTIMATES or NOISE_SELECTED. Every rank calls this."""
    noise = channel.noise
    sent = {k: noise.histogram(c, k, refresh_idx, what) for k, c in counts.items()}
    rows = host.gather(sent, noise.histogram_like(host.model.num_classes), what=name)
    total = noise.histogram_total(rows, over, refresh_idx, what)
    return Histograms(rows, total, over, noise.record(rows, total))


@dataclass(frozen=True)
class Ask:
    """Which refresh is asked, of whom."""

    round_idx: int  # the round it begins (from 0): whose histograms are lost on the way is drawn for it
    refresh_idx: int  # the refresh's index (from 0)
    zero_shot: bool  # label with zero-shot CLIP (the first refresh; a new client: evaluation.new_client_labels)
    n_total: int  # the train images the cooperative allocation's fallback divides (the whole train set)
    members: Tensor | None = None  # (K,) bool the clients that label and cooperate (None: host.training); the others
    # keep their pseudo-labels and have zero rows, unless `others` gives their last ones
    others: Refresh | None = None  # the last refresh, whose rows of the training clients that are not members stand for
    # theirs: their last histograms join the members' fresh ones (a client of an asynchronous server refreshes alone
    # as it starts, docs/asynchronous.md); None: the non-members take no part


def refresh_pseudo_labels(host: Host, labeller: Labeller, channel: Channel, ask: Ask, train_labels: np.ndarray | None) -> Refresh:
    """Label every local client's train set with zero-shot CLIP (`ask.zero_shot`: the first refresh) or with the
    client's current model (the method's logits with its prompts), then let `labeller` select. Every rank calls this.

    Sets `client.pseudo_labels` of the local clients and lets the method build what it keeps per client. What a
    client learns of the others is what the channel releases of their histograms (fedur/channel/): each cooperative
    client's quotas come from its own estimate and the released sum of the estimates (a client whose histogram was
    lost on the way adds its own), the class weights from the released sum of the selected counts. An attacker's
    pseudo-labels are flipped after its selection (the channel's adversary): it trains on, and reports counts of,
    the flipped labels.

    The true selected counts are gathered for the run's monitoring (metrics.jsonl's selection, the pseudo-label
    accuracy): the experimenter's instrument, not a release. The rank's train split has no labels: `train_labels`
    (the true label of every train row, None when the data has none) is read only here, and only to count
    `label_hits`.
    """
    num_classes, n_total, refresh_idx = host.model.num_classes, ask.n_total, ask.refresh_idx
    members = host.training if ask.members is None else ask.members
    stale = Stale.of(ask.others, host.training & ~members)  # the others' last histograms (None: they take no part)
    answered, lost = channel.histograms_arrive(ask.round_idx, members)  # whose histograms arrive, whose are lost
    hosted = [c for c in host.clients if members[c.client_id]]
    predictions = host.predict("train", ask.zero_shot, desc="pseudo-labelling clients", clients=hosted)
    probs = {k: logits.softmax(dim=-1) for k, (logits, _) in predictions.items()}
    estimates = quotas = None
    if labeller.cooperative:
        estimated = {k: labeller.estimate(p) for k, p in probs.items()}
        estimates = exchange_histograms(host, channel, estimated, answered, refresh_idx, streams.NOISE_ESTIMATES,
                                        "pseudo-label histograms")
        own = {}
        for k, estimate in estimated.items():  # each client's quotas from its own estimate and what it learned
            totals, clients = stale.estimates(*estimates.seen_by(estimate, k))
            own[k] = labeller.allocate(estimate[None], n_total, refresh_idx, totals=totals, num_clients=clients)[0]
        quotas = host.gather(own, torch.zeros(num_classes, dtype=torch.long, device="cpu"), what="quotas")
    local = {}
    for client in hosted:
        previous = client.pseudo_labels
        chosen = labeller.select(probs[client.client_id], None if quotas is None else quotas[client.client_id], refresh_idx,
                                 previous=previous)
        client.pseudo_labels = chosen = channel.adversary.labels(client.client_id, chosen, num_classes)
        host.method.after_refresh(client, host.client_data)
        check_tensors(client.extra, f"{type(host.method).__name__}.after_refresh's client.extra")
        counts = torch.bincount(chosen.labels, minlength=num_classes)
        local[client.client_id] = torch.cat([counts, label_hits(chosen, client.train_indices, train_labels),
                                             agreement(previous, chosen)])
    gathered = host.gather(local, torch.zeros(num_classes + 4, dtype=torch.long, device="cpu"), what="selected counts")
    selected, hits, agreed = gathered[:, :num_classes], gathered[:, num_classes:num_classes + 2], gathered[:, num_classes + 2:]
    quotas = selected if quotas is None else quotas
    estimated = channel.noise.counted(estimates.rows) if estimates is not None else selected
    estimated, quotas, selected, hits, agreed = stale.rows(estimated, quotas, selected, hits, agreed)
    weights, released = None, None if estimates is None else estimates.record
    if weighs_classes(labeller):  # the class weights read the released sum of the selected counts
        counts = {c.client_id: torch.bincount(c.pseudo_labels.labels, minlength=num_classes) for c in hosted}
        heard = answered if bool(answered.any()) else members  # (all lost: every member's, as if none were)
        chosen = exchange_histograms(host, channel, counts, heard, refresh_idx, streams.NOISE_SELECTED, "selected histograms")
        total, heard = stale.selected(chosen.total, heard)
        weights = labeller.class_weights(quotas[heard], total[None])
        released = released or chosen.record
    return Refresh(estimated, quotas, selected, None if train_labels is None else hits, weights,
                   None if ask.zero_shot else agreed, *(released or (None, None)), lost=lost)


@dataclass(frozen=True)
class Stale:
    """The last histograms of the training clients that do not refresh now (`Ask.others`), standing for theirs."""

    last: Refresh | None  # None: the non-members take no part
    clients: Tensor  # (K,) bool whose rows these are

    @classmethod
    def of(cls, last: Refresh | None, others: Tensor) -> Stale:
        return cls(last, others if last is not None else torch.zeros_like(others))

    def estimates(self, total: Tensor, count: int) -> tuple[Tensor, int]:
        """The (C,) sum of the estimates a member reads, over `count` clients, with the others' last ones added."""
        if self.last is None:
            return total, count
        return total + self.last.estimated[self.clients].sum(dim=0).to(total.dtype), count + int(self.clients.sum())

    def selected(self, total: Tensor, heard: Tensor) -> tuple[Tensor, Tensor]:
        """The (C,) sum of the selected counts over the (K,) `heard` members, with the others' last ones added, and
        whose they are."""
        if self.last is None:
            return total, heard
        return total + self.last.selected[self.clients].sum(dim=0).to(total.dtype), heard | self.clients

    def rows(self, *fresh: Tensor | None) -> list[Tensor | None]:
        """(estimated, quotas, selected, label hits, agreement) with the others' rows their last ones."""
        if self.last is None:
            return list(fresh)
        last = (self.last.estimated, self.last.quotas, self.last.selected, self.last.label_hits, self.last.agreement)
        return [rows if rows is None or old is None else torch.where(self.clients[:, None], old.to(rows.dtype), rows)
                for rows, old in zip(fresh, last)]  # (K, C) or (K, 2) each


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
