import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedur.methods.cache import build_cache, cache_logits, shots_per_class
from fedur.methods.proximal import proximal_term


def test_cache_logits_by_hand():
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    keys = torch.tensor([[1.0, 0.0], [0.6, 0.8]])  # key 0 votes for class 1, key 1 for class 0
    values = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    # affinities [[1, .6], [0, .8]] -> weights exp(-5.5 (1 - a)) = [[1, e^-2.2], [e^-5.5, e^-1.1]]
    expected = torch.tensor([[math.exp(-2.2), 1.0], [math.exp(-1.1), math.exp(-5.5)]])
    assert torch.allclose(cache_logits(features, keys, values), expected, rtol=1e-5)
    assert torch.allclose(cache_logits(features, keys, values, alpha=2.0, beta=5.5), 2 * expected, rtol=1e-5)
    # beta 1: [[e^-.4, 1], [e^-.2, e^-1]]
    expected_b1 = torch.tensor([[math.exp(-0.4), 1.0], [math.exp(-0.2), math.exp(-1.0)]])
    assert torch.allclose(cache_logits(features, keys, values, beta=1.0), expected_b1, rtol=1e-5)


def test_build_cache_normalises_keys_and_one_hots_labels():
    keys, values = build_cache(torch.tensor([[3.0, 4.0], [0.0, 2.0]]), torch.tensor([1, 0]), num_classes=3)
    assert torch.allclose(keys, torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
    assert values.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert values.dtype == torch.float32


def test_empty_cache_adds_nothing():
    keys, values = build_cache(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), num_classes=3)
    out = cache_logits(torch.eye(4)[:2], keys, values)
    assert out.shape == (2, 3) and not out.any()


def test_proximal_term_value_and_gradient():
    p1 = torch.tensor([1.0, 2.0], requires_grad=True)
    p2 = torch.tensor([[3.0]], requires_grad=True)
    a1 = torch.tensor([0.0, 0.0], requires_grad=True)
    a2 = torch.tensor([[1.0]])
    term = proximal_term([p1, p2], [a1, a2], mu=0.5)
    # (0.5 / 2) * (1 + 4 + 4) = 2.25 (with mu instead of mu / 2 it would be 4.5)
    assert term.item() == pytest.approx(2.25)
    term.backward()
    assert p1.grad.tolist() == [0.5, 1.0]  # mu * (p - a)
    assert p2.grad.tolist() == [[1.0]]
    assert a1.grad is None  # anchors are constants


def test_proximal_term_is_zero_at_the_anchor_and_for_no_params():
    p = torch.randn(4, 3)
    assert proximal_term([p], [p.clone()], mu=0.5).item() == 0.0
    assert proximal_term([], [], mu=0.5).item() == 0.0
    with pytest.raises(ValueError):
        proximal_term([p], [], mu=0.5)


def test_a_cached_sample_does_not_vote_for_itself():
    keys = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8]]), dim=-1)  # two cached samples
    values = torch.eye(2)
    query = keys[:1]  # the first cached sample itself, as a training batch shows it
    with_self = cache_logits(query, keys, values, alpha=1.0, beta=2.0)
    without = cache_logits(query, keys, values, alpha=1.0, beta=2.0, self_vote=False)
    assert with_self[0, 0].item() == pytest.approx(1.0)  # its own key: exp(0)
    assert without[0, 0].item() == 0.0  # ... gone
    assert without[0, 1].item() == pytest.approx(math.exp(-2.0 * (1 - 0.6)))  # the other sample still votes


def test_shots_per_class_keeps_the_most_confident_of_each_class():
    labels = torch.tensor([0, 0, 0, 1, 2, 2, 0])
    confidence = torch.tensor([0.5, 0.9, 0.7, 0.4, 0.8, 0.8, 0.9])
    # class 0: 0.9 at positions 1 and 6 (tie: the lower first), then 0.7; class 1: its one; class 2: both (tied)
    assert shots_per_class(labels, confidence, 2).tolist() == [1, 3, 4, 5, 6]
    assert shots_per_class(labels, confidence, 1).tolist() == [1, 3, 4]
    assert shots_per_class(labels[:0], confidence[:0], 3).tolist() == []


# pFedPrompt's self-vote exclusion under bf16. On a GPU run (fabric.precision bf16-mixed) a cached sample's key comes
# from `encode_image` in batches of eval_batch_size (256) and the same image's query from the prompted encoder in
# training batches (64), both under bf16 autocast: other kernels, other roundings, so the two unit features of one
# image differ by a few bf16 steps (~2^-8 relative each; the demo CLIP's bf16 features are ~0.004-0.006 from its
# float32 ones), and their affinity falls ~1e-5 to 1e-4 below 1: past SELF_TOLERANCE. The old rule (an affinity
# within SELF_TOLERANCE of 1 is the query's own key) then lets a sample vote for itself; the cache now knows each
# key's sample (`cache_rows`) and leaves the query's own key out by its position.

N_CACHED, DIM = 96, 64


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def bf16_features() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, keys, queries): unit-norm float32 features; keys = the features rounded to bf16 (and
    renormalised, as `build_cache` does); queries = the features through another bf16 computation: independent
    noise of two bf16 steps (2^-7 relative) per coordinate, then rounded to bf16 and renormalised."""
    generator = torch.Generator().manual_seed(0)
    features = F.normalize(torch.randn(N_CACHED, DIM, generator=generator), dim=-1)
    keys = F.normalize(bf16(features), dim=-1)
    noise = 2.0**-7 * features.abs() * torch.randn(N_CACHED, DIM, generator=generator)
    queries = F.normalize(bf16(features + noise), dim=-1)
    return features, keys, queries


def each_keys_vote(queries, keys, **kwargs) -> torch.Tensor:
    """(B, n): the vote of every key separately (one class per key), alpha 1."""
    return cache_logits(queries, keys, torch.eye(len(keys)), alpha=1.0, beta=5.5, **kwargs)


def test_bf16_features_of_one_image_differ_by_more_than_the_tolerance():
    from fedur.methods.cache import SELF_TOLERANCE

    _, keys, queries = bf16_features()
    gap = 1 - (queries * keys).sum(-1)  # 1 - affinity of each query to its own key
    assert float(gap.median()) > 2 * SELF_TOLERANCE
    others = queries @ keys.T - 2 * torch.eye(N_CACHED)
    assert float(others.max()) < 0.9  # no other key is anywhere near: only the own key is in question


def test_the_affinity_rule_lets_bf16_samples_vote_for_themselves_the_position_rule_does_not():
    _, keys, queries = bf16_features()
    every = each_keys_vote(queries, keys)  # self-votes included
    own_vote = torch.diagonal(every)
    assert bool((own_vote > 0.99).all())  # exp(-5.5 * ~1e-5): a full vote for itself

    by_affinity = torch.diagonal(each_keys_vote(queries, keys, self_vote=False))  # the old rule: no `own`
    voted_for_itself = by_affinity > 0
    assert bool(voted_for_itself.all()), f"the old rule caught {int((~voted_for_itself).sum())} own keys"
    assert torch.equal(by_affinity[voted_for_itself], own_vote[voted_for_itself])  # not even damped: a full vote

    rows = torch.arange(N_CACHED)
    own = rows.unsqueeze(1) == rows.unsqueeze(0)  # what PFedPrompt.logits builds from rows and cache_rows
    by_position = each_keys_vote(queries, keys, self_vote=False, own=own)
    assert bool((torch.diagonal(by_position) == 0).all())  # every own key left out ...
    assert torch.equal(by_position[~own], every[~own])  # ... and exactly that one: every other key's vote unchanged

    # with class labels: the cache logits are the other keys' votes, summed per class
    labels = torch.arange(N_CACHED) % 5
    values = F.one_hot(labels, 5).float()
    logits = cache_logits(queries, keys, values, alpha=2.0, beta=5.5, self_vote=False, own=own)
    torch.testing.assert_close(logits, 2.0 * every.masked_fill(own, 0.0) @ values, rtol=1e-6, atol=1e-6)


def test_the_position_rule_leaves_out_a_duplicate_image_the_affinity_rule_drops_too():
    """Two cached samples with the very same feature (a duplicate image): only the query's own key is its own."""
    features, _, _ = bf16_features()
    keys = torch.cat([features, features[:1]])  # sample N_CACHED is a copy of sample 0
    cache_rows = torch.arange(N_CACHED + 1)
    own = torch.tensor([0]).unsqueeze(1) == cache_rows.unsqueeze(0)
    by_affinity = each_keys_vote(features[:1], keys, self_vote=False)[0]
    by_position = each_keys_vote(features[:1], keys, self_vote=False, own=own)[0]
    assert by_affinity[0] == 0 and by_affinity[N_CACHED] == 0  # the affinity rule: both are "itself"
    assert by_position[0] == 0 and by_position[N_CACHED] == pytest.approx(1.0, rel=1e-5)  # the copy still votes


def test_on_exact_float32_features_both_rules_agree():
    features, _, _ = bf16_features()
    rows = torch.arange(N_CACHED)
    own = rows.unsqueeze(1) == rows.unsqueeze(0)
    by_affinity = each_keys_vote(features, features, self_vote=False)
    by_position = each_keys_vote(features, features, self_vote=False, own=own)
    assert torch.equal(by_affinity, by_position)
    assert bool((torch.diagonal(by_position) == 0).all()) and bool((by_position[~own] > 0).all())
    values = F.one_hot(rows % 7, 7).float()
    assert torch.equal(cache_logits(features, features, values, 1.0, 5.5, False),
                       cache_logits(features, features, values, 1.0, 5.5, False, own))


def pfedprompt_client(tiny_clip, key_noise: float):
    """pFedPrompt on the tiny CLIP, and a client whose cache holds 8 of its 12 train images (at positions
    `cache_rows`), their keys the frozen features with bf16-like noise (another bf16 computation, as on a GPU)."""
    from fedur.federated.client import ClientState
    from fedur.methods import PFedPrompt
    from fedur.methods.pieces import initial_values
    from fedur.model.classifier import PromptedCLIP

    method = PFedPrompt()
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 2, 2, None, 0.02, seed=1)
    model.zero_shot_text = model.text_features()
    generator = torch.Generator().manual_seed(5)
    train_images = torch.randn(12, 3, 32, 32, generator=generator)
    cache_rows = torch.tensor([0, 2, 3, 5, 7, 8, 10, 11])
    with torch.no_grad():
        frozen = model.image_features(train_images[cache_rows], prompted=False)
    noise = key_noise * frozen.abs() * torch.randn(frozen.shape, generator=generator)
    keys = F.normalize(bf16(frozen + noise), dim=-1) if key_noise else frozen
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    prompts = initial_values(method.pieces(), model, 1)
    client = ClientState(0, np.arange(12), np.arange(4), prompts,
                         extra={"cache_keys": keys, "cache_labels": labels, "cache_rows": cache_rows})
    return method, model, prompts, client, train_images, cache_rows


def expected_logits(method, model, images, text, keys, labels, cache_rows, rows):
    """CLIP logits plus alpha (s / 100) exp(-beta (1 - f k)) of every key but the query's own, by hand in float64."""
    with torch.no_grad():
        features = model.image_features(images)
        clip = model.logits(features, text).double()
    affinity = features.double() @ keys.double().T
    votes = torch.exp(-method.cache_beta * (1 - affinity))
    if rows is not None:
        votes = votes.masked_fill(rows.unsqueeze(1) == cache_rows.unsqueeze(0), 0.0)
    alpha = method.cache_alpha * float(model.logit_scale) / 100.0
    return clip + alpha * votes @ F.one_hot(labels, clip.shape[-1]).double()


@pytest.mark.parametrize("key_noise", [0.0, 2.0**-7], ids=["float32-keys", "bf16-keys"])
def test_pfedprompt_logits_leave_out_the_querys_own_key_by_its_position(tiny_clip, key_noise):
    method, model, prompts, client, train_images, cache_rows = pfedprompt_client(tiny_clip, key_noise)
    keys, labels = client.extra["cache_keys"], client.extra["cache_labels"]
    rows = torch.tensor([3, 4, 10, 0, 1])  # a training batch: cached samples 3, 10, 0 and two that are not cached
    images = train_images[rows]
    with torch.no_grad():
        text = method.text_side(model, prompts)
        got = method.logits(model, images, prompts, text, client, rows=rows)
        clip_only = model.logits(model.image_features(images), text)
    want = expected_logits(method, model, images, text, keys, labels, cache_rows, rows)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # what the own key would have added: a full vote (weight ~1) for its label, absent from the logits
    alpha = method.cache_alpha * float(model.logit_scale) / 100.0
    with_self = expected_logits(method, model, images, text, keys, labels, cache_rows, None)
    for i, row in enumerate(rows.tolist()):
        if row in cache_rows.tolist():
            j = cache_rows.tolist().index(row)
            gap = (with_self - got.double())[i]
            assert gap[labels[j]] == pytest.approx(alpha * math.exp(-method.cache_beta * (1 - float(
                model.image_features(images[i:i + 1]).double() @ keys[j].double()))), rel=1e-4)
            assert gap[labels[j]] > 0.99 * alpha
        else:  # not cached: nothing left out
            torch.testing.assert_close(got[i].double(), with_self[i], rtol=1e-5, atol=1e-5)
    assert (got - clip_only).abs().max() > 0  # the cache did vote

    # test images (rows None) are none of the cached samples: no key is left out, even on the very same image
    with torch.no_grad():
        test_logits = method.logits(model, images, prompts, text, client, rows=None)
    torch.testing.assert_close(test_logits.double(), with_self, rtol=1e-5, atol=1e-5)
