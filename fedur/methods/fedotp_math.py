"""The optimal-transport logits of FedOTP (Li et al., CVPR 2024, "Global and Local Prompts
Cooperation via Optimal Transport for Federated Learning"), as pure tensor functions.

What FedOTP computes
--------------------
Each client holds N (= 2) CoOp text prompts: prompt 0 is global (averaged across clients by
FedAvg), prompt 1 is local. For one image and one class c, the N prompt text features t_{n,c}
are matched to the M patch features p_m of the image (every ViT token except CLS, after
``ln_post`` and ``@ proj``) by entropic optimal transport, and the class logit is the
transport-weighted similarity::

    sim[m, n]  = <p_m / |p_m|, t_{n,c} / |t_{n,c}|>            (cosine, patch x prompt)
    cost       = 1 - sim
    T          = OT plan for `cost`, computed without gradient
    logit_c    = logit_scale * sum_{m,n} T[m, n] * sim[m, n]

Two solvers, chosen by ``ot`` (the reference's ``--OT``):

* ``'COT'`` (the reference's default): the partial / "unbalanced" plan of ``entropic_COT_fast``.
  Marginals: rows (patches) a = 1/M each, an upper bound only; columns (prompts)
  b = top_percent/N each, exact. So the plan carries total mass ``top_percent`` and each prompt
  is matched to a ``top_percent`` share of the image, on the patches that suit it best; no patch
  gives more than its 1/M. Scaling iterations (K = exp(-cost/eps), u, v start at 1)::

      u <- min(a / (K v), 1)      # Bregman step for the row constraint  T 1 <= a
      v <- b / (K^T u)            # exact column constraint             T^T 1 = b
      T  = diag(u) K diag(v)

  This is dual block-coordinate ascent (the u <= 1 cap is the multiplier of the inequality
  being <= 0) for  min <cost, T> + eps * sum T (log T - 1)  s.t.  T 1 <= a,  T^T 1 = b.
  After each iteration (so also at a truncated stop) the columns hold exactly; the row bound
  holds at convergence.
* ``'Sinkhorn'``: plain balanced Sinkhorn, a = 1/M, b = 1/N, total mass 1. Each iteration
  ends with c <- b / (K^T r), so the columns are exact after every iteration and the rows hold
  at convergence.

Iteration stops after ``max_iter`` iterations, or once the mean absolute change of the scaling
that is tested (v for COT, r = row scaling for Sinkhorn) falls below ``thresh``.

Reference followed (github.com/HongxiaLee/FedOTP, commit 9948611, ``trainers/GLP_OT.py``):

* lines 222-236 ``Sinkhorn``: r = u / (K c), c = v / (K^T r), err = mean|r - r0|, break on
  err < thresh, T = r c^T * K          -> :func:`balanced_ot_plan`
* lines 238-274 ``entropic_COT_fast``: Kp = diag(1/a) K, Kq = diag(1/b) K^T, u = min(1/(Kp v), 1),
  v = 1/(Kq u), err = mean|v - v0|, break on err < thresh, T = diag(u) K diag(v); its ``reg``
  argument (0.01) is unused, K = exp(-(1 - sim)/eps) is passed in  -> :func:`partial_ot_plan`
* lines 298-301: image patch features and text features are L2-normalised
  -> ``normalize=True`` in :func:`ot_logits`
* lines 303-306: sim = einsum('mbd,ncd->mnbc') reshaped to (b*C, M, N); wdist = 1 - sim
  -> :func:`similarity` (layout (B, C, M, N), the same problems in the same order)
* lines 308-313: xx = 1/M; yy = 1/N ('Sinkhorn') or top_percent/N with
  top_percent = min(sum(xx), TOP_PERCENT) ('COT')  -> default marginals
* lines 315-320: KK = exp(-wdist / eps) and T under torch.no_grad()  -> :func:`ot_plan`
* lines 325-330: logits = logit_scale.exp() * sum(T * sim, dim=(M, N)), viewed (b, C)
  -> :func:`ot_logits_from_sim` (here ``logit_scale`` is the already-exponentiated scale)
* ``clip/model.py`` ``ModifiedVisionTransformer.forward``: ln_post and proj on every token, the
  patch features are tokens 1: (GLP_OT.py line 281).

Defaults (``federated_main.py`` lines 535-539 and ``scripts/fedotp_cifar100.sh``, the ViT-B/16
run): OT='COT', eps=0.1, thresh=1e-3, max_iter=100, N=2 (``--num_prompt``), and
top_percent=0.8 from the scripts (the argparse default of ``--top_percent`` is 1; the few-shot
RN50 script uses top_percent=0.8 with eps=0.01). The prompt-pooled feature
``text_feature_pool`` (line 291) is computed by the reference but unused for the logits.

Differences from the reference, and why
---------------------------------------
1. Precision: similarities, the kernel and the plan are computed in float32 (autocast disabled
   inside), whatever the input dtype; logits come back float32. The reference runs them in the
   model's dtype (fp16 by default, ``PREC = "fp16"``), where exp(-(1 - sim)/0.1) underflows to 0
   for sim < -0.66 and the plan can become NaN (the reference then returns None). In float32,
   exp(-cost/eps) stays normal for cost/eps < 87, i.e. for every cost in [0, 2] when eps >= 0.023;
   at eps=0.01 (few-shot script) costs above 0.87 underflow. A non-finite plan raises
   FloatingPointError here instead of returning None.
2. Stopping: the reference tests ONE error for the whole batch (mean over all b*C problems), so
   the iterations a problem gets depend on the other images in the batch. Here, by default
   (``per_problem_stop=True``), each (image, class) problem stops on its own error (mean over
   its N entries of |v - v0| for COT, over its M entries of |r - r0| for Sinkhorn), and a
   stopped problem is frozen at the iterate the reference would return for it alone. Batched
   results then equal per-image results, and a problem batched alone is bit-for-bit the
   reference's. ``per_problem_stop=False`` reproduces the reference's batch-wide test.
3. top_percent: the reference takes min(sum over the WHOLE batch of xx, TOP_PERCENT)
   = min(b*C, TOP_PERCENT); here it is min(sum of one problem's a, top_percent) = min(1, top_percent)
   with uniform a, the evident intent (a plan cannot carry more mass than its rows allow).
   Identical for top_percent <= 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "similarity",
    "balanced_ot_plan",
    "partial_ot_plan",
    "ot_plan",
    "ot_logits_from_sim",
    "ot_logits",
]

OT_KINDS = ("COT", "Sinkhorn")


def _no_autocast(t: Tensor):
    return torch.autocast(device_type=t.device.type, enabled=False)


def similarity(patch_features: Tensor, text_features: Tensor, normalize: bool = True) -> Tensor:
    """Cosine similarity of every patch with every prompt of every class, in float32.

    patch_features: (B, M, d), the M patch tokens of B images (CLS excluded).
    text_features:  (N, C, d), N prompts x C classes.
    Returns sim (B, C, M, N): sim[b, c, m, n] = <p_{b,m}, t_{n,c}>, after L2-normalising both over
    d when ``normalize`` (idempotent on unit vectors, also for the gradient). Differentiable.
    Reshaped to (B*C, M, N) it is the reference's ``sim`` (GLP_OT.py lines 303-305).
    """
    if patch_features.dim() != 3 or text_features.dim() != 3:
        raise ValueError(
            f"expected patch_features (B, M, d) and text_features (N, C, d), got "
            f"{tuple(patch_features.shape)} and {tuple(text_features.shape)}"
        )
    if patch_features.shape[-1] != text_features.shape[-1]:
        raise ValueError(f"feature dims differ: {patch_features.shape[-1]} vs {text_features.shape[-1]}")
    with _no_autocast(patch_features):
        p = patch_features.float()
        t = text_features.float()
        if normalize:
            p = F.normalize(p, dim=-1)
            t = F.normalize(t, dim=-1)
        return torch.einsum("bmd,ncd->bcmn", p, t)


def _flatten_problems(cost: Tensor, a: Tensor | None, b: Tensor | None):
    """cost (..., M, N) -> (P, M, N) float32, a (P, M), b-or-None (P, N); plus the leading shape."""
    if cost.dim() < 2:
        raise ValueError(f"cost must be (..., M, N), got {tuple(cost.shape)}")
    lead, (m, n) = cost.shape[:-2], cost.shape[-2:]
    c = cost.float().reshape(-1, m, n)
    p = c.shape[0]
    if a is None:
        a = torch.full((p, m), 1.0 / m, dtype=torch.float32, device=c.device)
    else:
        a = a.float().expand(*lead, m).reshape(p, m)
    if b is not None:
        b = b.float().expand(*lead, n).reshape(p, n)
    return c, a, b, lead


def _check_solver_args(eps: float, max_iter: int) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")


def balanced_ot_plan(
    cost: Tensor,
    a: Tensor | None = None,
    b: Tensor | None = None,
    *,
    eps: float = 0.1,
    max_iter: int = 100,
    thresh: float = 1e-3,
    per_problem_stop: bool = True,
) -> Tensor:
    """Balanced entropic OT by Sinkhorn scaling (reference ``Sinkhorn``, GLP_OT.py lines 222-236).

    cost: (..., M, N); a: (..., M) row marginal, default 1/M; b: (..., N) column marginal,
    default 1/N (broadcast over the leading dims). K = exp(-cost/eps), r = c = 1, then per
    iteration r = a / (K c), c = b / (K^T r), stop when mean|r - r0| < thresh (per problem, or
    over the whole batch with ``per_problem_stop=False`` as in the reference) or after
    ``max_iter``. Returns T = diag(r) K diag(c), (..., M, N) float32, with T^T 1 = b exactly and
    T 1 = a at convergence. Differentiable if ``cost`` is (call under no_grad for FedOTP).
    """
    _check_solver_args(eps, max_iter)
    with _no_autocast(cost):
        c_, a, b, lead = _flatten_problems(cost, a, b)
        p, m, n = c_.shape
        if b is None:
            b = torch.full((p, n), 1.0 / n, dtype=torch.float32, device=c_.device)
        K = torch.exp(-c_ / eps)
        Kt = K.transpose(-1, -2)
        r = torch.ones_like(a)
        c = torch.ones_like(b)
        active = torch.ones(p, dtype=torch.bool, device=c_.device)
        for _ in range(max_iter):
            r0 = r
            r_new = a / torch.matmul(K, c.unsqueeze(-1)).squeeze(-1)
            c_new = b / torch.matmul(Kt, r_new.unsqueeze(-1)).squeeze(-1)
            if per_problem_stop:
                keep = active.unsqueeze(-1)
                r = torch.where(keep, r_new, r)
                c = torch.where(keep, c_new, c)
                active = active & ~((r - r0).abs().mean(-1) < thresh)
                if not bool(active.any()):
                    break
            else:
                r, c = r_new, c_new
                if (r - r0).abs().mean().item() < thresh:
                    break
        T = (r.unsqueeze(-1) * c.unsqueeze(-2)) * K  # the reference's (r c^T) * K
        return T.reshape(*lead, m, n)


def partial_ot_plan(
    cost: Tensor,
    a: Tensor | None = None,
    b: Tensor | None = None,
    *,
    top_percent: float = 0.8,
    eps: float = 0.1,
    max_iter: int = 100,
    thresh: float = 1e-3,
    per_problem_stop: bool = True,
) -> Tensor:
    """FedOTP's 'COT' partial entropic OT (reference ``entropic_COT_fast``, GLP_OT.py lines 238-274).

    cost: (..., M, N). a: (..., M) row bound, default 1/M. b: (..., N) exact column marginal,
    default top_percent' / N with top_percent' = min(sum(a) per problem, top_percent).
    K = exp(-cost/eps), u = v = 1, then per iteration
        u = min(a / (K v), 1);  v = b / (K^T u)
    stop when mean|v - v0| < thresh (per problem, or over the whole batch with
    ``per_problem_stop=False`` as in the reference) or after ``max_iter``.
    Returns T = diag(u) K diag(v), (..., M, N) float32: T^T 1 = b exactly (total mass sum(b)),
    T 1 <= a at convergence. Differentiable if ``cost`` is (call under no_grad for FedOTP).
    """
    _check_solver_args(eps, max_iter)
    if not top_percent > 0:
        raise ValueError(f"top_percent must be > 0, got {top_percent}")
    with _no_autocast(cost):
        c_, a, b, lead = _flatten_problems(cost, a, b)
        p, m, n = c_.shape
        if b is None:
            mass = torch.clamp(a.sum(-1, keepdim=True), max=top_percent)  # (P, 1)
            b = torch.full((p, n), 1.0 / n, dtype=torch.float32, device=c_.device) * mass
        K = torch.exp(-c_ / eps)
        Kp = (1.0 / a).unsqueeze(-1) * K  # diag(1/a) K, as the reference's diag_embed matmul
        Kq = (1.0 / b).unsqueeze(-1) * K.transpose(-1, -2)  # diag(1/b) K^T
        ones_m = torch.ones_like(a)
        u = ones_m
        v = torch.ones_like(b)
        active = torch.ones(p, dtype=torch.bool, device=c_.device)
        for _ in range(max_iter):
            v0 = v
            u_new = torch.minimum(1.0 / torch.matmul(Kp, v.unsqueeze(-1)).squeeze(-1), ones_m)
            v_new = 1.0 / torch.matmul(Kq, u_new.unsqueeze(-1)).squeeze(-1)
            if per_problem_stop:
                keep = active.unsqueeze(-1)
                u = torch.where(keep, u_new, u)
                v = torch.where(keep, v_new, v)
                active = active & ~((v - v0).abs().mean(-1) < thresh)
                if not bool(active.any()):
                    break
            else:
                u, v = u_new, v_new
                if (v - v0).abs().mean().item() < thresh:
                    break
        T = u.unsqueeze(-1) * K * v.unsqueeze(-2)
        return T.reshape(*lead, m, n)


def ot_plan(
    sim: Tensor,
    *,
    ot: str = "COT",
    eps: float = 0.1,
    top_percent: float = 0.8,
    max_iter: int = 100,
    thresh: float = 1e-3,
    per_problem_stop: bool = True,
) -> Tensor:
    """The FedOTP transport plan for similarities ``sim`` (..., M, N), e.g. (B, C, M, N).

    cost = 1 - sim; uniform marginals (rows 1/M; columns top_percent/N for 'COT', 1/N for
    'Sinkhorn'); computed under torch.no_grad() in float32 (GLP_OT.py lines 306-320). Returns
    the plan (..., M, N) float32, without gradient. Raises FloatingPointError if it is not finite.
    """
    if ot not in OT_KINDS:
        raise ValueError(f"ot must be one of {OT_KINDS}, got {ot!r}")
    kw = dict(eps=eps, max_iter=max_iter, thresh=thresh, per_problem_stop=per_problem_stop)
    with torch.no_grad():
        cost = 1.0 - sim.detach().float()
        if ot == "COT":
            T = partial_ot_plan(cost, top_percent=top_percent, **kw)
        else:
            T = balanced_ot_plan(cost, **kw)
    if not bool(torch.isfinite(T).all()):
        raise FloatingPointError(
            f"FedOTP transport plan is not finite (eps={eps}: exp(-cost/eps) underflows in float32 "
            f"for cost/eps > ~87)"
        )
    return T


def ot_logits_from_sim(
    sim: Tensor,
    logit_scale: float | Tensor,
    *,
    ot: str = "COT",
    eps: float = 0.1,
    top_percent: float = 0.8,
    max_iter: int = 100,
    thresh: float = 1e-3,
    per_problem_stop: bool = True,
    return_plan: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """logits[..., ] = logit_scale * sum_{m,n} T * sim  (GLP_OT.py lines 325-330).

    sim: (..., M, N), e.g. (B, C, M, N) from :func:`similarity`; logit_scale: the multiplicative
    scale (CLIP's ``logit_scale.exp()``), a float or scalar tensor. T from :func:`ot_plan` is a
    constant, so d logits / d sim = logit_scale * T. Returns float32 logits (...,), e.g. (B, C),
    and the plan too when ``return_plan``.
    """
    T = ot_plan(
        sim, ot=ot, eps=eps, top_percent=top_percent, max_iter=max_iter, thresh=thresh,
        per_problem_stop=per_problem_stop,
    )
    with _no_autocast(sim):
        scale = logit_scale.float() if isinstance(logit_scale, Tensor) else float(logit_scale)
        logits = scale * torch.sum(T * sim.float(), dim=(-2, -1))
    return (logits, T) if return_plan else logits


def ot_logits(
    patch_features: Tensor,
    text_features: Tensor,
    logit_scale: float | Tensor,
    *,
    ot: str = "COT",
    eps: float = 0.1,
    top_percent: float = 0.8,
    max_iter: int = 100,
    thresh: float = 1e-3,
    normalize: bool = True,
    per_problem_stop: bool = True,
    return_plan: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """FedOTP class logits (B, C) from patch features (B, M, d) and prompt features (N, C, d).

    ``logit_scale`` is the multiplicative scale (CLIP's ``logit_scale.exp()``). The plan is
    computed without gradient; gradients reach the features (and a tensor ``logit_scale``)
    through sim only. Float32 output whatever the input dtype. With ``return_plan`` also
    returns the plan (B, C, M, N).
    """
    sim = similarity(patch_features, text_features, normalize=normalize)
    return ot_logits_from_sim(
        sim, logit_scale, ot=ot, eps=eps, top_percent=top_percent, max_iter=max_iter,
        thresh=thresh, per_problem_stop=per_problem_stop, return_plan=return_plan,
    )
