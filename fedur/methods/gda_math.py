"""Federated GDA-U: Gaussian discriminant analysis on frozen CLIP image features, fitted without labels
by EM from zero-shot CLIP, as pure tensor functions (Wang, Liang et al., ICLR 2024, "A Hard-to-Beat
Baseline for Training-free CLIP-based Adaptation", arXiv 2402.04087).

What GDA computes
-----------------
Every class c is a Gaussian N(mu_c, Sigma) over L2-normalised CLIP image features f, with ONE covariance
Sigma shared by all classes. Bayes' rule then gives a linear classifier::

    log p(c | f) = w_c^T f + b_c + const(f),   w_c = P mu_c,   b_c = log pi_c - mu_c^T P mu_c / 2

with P the precision Sigma^-1. Training-free: mu_c, Sigma come straight from the data. The reference
ensembles it with zero-shot CLIP: logits = 100 * f @ clip_weights + alpha * (f @ W + b).

What GDA-U adds: EM for the Gaussian mixture
--------------------------------------------
Without labels the features are a mixture sum_c pi_c N(mu_c, Sigma), fitted by EM from zero-shot
CLIP (the paper's unsupervised variant, cited by FedUR as GDA-U). With responsibilities r_ic
(the E-step posterior; at the first iteration the zero-shot CLIP softmax)::

    M-step:  N_c = sum_i r_ic,   mu_c = sum_i r_ic f_i / N_c,   N = sum_c N_c
             S_w = sum_c sum_i r_ic (f_i - mu_c)(f_i - mu_c)^T = Q - sum_c N_c mu_c mu_c^T,
             Q   = sum_i (sum_c r_ic) f_i f_i^T
             Sigma_hat = S_w / (N - 1)                (the reference's torch.cov, correction 1)
             P   = the reference's shrunk inverse of Sigma_hat, see :func:`shrunk_precision`
    E-step:  r_ic = softmax_c(w_c^T f_i + b_c)         (:func:`e_step`)

With hard one-hot r (labelled data) the M-step is exactly the reference's few-shot estimate.

How it is federated
-------------------
Client k uploads only T_k = (N_c, S_c = sum_i r_ic f_i, Q, n) computed on its own features
(:func:`sufficient_statistics`; float64, fixed shapes (C,), (C, D), (D, D), ()). Every statistic is a
sum over samples, so the server's sum over clients, in client-id order (:func:`sum_statistics`),
equals, up to float64 rounding, the statistics of the union of all clients' data, and the classifier
built from it (:func:`gda_classifier`) is the centralised GDA fit on the union. This is tested. One
federated round = one EM iteration: server sends (W, b); clients run the E-step locally and upload
new statistics. Per client (C + C D + D^2 + 1) float64 values: 2.1 MB for D = 512, C = 10.

Reference followed (github.com/mrflogs/ICLR24, commit 560fe21, ``main_few_shots.py``; the paper's
unsupervised section could not be retrieved, only its opening on the project page zhengbo.wang/ICLR24:
"the unsupervised data follow a Gaussian mixture distribution", so the EM details are marked [guess])
-------------------------------------------------------------------------------------------------------

* line 49: image features L2-normalised (fedur's cached features already are).
* line 56: ``mus`` = per-class mean of the labelled features            -> ``S_c / N_c``
* line 59: ``center_vecs`` = every feature minus its class mean, concatenated (N, D)
* line 60 (KS estimator): ``cov_inv = D * pinv((N-1) * center_vecs.T.cov() + center_vecs.T.cov().trace() * I)``.
  ``torch.cov`` divides by N - 1 and subtracts the mean of ``center_vecs``, which is 0 exactly (every
  class's centred vectors sum to 0), so ``(N-1) * cov = S_w`` and
  ``cov_inv = D * pinv(S_w + tr(S_w) / (N-1) * I)``                       -> :func:`shrunk_precision`
* line 62: ``ps`` = uniform priors 1/C                                   -> ``prior='uniform'``
* line 63: ``W = einsum('nd, dc -> cn', mus, cov_inv)`` is (D, C); here W is (C, D) = mus @ P
* line 64: ``b = ps.log() - einsum('nd, dc, nc -> n', mus, cov_inv, mus) / 2``
* lines 67-80: ``logits = 100. * f @ clip_weights + alpha * (f @ W + b)``, alpha grid-searched on the
  validation set over [1e-4, 1e-3, ..., 100] (initial best 0.1)   -> :func:`ensemble_logits`
* ``main_robustness.py`` lines 61-67 repeat lines 56-64. ``main_base2new.py`` lines 55-57 use instead
  ``pinv(mean_c cov_c)`` for the base classes, and lines 99-107 the KS form (with D hard-coded to 512)
  for new classes synthesised from the top-64 neighbours of each text embedding; neither is used here.

Differences from the reference, and why
---------------------------------------
1. float64 statistics, inverse and logits (the reference runs float32 on CUDA). ``pinv`` is taken with
   ``hermitian=True``; the matrix is symmetric positive definite whenever tr(S_w) > 0, so it equals the
   inverse (condition number <= N), and pinv only matters for S_w = 0, where it gives P = 0.
2. Soft responsibilities replace hard labels (EM), and N in the KS formula is the total weight
   sum_c N_c (= the sample count n when every row of r sums to 1, as softmax rows do). N - 1 is clamped
   at 1 for N < 2, where the reference's torch.cov would return NaN.
3. An empty class (N_c = 0, possible with hard responsibilities) makes the reference's mean NaN; here
   see [guess] 4.

Every [guess], its alternative, and the default
-----------------------------------------------
1. ``precision_scale='likelihood'`` (default): P = (N-1) * pinv(S_w + tr(S_w)/(N-1) I)
   = pinv(Sigma_hat + tr(Sigma_hat)/(N-1) I), the inverse of the reference's ridge-shrunk covariance, so
   that W f + b is the Gaussian log posterior in nats (up to a term constant over classes) and the E-step
   softmax is EM's posterior.
   Alternative ``'reference'``: P = D * pinv(...) exactly as line 60, i.e. (D / (N-1)) times the former.
   The KS factor D is calibrated for N <~ D (few-shot: for Sigma = s^2 I it gives P = D/(N-1+D) s^-2 I);
   for unsupervised data N >> D it shrinks the logits by D/N (about 1/100 for 50,000 images at D = 512),
   so the E-step softmax would be nearly uniform and EM would pull every mean to the global mean.
   Checked on fedur's tiny CLIP (CIFAR-10 train features, D = 128, N = 50,000): with 'reference' the
   responsibilities are uniform after one round (mean max 0.10) and GDA accuracy falls to 13 % by round 10.
   The two give the same argmax for uniform priors and differ only by the factor absorbed in alpha.
2. ``prior='uniform'`` (default, the reference's line 62): log pi_c = -log C. Alternative
   ``'estimated'``: the EM M-step's pi_c = N_c / N. Uniform keeps zero-shot CLIP's class bias out of the
   prior (the pseudo-label histogram is skewed even when the data are balanced) and stops EM's
   rich-get-richer drift; ``'estimated'`` is the textbook GMM.
3. The E-step posterior is the pure GDA posterior softmax(W f + b) (default ``source='gda'``, the method's `e_step: gda`; textbook
   EM for the mixture, as FedUR describes GDA-U). Alternative ``source='ensemble'``: softmax(clip_logits
   + alpha (W f + b)), which keeps the text knowledge inside the loop (anchors the clusters to the class
   names). On the tiny CLIP, whose deliberately biased features do not cluster by class (supervised GDA:
   59.4 %, zero-shot: 59.4 %), pure EM drifts (GDA alone 58.6 % after round 1, 54.4 % after 10) and the
   ensemble E-step drifts less (56.4 %; 57.5 % with alpha 0.3): keep the number of rounds small. On the
   2-D toy of the tests (clean clusters, biased zero-shot) the anchor costs speed instead: after 6 rounds
   the ensemble E-step (alpha 1) reaches 94.5 % where pure EM reaches 100 % (98.5 % after 4).
4. An empty class (N_c = 0) gets w_c = 0 and b_c = ``EMPTY_CLASS_BIAS`` (-1e30: never predicted by GDA,
   zero responsibility, finite so that 0 * b and float32 casts stay finite), unless ``fallback_means``
   are given (e.g. the class's zero-shot text embedding; mind the modality gap), then mu_c is that mean
   and it adds nothing to S_w; with ``prior='estimated'`` its prior is then half a sample, 0.5 / N.
   With softmax responsibilities N_c > 0 always, so this only arises with hard or masked responsibilities.
5. alpha = ``DEFAULT_ALPHA`` = 0.3 in the 'likelihood' scale (see :func:`ensemble_logits`): the
   reference's own validation picks converted to this scale have median 0.16 at 16 shots (0.001 at 1 shot,
   0.13 at 8 shots: they grow with the data, and unsupervised N per class is 10-100x larger, but
   pseudo-labels are noisier than labels), 0.33 over the datasets' modal picks. On the tiny CLIP after one
   round the GDA logits span 18.8 nats per image (median over CIFAR-10 test) against 7.1 for CLIP's,
   so 0.3 gives the two a comparable spread. Alternatives: alpha = 1
   (the plain product of the two posteriors p_clip * p_gda^alpha), or the reference's validation grid
   search, impossible without labels.
6. The first M-step takes the zero-shot softmax as soft responsibilities (one reading of FedUR's "EM from
   zero-shot pseudo-labels"). Alternative: one-hot argmax pseudo-labels (``responsibilities(..., hard=True)``),
   which sharpen the first means when CLIP's softmax is soft (fedur's tiny CLIP: logit scale ~13); on the
   tiny CLIP both give 58.6 % after one round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DEFAULT_ALPHA",
    "EMPTY_CLASS_BIAS",
    "GDAStats",
    "class_means",
    "e_step",
    "ensemble_logits",
    "flatten_statistics",
    "gda_classifier",
    "gda_logits",
    "responsibilities",
    "shrunk_precision",
    "sufficient_statistics",
    "sum_statistics",
    "unflatten_statistics",
    "within_class_scatter",
    "zero_statistics",
]

DEFAULT_ALPHA = 0.3  # [guess] 5: weight of the GDA log posterior ('likelihood' scale) against CLIP's logits
EMPTY_CLASS_BIAS = -1e30  # [guess] 4: bias of a class without data (finite in float32, exp() underflows to 0)
STATS_DTYPE = torch.float64

PrecisionScale = Literal["likelihood", "reference"]
Prior = Literal["uniform", "estimated"]


class GDAStats(NamedTuple):
    """The sufficient statistics of one client (or their sum over clients), all float64.

    Each field is a sum over samples, so statistics add elementwise across clients.
    """

    counts: Tensor  # (C,)   N_c = sum_i r_ic
    sums: Tensor  # (C, D)   S_c = sum_i r_ic f_i
    second_moment: Tensor  # (D, D)   Q = sum_i (sum_c r_ic) f_i f_i^T
    num_samples: Tensor  # ()   n, the number of samples (rows)


def zero_statistics(num_classes: int, dim: int, device: torch.device | str | None = None) -> GDAStats:
    """The statistics of a client without data: zeros of the fixed shapes (C,), (C, D), (D, D), ()."""
    z = {"dtype": STATS_DTYPE, "device": device}
    return GDAStats(
        torch.zeros(num_classes, **z), torch.zeros(num_classes, dim, **z), torch.zeros(dim, dim, **z), torch.zeros((), **z)
    )


def sufficient_statistics(features: Tensor, responsibilities: Tensor) -> GDAStats:
    """One client's M-step statistics (paper's EM for the shared-covariance Gaussian mixture).

    features: (n, D) frozen CLIP image features (unit norm in fedur; not required here);
    responsibilities: (n, C), r_ic >= 0 (soft class probabilities, or one-hot labels).
    Returns, in float64::

        N_c = sum_i r_ic            (C,)
        S_c = sum_i r_ic f_i        (C, D)
        Q   = sum_i w_i f_i f_i^T   (D, D),  w_i = sum_c r_ic  (= 1 for softmax rows)
        n   = number of rows        ()

    From these :func:`within_class_scatter` gets S_w = sum_c sum_i r_ic (f_i - mu_c)(f_i - mu_c)^T
    = Q - sum_c S_c S_c^T / N_c, the (N-1) * ``center_vecs.T.cov()`` of main_few_shots.py lines 59-60.
    n = 0 (an empty client) gives zeros.
    """
    if features.dim() != 2 or responsibilities.dim() != 2 or features.shape[0] != responsibilities.shape[0]:
        raise ValueError(  # internal: the method's shapes
            f"expected features (n, D) and responsibilities (n, C), got {tuple(features.shape)} and "
            f"{tuple(responsibilities.shape)}"
        )
    f = features.detach().to(STATS_DTYPE)  # (n, D)
    r = responsibilities.detach().to(device=f.device, dtype=STATS_DTYPE)  # (n, C)
    w = r.sum(dim=1)  # (n,)
    return GDAStats(
        counts=r.sum(dim=0),  # (C,)
        sums=r.T @ f,  # (C, D)
        second_moment=f.T @ (w.unsqueeze(1) * f),  # (D, D)
        num_samples=torch.tensor(float(f.shape[0]), dtype=STATS_DTYPE, device=f.device),
    )


def sum_statistics(per_client: Sequence[GDAStats]) -> GDAStats:
    """The server's aggregate: the elementwise sum of the clients' statistics, added one client at a
    time in the order given (pass them in client-id order, so the rounding is the same on every run).
    """
    if len(per_client) == 0:
        raise ValueError("sum_statistics needs at least one client's statistics")  # internal: the server sums at least one client
    total = per_client[0]
    for stats in per_client[1:]:
        total = GDAStats(*(a + b for a, b in zip(total, stats)))
    return total


def flatten_statistics(stats: GDAStats) -> Tensor:
    """One float64 vector (C + C*D + D*D + 1,) of the statistics, for one row of a collective exchange."""
    return torch.cat([t.reshape(-1).to(STATS_DTYPE) for t in stats])


def unflatten_statistics(flat: Tensor, num_classes: int, dim: int) -> GDAStats:
    """Inverse of :func:`flatten_statistics` for C = ``num_classes``, D = ``dim``."""
    c, d = num_classes, dim
    sizes = (c, c * d, d * d, 1)
    if flat.dim() != 1 or flat.numel() != sum(sizes):
        # internal: the method's shapes
        raise ValueError(f"expected a vector of {sum(sizes)} values for C={c}, D={d}, got shape {tuple(flat.shape)}")
    counts, sums, second, n = torch.split(flat.to(STATS_DTYPE), sizes)
    return GDAStats(counts, sums.reshape(c, d), second.reshape(d, d), n.reshape(()))


def class_means(stats: GDAStats, fallback_means: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """mu_c = S_c / N_c (main_few_shots.py line 56, with soft counts), and which classes have data.

    Returns ``mus`` (C, D) float64 and ``present`` (C,) bool, present = N_c > 0. An empty class's mean is
    ``fallback_means[c]`` (C, D) when given, else 0 (its classifier row is then dropped by
    :func:`gda_classifier`, [guess] 4).
    """
    present = stats.counts > 0  # (C,)
    safe = torch.where(present, stats.counts, torch.ones_like(stats.counts))  # (C,)
    mus = stats.sums / safe.unsqueeze(1)  # (C, D); rows of empty classes are 0 / 1 = 0
    if fallback_means is not None:
        if fallback_means.shape != mus.shape:
            # internal: the method's shapes
            raise ValueError(f"fallback_means must be (C, D) = {tuple(mus.shape)}, got {tuple(fallback_means.shape)}")
        mus = torch.where(present.unsqueeze(1), mus, fallback_means.to(mus))
    return mus, present


def within_class_scatter(stats: GDAStats) -> Tensor:
    """S_w = Q - sum_{c: N_c > 0} S_c S_c^T / N_c, (D, D) float64, symmetrised.

    Equals sum_c sum_i r_ic (f_i - mu_c)(f_i - mu_c)^T; with hard labels, the reference's
    (N - 1) * ``center_vecs.T.cov()`` (main_few_shots.py lines 59-60). Empty classes add nothing.
    """
    mus, present = class_means(stats)  # (C, D), (C,)
    weight = torch.where(present, stats.counts, torch.zeros_like(stats.counts))  # (C,)
    between = (mus * weight.unsqueeze(1)).T @ mus  # (D, D) sum_c N_c mu_c mu_c^T
    s_w = stats.second_moment - between
    return (s_w + s_w.T) / 2


def shrunk_precision(stats: GDAStats, precision_scale: PrecisionScale = "likelihood") -> Tensor:
    """The shared precision matrix P (D, D), float64: the reference's KS estimator (main_few_shots.py line 60).

    With N = sum_c N_c and S_w from :func:`within_class_scatter`, M = S_w + tr(S_w) / (N - 1) * I, i.e.
    (N - 1) * (Sigma_hat + tr(Sigma_hat) / (N - 1) * I) with Sigma_hat = S_w / (N - 1)::

        'reference':  P = D * pinv(M)          exactly line 60 (paper: D [(N-1) Sigma + tr(Sigma) I]^-1)
        'likelihood': P = (N - 1) * pinv(M) = pinv(Sigma_hat + tr(Sigma_hat)/(N-1) I)   [guess] 1, default

    'likelihood' is the inverse of the same ridge-shrunk covariance, so that W f + b is a log posterior
    in nats (what the E-step needs); 'reference' is (D / (N - 1)) times it. N - 1 is clamped at 1.
    """
    s_w = within_class_scatter(stats)  # (D, D)
    d = s_w.shape[0]
    n_minus_1 = (stats.counts.sum() - 1).clamp_min(1.0)  # ()
    eye = torch.eye(d, dtype=s_w.dtype, device=s_w.device)
    pinv = torch.linalg.pinv(s_w + torch.trace(s_w) / n_minus_1 * eye, hermitian=True)  # (D, D)
    if precision_scale == "reference":
        return d * pinv
    if precision_scale == "likelihood":
        return n_minus_1 * pinv
    # internal: a Literal setting checks it first
    raise ValueError(f"precision_scale must be 'likelihood' or 'reference', got {precision_scale!r}")


def gda_classifier(
    stats: GDAStats,
    *,
    precision_scale: PrecisionScale = "likelihood",
    prior: Prior = "uniform",
    fallback_means: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The GDA linear classifier (W (C, D), b (C,)), float64, from (summed) statistics.

    mu_c = S_c / N_c, P = :func:`shrunk_precision` (``precision_scale``, [guess] 1), and (paper Eq. for the
    GDA solution; main_few_shots.py lines 62-64)::

        w_c = P mu_c,     b_c = log pi_c - mu_c^T P mu_c / 2

    ``prior``: 'uniform' pi_c = 1/C (line 62, default) or 'estimated' pi_c = N_c / N ([guess] 2).
    Classes with N_c = 0: w_c = 0, b_c = EMPTY_CLASS_BIAS, unless ``fallback_means`` (C, D) give their
    mean ([guess] 4). Logits: :func:`gda_logits`.
    """
    precision = shrunk_precision(stats, precision_scale)  # (D, D)
    mus, present = class_means(stats, fallback_means)  # (C, D), (C,)
    num_classes = mus.shape[0]
    w = mus @ precision  # (C, D); P is symmetric, so row c is P mu_c
    quad = (w * mus).sum(dim=1)  # (C,) mu_c^T P mu_c
    if prior == "uniform":
        log_prior = torch.full_like(quad, -math.log(num_classes))  # (C,)
    elif prior == "estimated":
        total = stats.counts.sum().clamp_min(torch.finfo(STATS_DTYPE).tiny)
        counts = torch.where(present, stats.counts, torch.full_like(stats.counts, 0.5))  # empty: half a sample
        log_prior = torch.log(counts / total)  # (C,)
    else:
        raise ValueError(f"prior must be 'uniform' or 'estimated', got {prior!r}")  # internal: a Literal setting checks it first
    b = log_prior - quad / 2  # (C,)
    if fallback_means is None:
        w = torch.where(present.unsqueeze(1), w, torch.zeros_like(w))
        b = torch.where(present, b, torch.full_like(b, EMPTY_CLASS_BIAS))
    return w, b


def gda_logits(features: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """logits (B, C) = f @ W^T + b, computed in W's dtype (float64) (main_few_shots.py line 80, ``f @ W + b``
    with the reference's (D, C) W transposed).

    features: (B, D); W: (C, D); b: (C,). In the 'likelihood' scale a row is log pi_c + log N(f; mu_c,
    Sigma_shrunk) up to a term that does not depend on c, Sigma_shrunk = Sigma_hat + tr(Sigma_hat)/(N-1) I.
    The terms f^T P mu_c and mu_c^T P mu_c / 2 are large (~100 on the tiny CLIP, D = 128; more for tighter
    clusters in larger D) and cancel, hence float64.
    """
    if features.dim() != 2 or W.dim() != 2 or features.shape[1] != W.shape[1] or b.shape != W.shape[:1]:
        raise ValueError(  # internal: the method's shapes
            f"expected features (B, D), W (C, D), b (C,), got {tuple(features.shape)}, {tuple(W.shape)}, {tuple(b.shape)}"
        )
    f = features.detach().to(device=W.device, dtype=W.dtype)  # (B, D)
    return f @ W.T + b  # (B, C)


def ensemble_logits(clip_logits: Tensor, gda_logits: Tensor, alpha: float = DEFAULT_ALPHA) -> Tensor:
    """logits (B, C) = clip_logits + alpha * gda_logits (main_few_shots.py lines 71 and 80).

    clip_logits: (B, C) = logit_scale * cos(f, t_c) (the reference hard-codes 100, OpenAI CLIP's
    ``logit_scale.exp()``; fedur's tiny CLIP has about 13); gda_logits: (B, C) from :func:`gda_logits`.
    Result in the promoted dtype (float64 with GDA logits).

    Scale of alpha. The reference grid-searches alpha in {1e-4, ..., 100} on labelled validation data
    (lines 67-79); in logs/fewshots.log the 16-shot RN50 picks are 1 to 100 (ImageNet 0.01-10), the
    1-shot ones 1e-4 to 1e-2. Its GDA logits use P_ref = (D / (N-1)) P_lik ([guess] 1), so
    alpha_lik = alpha_ref * D / (N-1) (N counts its 10 augmented views per image, D = 1024 for RN50):
    the 16-shot picks are alpha_lik ~ 6e-5 to 64, median 0.16 (45 runs; mostly 0.06-1.4 per dataset).
    With another CLIP logit scale s the reference's rule reads s cos + alpha_ref (s / 100) g. Without a
    validation set, fedur uses the 'likelihood' scale, where both terms are log posteriors in nats, so
    the ensemble is p_clip(c|f) * p_gda(c|f)^alpha whatever s is (a small s, a soft CLIP, hands more of
    the decision to GDA), and alpha = ``DEFAULT_ALPHA`` = 0.3 ([guess] 5). 'reference'-scale GDA logits
    need alpha * (N-1) / D for the same ensemble.
    """
    if clip_logits.shape != gda_logits.shape:
        # internal: the method's shapes
        raise ValueError(f"clip_logits {tuple(clip_logits.shape)} and gda_logits {tuple(gda_logits.shape)} differ")
    return clip_logits.to(gda_logits.device) + alpha * gda_logits


def responsibilities(logits: Tensor, temperature: float = 1.0, hard: bool = False) -> Tensor:
    """The E-step posterior r (n, C) = softmax(logits / temperature) over classes; one-hot argmax if ``hard``.

    logits: (n, C), e.g. :func:`gda_logits` in the 'likelihood' scale (then temperature 1 is EM's exact
    posterior under the fitted mixture) or the zero-shot CLIP logits at the first iteration. ``hard``
    gives classification-EM / pseudo-label responsibilities ([guess] 6).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")  # internal: GDAU's ranges check it first
    if hard:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)  # (n, C)
    return torch.softmax(logits / temperature, dim=-1)  # (n, C)


def e_step(
    features: Tensor,
    W: Tensor,
    b: Tensor,
    clip_logits: Tensor | None = None,
    *,
    source: Literal["gda", "ensemble"] = "gda",
    alpha: float = DEFAULT_ALPHA,
    temperature: float = 1.0,
    hard: bool = False,
) -> Tensor:
    """One client's E-step: responsibilities (n, C) for its features (n, D) under the global (W, b).

    ``source='gda'`` (default, [guess] 3): softmax(W f + b), the mixture's posterior (textbook EM).
    ``source='ensemble'``: softmax(clip_logits + alpha (W f + b)), CLIP's (n, C) logits kept in the loop.
    """
    g = gda_logits(features, W, b)  # (n, C)
    if source == "gda":
        logits = g
    elif source == "ensemble":
        if clip_logits is None:
            raise ValueError("source='ensemble' needs clip_logits")  # internal: the method passes them
        logits = ensemble_logits(clip_logits, g, alpha)
    else:
        raise ValueError(f"source must be 'gda' or 'ensemble', got {source!r}")  # internal: a Literal setting checks it first
    return responsibilities(logits, temperature, hard)
