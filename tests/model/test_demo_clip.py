"""The shipped demo CLIP: the file is the one its card describes, the card's numbers hold, and the script
that trains it is deterministic and captions the way its card says."""

import hashlib
import json
from collections import Counter

import numpy as np
import pytest
import torch

from fedur.app import demo_clip
from fedur.data.synthetic import CLASSNAMES
from fedur.model.clip import PACKAGE_WEIGHTS, ModelUnavailableError, load_clip

WEIGHTS = PACKAGE_WEIGHTS / "fedur-demo.pt"


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads((PACKAGE_WEIGHTS / "fedur-demo.card.json").read_text())


def test_the_shipped_file_is_the_one_the_card_describes(card):
    assert WEIGHTS.stat().st_size == card["weights_bytes"] <= 4_000_000
    assert hashlib.sha256(WEIGHTS.read_bytes()).hexdigest() == card["weights_sha256"]
    markdown = (PACKAGE_WEIGHTS / "fedur-demo.md").read_text()
    assert markdown == demo_clip.model_card(card), "the markdown card is written from the JSON card"
    assert card["command"] in markdown


def test_the_card_numbers_hold_and_leave_room_to_learn(card):
    measured = demo_clip.evaluate(WEIGHTS)
    for key in ("zero_shot_accuracy", "linear_probe_accuracy", "random_context_accuracy"):
        assert measured[key] == pytest.approx(card["evaluation"][key], abs=0.5), key
    assert 50 <= measured["zero_shot_accuracy"] <= 65
    assert measured["linear_probe_accuracy"] >= measured["zero_shot_accuracy"] + 20
    # the structured error: every absorbed class goes mostly to its dominant class
    confusion = np.array(measured["confusion"])
    for absorbed, (dominant, _) in demo_clip.CONFUSIONS.items():
        row = confusion[CLASSNAMES.index(absorbed)]
        assert row.argmax() == CLASSNAMES.index(dominant), f"{absorbed} is mostly predicted as {dominant}"


def test_fedur_loads_it_by_tag():
    clip = load_clip("fedur-demo", "fedur")
    assert clip.image_size == 32 and not any(p.requires_grad for p in clip.model.parameters())
    with pytest.raises(ModelUnavailableError, match="ships none for fedur-tiny"):
        load_clip("fedur-tiny", "fedur")


def test_captions_follow_the_confusion_scheme():
    labels = np.repeat(np.arange(10), 2000)
    texts = demo_clip.captions(labels, np.random.default_rng(0), name_share=1.0)
    last_word = [t.rstrip(".").split()[-1] for t in texts]
    for c, name in enumerate(CLASSNAMES):
        said = Counter(last_word[c * 2000 : (c + 1) * 2000])
        dominant, q = demo_clip.CONFUSIONS.get(name, (name, 0.0))
        assert set(said) <= {name, dominant}
        assert said[dominant] / 2000 == pytest.approx(q if dominant != name else 1.0, abs=0.02)
    described = demo_clip.captions(labels, np.random.default_rng(0), name_share=0.0)
    assert all(demo_clip.DESCRIPTIONS[CLASSNAMES[y]] in t for y, t in zip(labels, described)), "descriptions never lie"


def test_contrastive_loss_on_hand_written_features():
    eye = torch.eye(3)
    ids = torch.tensor([0, 1, 1])  # images 1 and 2 share caption 1
    aligned = demo_clip.contrastive_loss(eye[[0, 1, 1]], eye[:2], ids, torch.tensor(10.0))
    crossed = demo_clip.contrastive_loss(eye[[1, 0, 0]], eye[:2], ids, torch.tensor(10.0))
    assert aligned < crossed
    # Aligned, image -> caption costs ~0; caption -> image costs ~0 for caption 0 and log 2 for caption 1, whose
    # target is spread evenly over its two images: the loss is (0 + (0 + log 2) / 2) / 2.
    assert aligned.item() == pytest.approx(np.log(2) / 4, abs=1e-3)


def test_training_is_deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        states = [
            demo_clip.train(3, demo_clip.Recipe(epochs=1, per_class=6, batch_size=32, lr=1e-3), log=lambda _: None).state_dict()
            for _ in range(2)
        ]
    finally:
        torch.use_deterministic_algorithms(False)
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
