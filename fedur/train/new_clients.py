"""The new-clients protocol (evaluation.new_clients, docs/protocols.md): clients held out of every round, that
a federation's model meets only once it is trained.

During the rounds a new client never pseudo-labels, trains or uploads, and its images count in no
pseudo-label histogram; like every client it takes the shared pieces at each download, so each round's
evaluation tests it as it would arrive (the round loop's own evaluation, at no extra cost). After the last
round each new client adapts alone here: it pseudo-labels its own train images (with the model it arrived
with, or zero-shot CLIP: evaluation.new_client_labels) in a federation of one, trains every piece the method
trains for evaluation.new_client_epochs local epochs (one cosine cycle from optim.lr, fresh momentum), sends
nothing, and is tested again.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedur.channel import Channel
from fedur.labels.base import Labeller
from fedur.train import faults
from fedur.train.evaluate import evaluate_clients
from fedur.train.host import Host
from fedur.train.local import train_unit
from fedur.train.module import Optimization
from fedur.train.refresh import Ask, refresh_pseudo_labels


def adapt_new_clients(host: Host, labeller: Labeller, optim: Optimization, zero_shot_labels: bool, train_sizes: Tensor,
                      stream_round: int, train_labels: np.ndarray | None) -> Tensor:
    """Adapt every new client alone, in client-id order, and return (K, 2) [correct, total] of each on its own
    test set afterwards (zeros for the training clients). `optim`: the adaptation's local optimisation (its epochs,
    one cosine cycle: refresh_every 1); `train_sizes`: (K,) every client's train images (its allocation's fallback);
    `stream_round`: the round index its data order is drawn for (one past the last round, a stream no round used).
    Every rank calls this."""
    for k in host.new_clients:
        members = torch.zeros(host.num_clients, dtype=torch.bool, device="cpu")
        members[k] = True
        ask = Ask(stream_round, 0, zero_shot=zero_shot_labels, n_total=int(train_sizes[k]), members=members)
        refresh = refresh_pseudo_labels(host, labeller, Channel.alone(), ask, train_labels)  # a federation of one
        hosted = [c for c in host.clients if c.client_id == k]
        if hosted and len(hosted[0].pseudo_labels.labels):  # its pieces change in place; nothing is uploaded
            # its own selection's class weights, as a federation of one
            train_unit(host, hosted, stream_round, [None], optim, refresh.class_weights)
            faults.point("adapt", stream_round, host.fabric.global_rank)
    return evaluate_clients(host, clients=[c for c in host.clients if not host.training[c.client_id]])[0]
