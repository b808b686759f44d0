"""The refresh's monitoring counts on hand-written pseudo-labels: agreement between two refreshes (no labels
needed) and pseudo-label hits (the only place the true train labels are read)."""

import numpy as np
import torch

from fedur.labels.base import PseudoLabels
from fedur.train.refresh import agreement, label_hits


def pseudo(indices: list[int], labels: list[int], classes: int = 6) -> PseudoLabels:
    return PseudoLabels(torch.tensor(indices), torch.tensor(labels), torch.zeros(len(indices), classes, dtype=torch.bool))


def test_agreement_counts_the_images_selected_both_times_and_those_that_kept_their_label():
    before = pseudo([0, 1, 2, 3], [1, 1, 2, 0])
    now = pseudo([1, 2, 3, 5], [1, 0, 0, 4])  # 1 kept, 2 changed, 3 kept, 5 is new, 0 dropped
    assert agreement(before, now).tolist() == [2, 3]
    assert agreement(None, now).tolist() == [0, 0]  # the first refresh has nothing to agree with
    assert agreement(pseudo([4], [0]), now).tolist() == [0, 0]  # no image selected both times


def test_label_hits_read_the_true_label_of_each_selected_image_through_the_clients_rows():
    train_labels = np.array([9, 9, 3, 4, 5, 1, 2])  # every train row of the run
    client_rows = np.array([6, 2, 5, 3])  # the client's train images are rows 6, 2, 5, 3 (true labels 2, 3, 1, 4)
    chosen = pseudo([0, 1, 3], [2, 1, 4])  # positions 0, 1, 3 of the client: right, wrong, right
    assert label_hits(chosen, client_rows, train_labels).tolist() == [2, 3]
    assert label_hits(chosen, client_rows, None).tolist() == [0, 0]  # no labels: nothing counted
