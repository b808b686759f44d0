"""fedur.methods.gda_math: federated GDA-U (mrflogs/ICLR24 main_few_shots.py lines 56-80, fitted by EM)."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from fedur.methods.gda_math import (
    EMPTY_CLASS_BIAS,
    GDAStats,
    class_means,
    e_step,
    ensemble_logits,
    flatten_statistics,
    gda_classifier,
    gda_logits,
    responsibilities,
    shrunk_precision,
    sufficient_statistics,
    sum_statistics,
    unflatten_statistics,
    within_class_scatter,
    zero_statistics,
)

F64 = torch.float64


def _unit_features(seed: int, n: int = 12, d: int = 4) -> torch.Tensor:
    """(n, D) unit-norm float32 features, CLIP-like (a shared direction plus noise)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.ones(d) + 0.7 * torch.randn(n, d, generator=g)
    return F.normalize(x, dim=-1)


def _soft(seed: int, n: int = 12, c: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2.0 * torch.randn(n, c, generator=g), dim=-1)


def _split(features, resp, bounds):
    """Per-client statistics of the row ranges [bounds[k], bounds[k+1]) (empty ranges allowed)."""
    return [sufficient_statistics(features[a:b], resp[a:b]) for a, b in pairwise(bounds)]


def _assert_stats_close(a: GDAStats, b: GDAStats) -> None:
    for x, y in zip(a, b):
        assert_close(x, y)


# --- the reference, transcribed (main_few_shots.py lines 56-64), as the oracle ------------------------


def _reference_gda(vecs: torch.Tensor, labels: torch.Tensor, num_classes: int):
    """W (D, C), b (C,) exactly as main_few_shots.py lines 56-64 (CPU, float64, no .cuda())."""
    mus = torch.cat([vecs[labels == i].mean(dim=0, keepdim=True) for i in range(num_classes)])
    center_vecs = torch.cat([vecs[labels == i] - mus[i].unsqueeze(0) for i in range(num_classes)])
    cov_inv = center_vecs.shape[1] * torch.linalg.pinv(
        (center_vecs.shape[0] - 1) * center_vecs.T.cov()
        + center_vecs.T.cov().trace() * torch.eye(center_vecs.shape[1], dtype=vecs.dtype)
    )
    ps = torch.ones(num_classes, dtype=vecs.dtype) * 1.0 / num_classes
    W = torch.einsum("nd, dc -> cn", mus, cov_inv)
    b = ps.log() - torch.einsum("nd, dc, nc -> n", mus, cov_inv, mus) / 2
    return W, b


# --- sufficient statistics ---------------------------------------------------------------------------


def test_statistics_of_a_split_sum_to_those_of_the_whole():
    f, r = _unit_features(0, n=23, d=5), _soft(1, n=23, c=3)
    whole = sufficient_statistics(f, r)
    clients = _split(f, r, [0, 7, 7, 15, 23])  # client 1 is empty
    _assert_stats_close(sum_statistics(clients), whole)
    assert whole.counts.dtype == F64 and whole.sums.shape == (3, 5) and whole.second_moment.shape == (5, 5)
    assert whole.num_samples.item() == 23.0
    assert_close(whole.counts.sum(), torch.tensor(23.0, dtype=F64))  # softmax rows sum to 1


def test_statistics_are_the_weighted_sums_written_out():
    f, r = _unit_features(2, n=6, d=3), _soft(3, n=6, c=2)
    s = sufficient_statistics(f, r)
    f64, r64 = f.double(), r.double()
    for c in range(2):
        assert_close(s.counts[c], sum(r64[i, c] for i in range(6)))
        assert_close(s.sums[c], sum(r64[i, c] * f64[i] for i in range(6)))
    assert_close(s.second_moment, sum(torch.outer(f64[i], f64[i]) for i in range(6)))


def test_an_empty_client_gives_zeros_and_adds_nothing():
    empty = sufficient_statistics(torch.zeros(0, 4), torch.zeros(0, 3))
    for got, want in zip(empty, zero_statistics(3, 4)):
        assert torch.equal(got, want)
    other = sufficient_statistics(_unit_features(4), _soft(5))
    for got, want in zip(sum_statistics([empty, other, empty]), other):
        assert torch.equal(got, want)


def test_flatten_round_trip_and_row_sums_match_sum_statistics():
    f, r = _unit_features(6, n=15, d=4), _soft(7, n=15, c=3)
    clients = _split(f, r, [0, 4, 9, 15])
    rows = torch.stack([flatten_statistics(s) for s in clients])  # (K, C + C*D + D*D + 1)
    assert rows.shape == (3, 3 + 12 + 16 + 1)
    for got, want in zip(unflatten_statistics(rows[1], 3, 4), clients[1]):
        assert torch.equal(got, want)
    summed = unflatten_statistics(rows[0] + rows[1] + rows[2], 3, 4)
    for got, want in zip(summed, sum_statistics(clients)):
        assert torch.equal(got, want)
    with pytest.raises(ValueError):
        unflatten_statistics(rows[0], 3, 5)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        sufficient_statistics(torch.zeros(5, 4), torch.zeros(6, 3))
    with pytest.raises(ValueError):
        sufficient_statistics(torch.zeros(5), torch.zeros(5, 3))


# --- the classifier ----------------------------------------------------------------------------------


def test_classifier_from_summed_statistics_equals_the_reference_on_the_union():
    vecs = _unit_features(8, n=14, d=4).double()
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 2, 1, 0, 2])
    hard = F.one_hot(labels, 3).double()
    stats = sum_statistics(_split(vecs, hard, [0, 5, 5, 11, 14]))
    W_ref, b_ref = _reference_gda(vecs, labels, 3)  # (D, C), (C,)

    W, b = gda_classifier(stats, precision_scale="reference")
    assert W.shape == (3, 4) and b.shape == (3,)
    assert_close(W, W_ref.T)
    assert_close(b, b_ref)

    # 'likelihood' is the same precision times (N-1)/D; log pi = -log C is not scaled.
    N, D = 14, 4
    W_lik, b_lik = gda_classifier(stats)
    assert_close(W_lik, (N - 1) / D * W_ref.T)
    assert_close(b_lik + math.log(3), (N - 1) / D * (b_ref + math.log(3)))


def test_classifier_equals_a_plain_centralised_computation():
    """Means by masked averages, S_w by explicit centred outer products, the KS inverse written out."""
    x = torch.tensor(
        [[1.0, 0.0, 0.5], [0.8, 0.2, 0.4], [0.9, -0.1, 0.7], [0.0, 1.0, 0.1], [0.2, 0.9, 0.0], [-0.1, 1.1, 0.3], [0.1, 0.8, 0.2]],
        dtype=F64,
    )
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    stats = sum_statistics(_split(x, F.one_hot(y, 2).double(), [0, 2, 5, 7]))

    mus = torch.stack([x[y == c].sum(0) / (y == c).sum() for c in range(2)])
    s_w = torch.zeros(3, 3, dtype=F64)
    for i in range(len(x)):
        s_w += torch.outer(x[i] - mus[y[i]], x[i] - mus[y[i]])
    n, d = len(x), 3
    p_ref = d * torch.linalg.inv(s_w + torch.trace(s_w) / (n - 1) * torch.eye(d, dtype=F64))

    means, present = class_means(stats)
    assert_close(means, mus)
    assert present.all()
    assert_close(within_class_scatter(stats), s_w)
    assert_close(shrunk_precision(stats, "reference"), p_ref)
    W, b = gda_classifier(stats, precision_scale="reference")
    assert_close(W, mus @ p_ref)
    assert_close(b, torch.full((2,), -math.log(2), dtype=F64) - torch.einsum("cd,de,ce->c", mus, p_ref, mus) / 2)


def test_soft_scatter_is_the_responsibility_weighted_scatter():
    f, r = _unit_features(9, n=10, d=3).double(), _soft(10, n=10, c=3).double()
    stats = sufficient_statistics(f, r)
    mus = (r.T @ f) / r.sum(0).unsqueeze(1)
    want = sum(r[i, c] * torch.outer(f[i] - mus[c], f[i] - mus[c]) for i in range(10) for c in range(3))
    assert_close(within_class_scatter(stats), want)


@pytest.mark.parametrize("prior", ["uniform", "estimated"])
def test_likelihood_scale_logits_are_the_gaussian_log_posterior(prior):
    f, r = _unit_features(11, n=30, d=4).double(), _soft(12, n=30, c=3)
    stats = sufficient_statistics(f, r)
    W, b = gda_classifier(stats, prior=prior)
    mus, _ = class_means(stats)
    n = stats.counts.sum()
    sigma = within_class_scatter(stats) / (n - 1)
    sigma_shrunk = sigma + torch.trace(sigma) / (n - 1) * torch.eye(4, dtype=F64)
    pi = stats.counts / n if prior == "estimated" else torch.full((3,), 1 / 3, dtype=F64)
    log_joint = (
        torch.stack([torch.distributions.MultivariateNormal(mus[c], sigma_shrunk).log_prob(f) for c in range(3)], dim=1)
        + pi.log()
    )
    assert_close(torch.log_softmax(gda_logits(f, W, b), dim=1), torch.log_softmax(log_joint, dim=1))
    if prior == "estimated":
        W_u, b_u = gda_classifier(stats)
        assert_close(W, W_u)
        assert_close(b - b_u, (stats.counts / n).log() + math.log(3))


def test_classifier_is_invariant_to_the_order_of_clients():
    f, r = _unit_features(13, n=40, d=6), _soft(14, n=40, c=4)
    clients = _split(f, r, [0, 3, 11, 11, 25, 31, 40])
    W, b = gda_classifier(sum_statistics(clients))
    for seed in range(3):
        order = torch.randperm(len(clients), generator=torch.Generator().manual_seed(seed)).tolist()
        W_p, b_p = gda_classifier(sum_statistics([clients[k] for k in order]))
        assert_close(W_p, W)
        assert_close(b_p, b)
    W_c, b_c = gda_classifier(sufficient_statistics(f, r))  # centralised fit on the union
    assert_close(W_c, W)
    assert_close(b_c, b)


def test_an_empty_class_gives_no_nan_and_is_never_predicted():
    f = _unit_features(15, n=9, d=4)
    y = torch.tensor([0, 1, 0, 1, 3, 3, 0, 1, 3])  # class 2 has no sample
    stats = sum_statistics(_split(f, F.one_hot(y, 4).double(), [0, 4, 9]))
    for prior in ("uniform", "estimated"):
        W, b = gda_classifier(stats, prior=prior)
        assert torch.isfinite(W).all() and torch.isfinite(b).all()
        assert torch.equal(W[2], torch.zeros(4, dtype=F64)) and b[2].item() == EMPTY_CLASS_BIAS
        logits = gda_logits(f, W, b)
        assert torch.isfinite(logits).all() and not (logits.argmax(1) == 2).any()
        r = e_step(f, W, b)
        assert not torch.isnan(r).any() and torch.equal(r[:, 2], torch.zeros(9, dtype=F64))
        assert_close(r.sum(1), torch.ones(9, dtype=F64))
        clip = 10.0 * f @ torch.eye(4)
        assert torch.equal(ensemble_logits(clip, logits, 0.0), clip.double())  # 0 * EMPTY_CLASS_BIAS stays 0
        assert torch.isfinite(ensemble_logits(clip, logits, 1e3).float()).all()

    text = F.normalize(torch.randn(4, 4, generator=torch.Generator().manual_seed(16)), dim=-1)
    for prior in ("uniform", "estimated"):
        W, b = gda_classifier(stats, prior=prior, fallback_means=text)
        assert torch.isfinite(W).all() and torch.isfinite(b).all()
        assert_close(W[2], shrunk_precision(stats) @ text[2].double())
    W_fb, _ = gda_classifier(stats, fallback_means=text)
    W_no, _ = gda_classifier(stats)
    assert_close(W_fb[[0, 1, 3]], W_no[[0, 1, 3]])  # the fallback mean adds nothing to S_w


def test_no_data_at_all_gives_a_finite_classifier():
    W, b = gda_classifier(zero_statistics(3, 5))
    assert torch.equal(W, torch.zeros(3, 5, dtype=F64))
    assert torch.equal(b, torch.full((3,), EMPTY_CLASS_BIAS, dtype=F64))


def test_bad_options_are_refused():
    stats = sufficient_statistics(_unit_features(17), _soft(18))
    with pytest.raises(ValueError):
        gda_classifier(stats, precision_scale="ks")
    with pytest.raises(ValueError):
        gda_classifier(stats, prior="flat")
    with pytest.raises(ValueError):
        gda_classifier(stats, fallback_means=torch.zeros(2, 4))


# --- logits, ensemble, E-step ------------------------------------------------------------------------


def test_logits_ensemble_and_responsibilities():
    f = _unit_features(19, n=5, d=3)
    W = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, 1.0]], dtype=F64)
    b = torch.tensor([0.25, -0.5], dtype=F64)
    g = gda_logits(f, W, b)
    assert g.dtype == F64 and g.shape == (5, 2)
    assert_close(g, f.double() @ W.T + b)
    clip = torch.randn(5, 2, generator=torch.Generator().manual_seed(20))
    assert_close(ensemble_logits(clip, g, 0.3), clip.double() + 0.3 * g)

    r = responsibilities(g, temperature=2.0)
    assert_close(r, torch.softmax(g / 2.0, dim=1))
    assert_close(r.sum(1), torch.ones(5, dtype=F64))
    hard = responsibilities(g, hard=True)
    assert torch.equal(hard, F.one_hot(g.argmax(1), 2).double())
    assert_close(e_step(f, W, b), torch.softmax(g, dim=1))
    assert_close(e_step(f, W, b, clip, source="ensemble", alpha=0.3), torch.softmax(clip.double() + 0.3 * g, dim=1))
    with pytest.raises(ValueError):
        e_step(f, W, b, source="ensemble")
    with pytest.raises(ValueError):
        responsibilities(g, temperature=0.0)
    with pytest.raises(ValueError):
        ensemble_logits(clip[:4], g)
    with pytest.raises(ValueError):
        gda_logits(f[:, :2], W, b)


# --- EM on a toy mixture -----------------------------------------------------------------------------


def _two_gaussians():
    """Two well-separated 2-D Gaussians with a shared tilted covariance and a poor 'zero-shot' classifier
    whose text directions are rotated by 70 degrees and biased (accuracy 0.80; Bayes accuracy 1.0)."""
    g = torch.Generator().manual_seed(0)
    n = 100
    chol = torch.linalg.cholesky(torch.tensor([[0.6, 0.25], [0.25, 0.4]], dtype=F64))
    mu = torch.tensor([[-2.0, 0.0], [2.0, 0.0]], dtype=F64)
    y = torch.arange(2).repeat_interleave(n)
    x = mu[y] + torch.randn(2 * n, 2, generator=g, dtype=F64) @ chol.T
    t = math.radians(70)
    text = torch.tensor([[-math.cos(t), -math.sin(t)], [math.cos(t), math.sin(t)]], dtype=F64)
    zero_shot = 2.0 * x @ text.T + torch.tensor([0.0, 1.0], dtype=F64)
    return x, y, zero_shot


def _accuracy(logits, y):
    return (logits.argmax(1) == y).double().mean().item()


def test_federated_em_from_noisy_zero_shot_improves_accuracy():
    x, y, zero_shot = _two_gaussians()
    bounds = [0, 30, 30, 120, 200]  # three clients holding data, one empty
    acc0 = _accuracy(zero_shot, y)
    assert 0.75 <= acc0 <= 0.85

    r_fed = responsibilities(zero_shot)  # first iteration: the zero-shot softmax
    r_central = r_fed.clone()
    accs = []
    for _ in range(4):  # one round = one EM iteration
        W, b = gda_classifier(sum_statistics(_split(x, r_fed, bounds)))
        r_fed = torch.cat([e_step(x[a:c], W, b) for a, c in pairwise(bounds)])  # each client locally
        W_c, b_c = gda_classifier(sufficient_statistics(x, r_central))
        r_central = e_step(x, W_c, b_c)
        assert_close(r_fed, r_central)  # federated EM is centralised EM on the union
        accs.append(_accuracy(gda_logits(x, W, b), y))
    assert accs == sorted(accs)  # never gets worse on this problem
    assert accs[-1] >= 0.98 and accs[-1] - acc0 >= 0.15


def test_ensemble_e_step_also_improves_and_reference_scale_makes_em_posteriors_flat():
    x, y, zero_shot = _two_gaussians()
    acc0 = _accuracy(zero_shot, y)
    r = responsibilities(zero_shot)
    accs = []
    for _ in range(6):
        W, b = gda_classifier(sufficient_statistics(x, r))
        r = e_step(x, W, b, zero_shot, source="ensemble", alpha=1.0)
        accs.append(_accuracy(gda_logits(x, W, b), y))
    # Anchored to the biased zero-shot logits, it improves more slowly than pure EM (0.985 after 4 rounds).
    assert accs == sorted(accs) and accs[-1] >= 0.93
    assert _accuracy(ensemble_logits(zero_shot, gda_logits(x, W, b), 1.0), y) >= acc0 + 0.05

    # [guess] 1: the reference's KS scale is D/(N-1) = 2/199 of the likelihood scale, so its softmax is
    # nearly uniform for N >> D, while the likelihood-scale posterior is confident.
    stats = sufficient_statistics(x, responsibilities(zero_shot))
    W_ref, b_ref = gda_classifier(stats, precision_scale="reference")
    W_lik, b_lik = gda_classifier(stats)
    assert_close(W_ref, 2 / 199 * W_lik)
    assert e_step(x, W_ref, b_ref).max(1).values.mean() < 0.7
    assert e_step(x, W_lik, b_lik).max(1).values.mean() > 0.85
    assert torch.equal(gda_logits(x, W_ref, b_ref).argmax(1), gda_logits(x, W_lik, b_lik).argmax(1))
