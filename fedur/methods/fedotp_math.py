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

Host synchronisation: the stop test is a tensor on the device, and reading it on the host (``bool``,
``.item()``) waits for the device. So the loops keep the stop state on the device (stopped problems,
or the whole batch once the batch-wide error fell below ``thresh``, are frozen by ``torch.where`` and
further iterations leave them unchanged) and read it only after iterations 1, 2, 4, ... below
``check_every`` and every ``check_every``-th iteration (default 16 on an accelerator), never after the
last one, to leave the loop early. The plan is bit-for-bit the one of a test after every iteration,
with at most ceil(log2(check_every)) + floor((max_iter - 1) / check_every) reads per solve (10 at the
defaults instead of up to 100), at the price of fewer than min(iterations run, check_every) iterations
past the stop. On the CPU, where a read costs nothing, and while autograd records through the cost,
the default is a read after every iteration (the graph is then the one of a plain loop).

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
   a ConfigError (a larger method.eps) here instead of returning None.
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

import math
import struct

import torch
import torch.nn.functional as F
from torch import Tensor

from fedur.errors import ConfigError
from fedur.model.precision import full_precision

__all__ = [
    "similarity",
    "balanced_ot_plan",
    "partial_ot_plan",
    "ot_plan",
    "ot_logits_from_sim",
    "ot_logits",
]

OT_KINDS = ("COT", "Sinkhorn")

CHECK_EVERY = 16  # default for check_every on a device where reading a value back is a synchronisation
_NO_SYNC_DEVICES = frozenset({"cpu"})  # device types where reading a value back costs nothing


def _no_autocast(t: Tensor):
    return full_precision(t.device)


def similarity(patch_features: Tensor, text_features: Tensor, normalize: bool = True) -> Tensor:
    """Cosine similarity of every patch with every prompt of every class, in float32.

    patch_features: (B, M, d), the M patch tokens of B images (CLS excluded).
    text_features:  (N, C, d), N prompts x C classes.
    Returns sim (B, C, M, N): sim[b, c, m, n] = <p_{b,m}, t_{n,c}>, after L2-normalising both over
    d when ``normalize`` (idempotent on unit vectors, also for the gradient). Differentiable.
    Reshaped to (B*C, M, N) it is the reference's ``sim`` (GLP_OT.py lines 303-305).
    """
    if patch_features.dim() != 3 or text_features.dim() != 3:
        raise ValueError(  # internal: the method's shapes
            f"expected patch_features (B, M, d) and text_features (N, C, d), got "
            f"{tuple(patch_features.shape)} and {tuple(text_features.shape)}"
        )
    if patch_features.shape[-1] != text_features.shape[-1]:
        raise ValueError(f"feature dims differ: {patch_features.shape[-1]} vs {text_features.shape[-1]}")  # internal: the method's shapes
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
        raise ValueError(f"cost must be (..., M, N), got {tuple(cost.shape)}")  # internal: the method's shapes
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


def _check_solver_args(eps: float, max_iter: int, check_every: int | None = None) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")  # internal: FedOTP's ranges check it first
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")  # internal: FedOTP's ranges check it first
    if check_every is not None and check_every < 1:
        raise ValueError(f"check_every must be >= 1, got {check_every}")  # internal: a constant


def _resolve_check_every(check_every: int | None, cost: Tensor) -> int:
    """``check_every``, or the default: 1 on the CPU and while autograd records through ``cost``, else CHECK_EVERY."""
    if check_every is not None:
        return int(check_every)
    if cost.device.type in _NO_SYNC_DEVICES or (torch.is_grad_enabled() and cost.requires_grad):
        return 1
    return CHECK_EVERY


def _is_check(it: int, check_every: int, max_iter: int) -> bool:
    """Whether the loop reads its stop state after iteration ``it`` (1-based): after the powers of two below
    ``check_every`` (1, 2, 4, ...) and every ``check_every``-th, not after the last (the loop ends there
    anyway). At most ceil(log2(check_every)) + floor((max_iter - 1) / check_every) reads; a stop is seen
    fewer than min(it, check_every) iterations late."""
    return it < max_iter and (it % check_every == 0 or (it < check_every and it & (it - 1) == 0))


_F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def _float32_lt_bound(thresh: float) -> float:
    """The float32 value t with ``x < t`` (in float32) exactly when ``float(x) < thresh`` (in double), for
    every float32 x: the smallest float32 >= thresh. The reference compares ``err.item()`` (a float32 read
    back as a double) with the double thresh; a device-side ``err < thresh`` would round thresh to float32
    first (to nearest), which differs when thresh rounds down (0.7: float32(0.7) < 0.7)."""
    t = float(thresh)
    if math.isnan(t) or math.isinf(t):
        return t
    if t > _F32_MAX:
        return math.inf
    if t < -_F32_MAX:
        return -_F32_MAX
    f = struct.unpack("<f", struct.pack("<f", t))[0]  # to nearest; |t| <= max float32, no overflow
    if f < t:  # rounded down: step up to the next float32
        if f == 0.0:
            return 2.0**-149  # the smallest positive (subnormal) float32
        bits = struct.unpack("<I", struct.pack("<f", f))[0]  # sign-magnitude: +1 grows |f|, -1 shrinks it
        f = struct.unpack("<f", struct.pack("<I", bits + 1 if f > 0 else bits - 1))[0]
    return f


def balanced_ot_plan(
    cost: Tensor,
    a: Tensor | None = None,
    b: Tensor | None = None,
    *,
    eps: float = 0.1,
    max_iter: int = 100,
    thresh: float = 1e-3,
    per_problem_stop: bool = True,
    check_every: int | None = None,
) -> Tensor:
    """Balanced entropic OT by Sinkhorn scaling (reference ``Sinkhorn``, GLP_OT.py lines 222-236).

    cost: (..., M, N); a: (..., M) row marginal, default 1/M; b: (..., N) column marginal,
    default 1/N (broadcast over the leading dims). K = exp(-cost/eps), r = c = 1, then per
    iteration r = a / (K c), c = b / (K^T r), stop when mean|r - r0| < thresh (per problem, or
    over the whole batch with ``per_problem_stop=False`` as in the reference) or after
    ``max_iter``. Returns T = diag(r) K diag(c), (..., M, N) float32, with T^T 1 = b exactly and
    T 1 = a at convergence. Differentiable if ``cost`` is (call under no_grad for FedOTP).
    ``check_every``: the longest run of iterations without reading the stop state back to the host
    (see the module docstring; it changes no bit of the result).
    """
    _check_solver_args(eps, max_iter, check_every)
    check_every = _resolve_check_every(check_every, cost)
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
        done = None  # batch-wide stop, on the device: the error fell below thresh in an earlier iteration
        bound = _float32_lt_bound(thresh)
        for it in range(1, max_iter + 1):
            r0 = r
            r_new = a / torch.matmul(K, c.unsqueeze(-1)).squeeze(-1)
            c_new = b / torch.matmul(Kt, r_new.unsqueeze(-1)).squeeze(-1)
            if per_problem_stop:
                keep = active.unsqueeze(-1)
                r = torch.where(keep, r_new, r)
                c = torch.where(keep, c_new, c)
                active = active & ~((r - r0).abs().mean(-1) < thresh)
                if _is_check(it, check_every, max_iter) and not bool(active.any()):
                    break
            else:
                frozen = done is not None and check_every > 1  # else done is False here (or unset)
                if frozen:  # once stopped, keep the state of the stopping iteration (updated, as the reference's)
                    r_new = torch.where(done, r, r_new)
                    c_new = torch.where(done, c, c_new)
                r, c = r_new, c_new
                below = (r - r0).abs().mean() < bound  # the reference's err.item() < thresh
                done = done | below if frozen else below
                if _is_check(it, check_every, max_iter) and bool(done):
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
    check_every: int | None = None,
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
    ``check_every``: as in :func:`balanced_ot_plan`.
    """
    _check_solver_args(eps, max_iter, check_every)
    if not top_percent > 0:
        raise ValueError(f"top_percent must be > 0, got {top_percent}")  # internal: FedOTP's ranges check it first
    check_every = _resolve_check_every(check_every, cost)
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
        done = None  # batch-wide stop, on the device, as in balanced_ot_plan
        bound = _float32_lt_bound(thresh)
        for it in range(1, max_iter + 1):
            v0 = v
            u_new = torch.minimum(1.0 / torch.matmul(Kp, v.unsqueeze(-1)).squeeze(-1), ones_m)
            v_new = 1.0 / torch.matmul(Kq, u_new.unsqueeze(-1)).squeeze(-1)
            if per_problem_stop:
                keep = active.unsqueeze(-1)
                u = torch.where(keep, u_new, u)
                v = torch.where(keep, v_new, v)
                active = active & ~((v - v0).abs().mean(-1) < thresh)
                if _is_check(it, check_every, max_iter) and not bool(active.any()):
                    break
            else:
                frozen = done is not None and check_every > 1  # else done is False here (or unset)
                if frozen:  # once stopped, keep the state of the stopping iteration (updated, as the reference's)
                    u_new = torch.where(done, u, u_new)
                    v_new = torch.where(done, v, v_new)
                u, v = u_new, v_new
                below = (v - v0).abs().mean() < bound  # the reference's err.item() < thresh
                done = done | below if frozen else below
                if _is_check(it, check_every, max_iter) and bool(done):
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
    the plan (..., M, N) float32, without gradient. Raises a ConfigError if it is not finite.
    """
    if ot not in OT_KINDS:
        raise ValueError(f"ot must be one of {OT_KINDS}, got {ot!r}")  # internal: fedur's own choices
    kw = dict(eps=eps, max_iter=max_iter, thresh=thresh, per_problem_stop=per_problem_stop)
    with torch.no_grad():
        cost = 1.0 - sim.detach().float()
        if ot == "COT":
            T = partial_ot_plan(cost, top_percent=top_percent, **kw)
        else:
            T = balanced_ot_plan(cost, **kw)
    if not bool(torch.isfinite(T).all()):  # one read back per call, after the loop
        raise ConfigError(
            f"FedOTP's transport plan is not finite (method.eps={eps}: exp(-cost/eps) underflows in float32 for "
            f"cost/eps > ~87); a larger --method.eps keeps it finite"
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
