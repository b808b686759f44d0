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

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from fedur.labels.base import Labeller
from fedur.train import faults
from fedur.train.evaluate import evaluate_clients
from fedur.train.local import train_unit
from fedur.train.rank import Rank
from fedur.train.refresh import refresh_pseudo_labels


def adapt_new_clients(rank: Rank, labeller: Labeller, epochs: int, zero_shot_labels: bool, train_sizes: Tensor,
                      stream_round: int, train_labels: np.ndarray | None) -> Tensor:
    """Adapt every new client alone, in client-id order, and return (K, 2) [correct, total] of each on its own
    test set afterwards (zeros for the training clients). `train_sizes`: (K,) every client's train images (its
    allocation's fallback); `stream_round`: the round index its data order is drawn for (one past the last
    round, a stream no round used). Every rank calls this."""
    tuner = rank.tuner
    saved_optim, saved_weights = tuner.optim, tuner.class_weights
    tuner.optim = replace(tuner.optim, local_epochs=epochs, refresh_every=1)  # one cosine cycle over the adaptation
    try:
        for k in rank.new_clients:
            members = torch.zeros(rank.num_clients, dtype=torch.bool, device="cpu")
            members[k] = True
            refresh = refresh_pseudo_labels(rank, zero_shot_labels, 0, labeller, int(train_sizes[k]), train_labels, members)
            tuner.use_class_weights(refresh.class_weights)  # its own selection's, as a federation of one
            hosted = [c for c in rank.clients if c.client_id == k]
            if hosted and len(hosted[0].pseudo_labels.labels):  # its pieces change in place; nothing is uploaded
                train_unit(rank, hosted, stream_round, [None])
                faults.point("adapt", stream_round, rank.fabric.global_rank)
    finally:
        tuner.optim = saved_optim
        tuner.class_weights = saved_weights
    return evaluate_clients(rank, clients=[c for c in rank.clients if not rank.training[c.client_id]])[0]
