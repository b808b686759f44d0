"""The evaluation protocols' pieces on hand-written values: the numbers a round reports beside the personal
mean, how many clients evaluation.new_clients holds out, what each method says its server's model is
(Method.global_model), which images base-to-novel and leave-one-domain-out hold out, and the model over
other classes they are tested with. Whole runs: tests/test_methods.py (2 ranks equal 1), tests/test_resume.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedur.config import new_client_count
from fedur.data.held_out import HeldOutError, base_classes, hold_out
from fedur.methods import GDAU, FedOTP, FedPGP, FedTPG, FedUR, GlobalView, PFedPrompt, PromptFL, PromptFolio
from fedur.metrics import harmonic_mean, pooled
from fedur.train.round_metrics import RoundOutcome, round_record


def test_the_dual_accuracy_is_the_harmonic_mean_and_the_weighted_one_pools_test_images():
    assert harmonic_mean(60.0, 90.0) == pytest.approx(72.0)  # 2 * 60 * 90 / 150
    assert harmonic_mean(0.0, 0.0) == 0.0 and harmonic_mean(None, 50.0) is None
    counts = torch.tensor([[9, 10], [10, 100]])  # 90% of 10 images, 10% of 100
    assert pooled(counts) == pytest.approx(100 * 19 / 110)
    assert pooled(torch.zeros(2, 2, dtype=torch.long)) is None


@pytest.mark.parametrize("given, num_clients, held_out", [(0, 10, 0), (2, 10, 2), (0.2, 10, 2), (0.25, 10, 3),
                                                         (0.01, 10, 1), (3.0, 4, 3)])
def test_new_clients_are_a_count_or_a_fraction(given, num_clients, held_out):
    assert new_client_count(given, num_clients) == held_out


@pytest.mark.parametrize("given, num_clients, message", [(1.5, 10, "whole number"), (4, 4, "at least one client"),
                                                        (0.99, 4, "at least one client")])
def test_new_clients_that_leave_none_to_train_are_refused(given, num_clients, message):
    with pytest.raises(ValueError, match=message):
        new_client_count(given, num_clients)


def outcome(accuracy, training, global_counts=None):
    k = len(accuracy)
    zeros = torch.zeros(k)
    return RoundOutcome(round_idx=0, rounds=5, refreshed=False, refresh=None, joined=training.clone(), weights=torch.ones(k),
                        accuracy=torch.tensor(accuracy), losses=torch.zeros(k, 4), uploads=zeros, seconds=1.0,
                        phase_seconds={}, training=training, global_counts=global_counts)


def test_a_round_reports_the_personal_mean_over_the_training_clients_and_the_new_ones_apart():
    accuracy = [[8, 10], [30, 60], [5, 10], [1, 10]]  # 80%, 50%, 50%, 10%
    row = round_record(outcome(accuracy, torch.tensor([True, True, True, False]), torch.tensor([45, 60])))
    assert row["mean_accuracy"] == pytest.approx(60.0)  # (80 + 50 + 50) / 3: client 3 is new
    assert row["weighted_accuracy"] == pytest.approx(100 * 43 / 80)
    assert row["global_accuracy"] == pytest.approx(75.0)
    assert row["dual_accuracy"] == pytest.approx(2 * 60 * 75 / 135)
    assert row["new_clients"] == [3] and row["new_client_accuracy"] == pytest.approx(10.0)
    assert row["client_accuracy"][3] == pytest.approx(10.0)  # still indexed by client id

    every = round_record(outcome(accuracy, torch.ones(4, dtype=torch.bool)))
    assert every["mean_accuracy"] == pytest.approx(47.5) and every["new_clients"] == [] and every["new_client_accuracy"] is None
    assert every["global_accuracy"] is None and every["dual_accuracy"] is None  # evaluation.global_model false


def view(shared, start, state=None, means=None):
    asked = []

    def client_mean(name):
        asked.append(name)
        return means[name]
    return GlobalView(shared, state or {}, start, client_mean), asked


MODEL = SimpleNamespace(zero_shot_text=torch.full((3, 2), 0.5))


def test_fedurs_server_model_is_its_visual_prompt_with_the_template_or_with_the_clients_mean_context():
    visual, ctx0, mean_ctx = torch.ones(1, 2, 3), torch.zeros(2, 4), torch.full((2, 4), 7.0)
    v, asked = view({"visual": visual}, {"visual": torch.zeros(1, 2, 3), "text_ctx": ctx0}, means={"text_ctx": mean_ctx})
    template = FedUR().global_model(MODEL, v)
    assert torch.equal(template.pieces["visual"], visual)
    assert template.text is MODEL.zero_shot_text and asked == []  # no exchange needed
    mean = FedUR(global_text="mean").global_model(MODEL, v)
    assert torch.equal(mean.pieces["text_ctx"], mean_ctx) and mean.text is None and asked == ["text_ctx"]

    shared_text = torch.full((2, 4), 3.0)
    both, asked = view({"visual": visual, "text_ctx": shared_text}, {"visual": visual, "text_ctx": ctx0})
    assert torch.equal(FedUR(share="both").global_model(MODEL, both).pieces["text_ctx"], shared_text) and asked == []


def test_the_default_server_model_is_what_a_client_joining_now_holds():
    shared, start = {"text_ctx": torch.ones(2, 4)}, {"text_ctx": torch.zeros(2, 4), "other": torch.full((3,), 2.0)}
    model = PromptFL().global_model(MODEL, view(shared, start)[0])
    assert torch.equal(model.pieces["text_ctx"], shared["text_ctx"]) and torch.equal(model.pieces["other"], start["other"])
    assert model.extra == {} and model.text is None
    for method in (FedTPG(), PFedPrompt()):  # a generator shared whole; a prompt without a client's cache
        assert method.global_model(MODEL, view(shared, start)[0]).extra == {}


def test_a_global_and_a_local_prompt_give_the_global_prompt_alone():
    g = torch.ones(2, 4)
    start = {"text_ctx": torch.zeros(2, 4), "text_local": torch.full((2, 4), 5.0)}
    for method in (FedOTP(), PromptFolio()):
        pieces = method.global_model(MODEL, view({"text_ctx": g}, start)[0]).pieces
        assert torch.equal(pieces["text_ctx"], g) and torch.equal(pieces["text_local"], g), type(method).__name__
    fedpgp_start = {"text_ctx": torch.zeros(2, 4), "lowrank_u": torch.ones(2, 1), "lowrank_v": torch.ones(1, 4)}
    pieces = FedPGP(rank=1).global_model(MODEL, view({"text_ctx": g}, fedpgp_start)[0]).pieces
    assert torch.equal(pieces["text_ctx"] + pieces["lowrank_u"] @ pieces["lowrank_v"], g)  # sigma + 0


def test_gdau_s_server_model_is_the_classifier_it_fitted():
    W, b = torch.ones(3, 2), torch.zeros(3)
    assert GDAU().global_model(MODEL, view({}, {}, {"W": W, "b": b})[0]).extra == {"gda_W": W, "gda_b": b}
    assert GDAU().global_model(MODEL, view({}, {}, {})[0]).extra == {}  # before the first round: zero-shot CLIP


def domains_dataset():
    """6 classes in 3 domains: train image i has class i % 6 and domain i // 12 (36 images), test the same over 18."""
    from fedur.data.images import ImageDataset, ImageSplit

    def split(n):
        index = np.arange(n)
        return ImageSplit(index % 6, arrays=np.zeros((n, 2, 2, 3), np.uint8) + index[:, None, None, None].astype(np.uint8),
                          domains=index // (n // 3))
    names = ["a", "b", "c", "d", "e", "f"]
    return ImageDataset("toy", names, "a {}.", split(36), split(18), domain_names=["photo", "sketch", "mosaic"])


def test_base_to_novel_trains_on_the_first_half_of_the_classes_and_holds_the_novel_test_images_out():
    data = domains_dataset()
    protocol = hold_out(data, base_to_novel=True)
    clients = protocol.dataset
    assert clients.classnames == ["a", "b", "c"] and base_classes(6) == 3 and base_classes(5) == 3
    assert set(clients.train.labels.tolist()) == {0, 1, 2} and len(clients.train) == 18  # novel train images gone
    assert len(clients.test) == 18  # the test split keeps its rows (the image cache's)
    assert np.array_equal(protocol.client_test_rows, np.flatnonzero(data.test.labels < 3))
    (novel,) = protocol.held_out
    assert novel.name == "novel" and novel.classnames == ["d", "e", "f"]
    assert np.array_equal(novel.rows, np.flatnonzero(data.test.labels >= 3))
    assert np.array_equal(novel.labels(clients.test.labels), data.test.labels[novel.rows] - 3)  # 0..2 among d, e, f


def test_leave_one_domain_out_removes_its_train_images_and_tests_its_test_images_with_the_server_model():
    data = domains_dataset()
    protocol = hold_out(data, held_out_domain="sketch")
    clients = protocol.dataset
    assert clients.domain_names == ["photo", "mosaic"] and clients.classnames == data.classnames
    assert len(clients.train) == 24 and set(clients.train.domains.tolist()) == {0, 1}  # mosaic renumbered 2 -> 1
    assert np.array_equal(clients.train.arrays[:, 0, 0, 0], np.r_[0:12, 24:36])  # the same images, sketch's gone
    (domain,) = protocol.held_out
    assert domain.name == "domain:sketch" and np.array_equal(domain.rows, np.arange(6, 12))
    assert np.array_equal(protocol.client_test_rows, np.r_[0:6, 12:18])
    assert set(clients.test.domains[domain.rows].tolist()) == {-1}  # no client's domain

    both = hold_out(data, base_to_novel=True, held_out_domain="sketch")
    novel, domain = both.held_out
    assert set(both.dataset.test.labels[domain.rows].tolist()) <= {0, 1, 2} and domain.classnames == ["a", "b", "c"]
    assert not set(novel.rows.tolist()) & set(range(6, 12))  # the novel images of the source domains only


@pytest.mark.parametrize("kwargs, message", [({"held_out_domain": "clipart"}, "not one of toy's domains"),
                                             ({"held_out_domain": "photo"}, None)])
def test_a_domain_that_is_not_there_is_refused_by_name(kwargs, message):
    if message is None:
        assert hold_out(domains_dataset(), **kwargs).held_out[0].name == "domain:photo"
        return
    with pytest.raises(HeldOutError, match=message):
        hold_out(domains_dataset(), **kwargs)
    plain = domains_dataset()
    plain.domain_names, plain.train.domains = None, None
    with pytest.raises(HeldOutError, match="has no domains"):
        hold_out(plain, held_out_domain="photo")


def test_a_model_for_other_classes_is_the_same_model_over_their_names():
    from fedur.model.classifier import PromptedCLIP
    from fedur.model.clip import load_clip, zero_shot_weights

    torch.manual_seed(0)
    clip = load_clip("fedur-tiny", None)
    names = ["circle", "square", "triangle", "star"]
    model = PromptedCLIP(clip, names, 4, 2, None, 0.02, 1)
    model.zero_shot_text = zero_shot_weights(clip, names, "a photo of a {}.", torch.device("cpu"))
    same = model.for_classes(names, "a photo of a {}.")
    ctx = torch.randn(model.text_context_shape)
    assert torch.equal(same.zero_shot_text, model.zero_shot_text) and torch.equal(same.text_features(ctx), model.text_features(ctx))
    novel = model.for_classes(["heart", "moon"], "a photo of a {}.")
    assert novel.num_classes == 2 and model.num_classes == 4  # the original keeps its classes
    assert novel.text_features(ctx).shape == (2, model.feature_dim) and novel.clip is model.clip
    expected = zero_shot_weights(clip, ["heart", "moon"], "a photo of a {}.", torch.device("cpu"))
    assert torch.allclose(novel.zero_shot_text, expected, atol=1e-6)
    assert torch.allclose(novel.name_features(torch.device("cpu")), model.for_classes(["heart", "moon"], "{}").name_features(
        torch.device("cpu")), atol=1e-6)
