"""What an attacker sends (fedur/federated/attacks.py), on hand-written updates."""

import torch

from fedur.federated.attacks import flipped_labels, poisoned_update


def test_each_model_attack_on_a_hand_written_update():
    update = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    assert torch.equal(poisoned_update(update, "sign_flip", 1.0), -update)
    assert torch.equal(poisoned_update(update, "sign_flip", 4.0), -4 * update)
    assert torch.equal(poisoned_update(update, "scale", 10.0), 10 * update)
    assert torch.equal(poisoned_update(update, "constant", 0.5), torch.full((2, 2), 0.5))


def test_gaussian_garbage_has_the_asked_spread_and_comes_from_the_given_stream():
    like = torch.zeros(200_000)
    draw = lambda seed: poisoned_update(like, "gaussian", 3.0, torch.Generator().manual_seed(seed))  # noqa: E731
    garbage = draw(7)
    assert abs(float(garbage.std()) - 3.0) < 0.03 and abs(float(garbage.mean())) < 0.03
    assert torch.equal(garbage, draw(7)) and not torch.equal(garbage, draw(8))
    assert garbage.dtype == like.dtype


def test_label_flipping_mirrors_the_labels_and_the_class_mask():
    labels = torch.tensor([0, 1, 4])
    mask = torch.tensor([[1, 0, 0, 0, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.bool)
    flipped, mirrored = flipped_labels(labels, mask, 5)
    assert flipped.tolist() == [4, 3, 0]
    assert mirrored.tolist() == [[True, False, False, False, True], [False, False, True, True, False],
                                 [True, False, False, False, False]]
    assert all(bool(mirrored[i, flipped[i]]) == bool(mask[i, labels[i]]) for i in range(3))  # a candidate stays one
