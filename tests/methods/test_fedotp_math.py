"""fedur.methods.fedotp_math: FedOTP's optimal-transport logits (HongxiaLee/FedOTP trainers/GLP_OT.py)."""

from __future__ import annotations

import math
import struct

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fedur.errors import ConfigError
from fedur.methods import fedotp_math
from fedur.methods.fedotp_math import (
    balanced_ot_plan,
    ot_logits,
    ot_logits_from_sim,
    ot_plan,
    partial_ot_plan,
    similarity,
)
from fedur.model.precision import full_precision

CONVERGED = dict(thresh=1e-10, max_iter=5000)  # run the scaling loops to convergence


def _features(seed: int, b: int = 3, m: int = 7, n: int = 2, c: int = 4, d: int = 16):
    """Patch (B, M, d) and prompt (N, C, d) features with CLIP-like positive similarities."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=g)
    patches = base + 0.8 * torch.randn(b, m, d, generator=g)
    texts = base + 0.8 * torch.randn(n, c, d, generator=g)
    return patches, texts


def _unit(x):
    return F.normalize(x, dim=-1)


# --- the reference, transcribed (GLP_OT.py lines 222-274 and 298-330), as the oracle -------------


def _ref_sinkhorn(K, u, v, max_iter, thresh):
    r = torch.ones_like(u)
    c = torch.ones_like(v)
    for _ in range(max_iter):
        r0 = r
        r = u / torch.matmul(K, c.unsqueeze(-1)).squeeze(-1)
        c = v / torch.matmul(K.permute(0, 2, 1).contiguous(), r.unsqueeze(-1)).squeeze(-1)
        err = (r - r0).abs().mean()
        if err.item() < thresh:
            break
    return torch.matmul(r.unsqueeze(-1), c.unsqueeze(-2)) * K


def _ref_cot(a, b, M, numItermax, stopThr):
    dx = torch.ones_like(a)
    dy = torch.ones_like(b)
    K = M
    Kp = torch.matmul(torch.diag_embed(1 / a, dim1=1), K)
    Kq = torch.matmul(torch.diag_embed(1 / b, dim1=1), K.permute(0, 2, 1))
    cpt = 0
    u = dx
    v = dy
    while cpt < numItermax:
        v0 = v
        temp = torch.div(dx, torch.matmul(Kp, v.unsqueeze(-1)).squeeze(-1))
        u = torch.minimum(temp, dx)
        v = torch.div(dy, torch.matmul(Kq, u.unsqueeze(-1)).squeeze(-1))
        cpt = cpt + 1
        err = (v - v0).abs().mean()
        if err.item() < stopThr:
            break
    Kprev = torch.matmul(torch.diag_embed(u, dim1=1), K)
    return torch.matmul(Kprev, torch.diag_embed(v, dim1=1))


def _ref_logits(image_features, text_features, logit_scale_exp, OT, eps, top_percent, max_iter, thresh):
    """image_features (M, b, d) as the reference's encoder returns them (CLS removed); text (N, C, d)."""
    M, b = image_features.shape[:2]
    N, n_cls = text_features.shape[:2]
    image_features = F.normalize(image_features, dim=2)
    text_features = F.normalize(text_features, dim=2)
    sim = torch.einsum("mbd,ncd->mnbc", image_features, text_features).contiguous()
    sim = sim.view(M, N, b * n_cls)
    sim = sim.permute(2, 0, 1)
    wdist = 1.0 - sim
    xx = torch.zeros(b * n_cls, M, dtype=sim.dtype, device=sim.device).fill_(1.0 / M)
    if OT == "Sinkhorn":
        yy = torch.zeros(b * n_cls, N, dtype=sim.dtype, device=sim.device).fill_(1.0 / N)
    else:
        top_percent = min(torch.sum(xx).item(), top_percent)
        yy = torch.zeros(b * n_cls, N, dtype=sim.dtype, device=sim.device).fill_(1.0 / N) * top_percent
    with torch.no_grad():
        KK = torch.exp(-wdist / eps)
        if OT == "Sinkhorn":
            T = _ref_sinkhorn(KK, xx, yy, max_iter, thresh)
        else:
            T = _ref_cot(xx, yy, KK, max_iter, thresh)
    sim_op = torch.sum(T * sim, dim=(1, 2))
    sim_op = sim_op.contiguous().view(b, n_cls)
    return logit_scale_exp * sim_op, T


# --- similarity ----------------------------------------------------------------------------------


def test_similarity_layout_and_values():
    p, t = _features(0, b=2, m=3, n=2, c=4)
    sim = similarity(p, t)
    assert sim.shape == (2, 4, 3, 2) and sim.dtype == torch.float32
    pu, tu = _unit(p), _unit(t)
    for b in range(2):
        for c in range(4):
            for m in range(3):
                for n in range(2):
                    assert sim[b, c, m, n].item() == pytest.approx(float(pu[b, m] @ tu[n, c]), abs=1e-6)
    # normalize=False is the raw dot product; on unit inputs both agree
    assert torch.allclose(similarity(pu, tu, normalize=False), sim, atol=1e-6)
    assert not torch.allclose(similarity(p, t, normalize=False), sim, atol=1e-3)


def test_similarity_rejects_bad_shapes():
    with pytest.raises(ValueError):
        similarity(torch.zeros(2, 3), torch.zeros(2, 4, 3))
    with pytest.raises(ValueError):
        similarity(torch.zeros(2, 3, 5), torch.zeros(2, 4, 6))


# --- plans on hand-computable cases --------------------------------------------------------------


def test_cot_symmetric_2x2_unsaturated_rows():
    # a = (1/2, 1/2) bound, b = (0.4, 0.4). Each row carries 0.4 < 1/2, so u = 1 and
    # T = K diag(v): columns of K scaled to 0.4.
    cost = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    T = partial_ot_plan(cost, eps=1.0, top_percent=0.8, **CONVERGED)
    x = 0.4 / (1 + math.exp(-1))
    expected = torch.tensor([[x, 0.4 - x], [0.4 - x, x]])
    assert torch.allclose(T, expected, atol=1e-6)


def test_cot_2x2_saturated_row():
    # Row 0 is cheap: left alone it would carry 2 * 0.4/(1 + e^-1) = 0.585 > 1/2, so it saturates at
    # 1/2 (split evenly by symmetry) and row 1 carries the remaining 0.3.
    cost = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    T = partial_ot_plan(cost, eps=1.0, top_percent=0.8, **CONVERGED)
    assert torch.allclose(T, torch.tensor([[0.25, 0.25], [0.15, 0.15]]), atol=1e-6)


def test_cot_single_prompt_cap():
    # N = 1: unconstrained t ∝ K = (1, e^-1) would give (0.585, 0.215); the cap 1/2 makes it (0.5, 0.3).
    T = partial_ot_plan(torch.tensor([[0.0], [1.0]]), eps=1.0, top_percent=0.8, **CONVERGED)
    assert torch.allclose(T, torch.tensor([[0.5], [0.3]]), atol=1e-6)
    # and with a small cost gap nothing saturates: t = 0.8 * K / sum(K)
    T = partial_ot_plan(torch.tensor([[0.0], [0.1]]), eps=1.0, top_percent=0.8, **CONVERGED)
    k = torch.tensor([[1.0], [math.exp(-0.1)]])
    assert torch.allclose(T, 0.8 * k / k.sum(), atol=1e-6)


def test_balanced_symmetric_2x2():
    # T = [[x, 1/2 - x], [1/2 - x, x]] with x / (1/2 - x) = e^{1/eps}.
    cost = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    for eps in (1.0, 0.5):
        T = balanced_ot_plan(cost, eps=eps, **CONVERGED)
        x = 0.5 / (1 + math.exp(-1 / eps))
        assert torch.allclose(T, torch.tensor([[x, 0.5 - x], [0.5 - x, x]]), atol=1e-6)


# --- marginals -----------------------------------------------------------------------------------


def test_balanced_marginals():
    g = torch.Generator().manual_seed(1)
    cost = 2 * torch.rand(2, 3, 7, 2, generator=g)
    T = balanced_ot_plan(cost, eps=0.1, **CONVERGED)
    assert T.shape == cost.shape and (T >= 0).all()
    assert torch.allclose(T.sum(-1), torch.full((2, 3, 7), 1 / 7), atol=1e-6)
    assert torch.allclose(T.sum(-2), torch.full((2, 3, 2), 1 / 2), atol=1e-6)
    # columns are exact after every iteration, also at the default (truncated) settings
    T = balanced_ot_plan(cost)
    assert torch.allclose(T.sum(-2), torch.full((2, 3, 2), 1 / 2), atol=1e-6)
    # given marginals are honoured
    a = torch.tensor([0.1, 0.2, 0.3, 0.4])
    b = torch.tensor([0.7, 0.3])
    T = balanced_ot_plan(torch.rand(4, 2, generator=g), a, b, eps=0.5, **CONVERGED)
    assert torch.allclose(T.sum(-1), a, atol=1e-6) and torch.allclose(T.sum(-2), b, atol=1e-6)


def test_cot_marginals_and_optimality():
    g = torch.Generator().manual_seed(2)
    M, N, tp = 7, 2, 0.8
    cost = 2 * torch.rand(2, 3, M, N, generator=g)
    eps = 0.5
    T = partial_ot_plan(cost, eps=eps, top_percent=tp, **CONVERGED)
    assert (T >= 0).all()
    assert torch.allclose(T.sum(-2), torch.full((2, 3, N), tp / N), atol=1e-6)  # columns exact
    assert torch.allclose(T.sum((-2, -1)), torch.full((2, 3), tp), atol=1e-6)  # total mass
    rows = T.sum(-1)
    assert (rows <= 1 / M + 1e-6).all()  # rows bounded by a
    assert (rows < 1 / M - 1e-3).any() and (rows > 1 / M - 1e-6).any()  # the bound is active somewhere
    # KKT: T = u_i K_ij v_j with u_i <= 1 and u_i = 1 on every row below its bound
    ratio = T / torch.exp(-cost / eps)  # u_i v_j
    v = ratio.max(dim=-2, keepdim=True).values
    free = rows < 1 / M - 1e-4
    u = (ratio / v)[..., 0]
    assert (u <= 1 + 1e-5).all()
    assert torch.allclose(u[free], torch.ones_like(u[free]), atol=1e-4)


def test_cot_default_settings_mass():
    p, t = _features(3, b=4, m=49, c=5)
    T = ot_plan(similarity(p, t))
    assert T.shape == (4, 5, 49, 2)
    assert torch.allclose(T.sum(-2), torch.full((4, 5, 2), 0.4), atol=1e-6)
    assert torch.allclose(T.sum((-2, -1)), torch.full((4, 5), 0.8), atol=1e-6)
    assert (T.sum(-1) <= (1 / 49) * 1.01).all()
    Ts = ot_plan(similarity(p, t), ot="Sinkhorn")
    assert torch.allclose(Ts.sum((-2, -1)), torch.ones(4, 5), atol=1e-6)


def test_cot_top_percent_clamped_to_row_mass():
    cost = torch.tensor([[0.0, 1.0], [0.3, 0.2], [0.5, 0.5]])
    T = partial_ot_plan(cost, eps=0.5, top_percent=1.7, **CONVERGED)  # reference: min(sum(xx), 1.7)
    assert T.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(T.sum(-1), torch.full((3,), 1 / 3), atol=1e-5)  # full mass: rows saturate


# --- fidelity to the reference -------------------------------------------------------------------


@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
def test_matches_reference_transcription(OT):
    p, t = _features(4, b=3, m=10, n=2, c=5)
    ref_logits, ref_T = _ref_logits(p.permute(1, 0, 2), t, 100.0, OT, 0.1, 0.8, 100, 1e-3)
    logits, T = ot_logits(p, t, 100.0, ot=OT, per_problem_stop=False, return_plan=True)
    assert torch.allclose(T.reshape(-1, 10, 2), ref_T, rtol=1e-5, atol=1e-8)
    assert torch.allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
    # one (image, class) problem alone: the per-problem stop is the reference's stop
    ref1, _ = _ref_logits(p[:1].permute(1, 0, 2), t[:, :1], 100.0, OT, 0.1, 0.8, 100, 1e-3)
    assert torch.allclose(ot_logits(p[:1], t[:, :1], 100.0, ot=OT), ref1, rtol=1e-5, atol=1e-5)


def test_reference_stop_is_batch_dependent_per_problem_stop_is_not():
    # A problem that converges at once (constant cost) dilutes the reference's batch-wide error,
    # so the slow problem stops earlier in the batch than alone.
    slow = torch.tensor(
        [[0.06, 0.28], [0.22, 0.22], [0.16, 0.07], [0.18, 0.01], [0.04, 0.07], [0.24, 0.24]]
    )
    cost = torch.stack([torch.zeros(6, 2), slow])
    alone = partial_ot_plan(slow, per_problem_stop=False)
    assert (partial_ot_plan(cost, per_problem_stop=False)[1] - alone).abs().max() > 1e-4
    assert torch.equal(partial_ot_plan(cost)[1], partial_ot_plan(slow))
    assert torch.equal(partial_ot_plan(slow), alone)


# --- logits --------------------------------------------------------------------------------------


def test_logits_hand_case():
    # patches e1, e2; prompts e1, e2 for one class -> sim = I, cost = [[0, 1], [1, 0]]
    e = torch.eye(2)
    patches, texts = e.unsqueeze(0), e.unsqueeze(1)  # (1, 2, 2), (2, 1, 2)
    s = 50.0
    for eps in (1.0, 0.1):
        cot = ot_logits(patches, texts, s, eps=eps, top_percent=0.8, **CONVERGED)
        assert cot.shape == (1, 1)
        assert cot.item() == pytest.approx(s * 0.8 / (1 + math.exp(-1 / eps)), rel=1e-5)
        bal = ot_logits(patches, texts, s, ot="Sinkhorn", eps=eps, **CONVERGED)
        assert bal.item() == pytest.approx(s * 1.0 / (1 + math.exp(-1 / eps)), rel=1e-5)


def test_logits_equal_scale_times_plan_weighted_similarity():
    p, t = _features(5)
    s = torch.tensor(14.3)
    logits, T = ot_logits(p, t, s, return_plan=True)
    sim = similarity(p, t)
    by_hand = torch.zeros(3, 4)
    for b in range(3):
        for c in range(4):
            by_hand[b, c] = s * (T[b, c] * sim[b, c]).sum()
    assert logits.shape == (3, 4) and logits.dtype == torch.float32
    assert torch.allclose(logits, by_hand, rtol=1e-6, atol=1e-6)
    assert torch.allclose(ot_logits_from_sim(sim, s), logits)


def test_gradient_flows_through_sim_only():
    p, t = _features(6)
    p, t = _unit(p), _unit(t)
    s = 20.0
    g = torch.Generator().manual_seed(7)
    w = torch.randn(3, 4, generator=g)
    pp, tt = p.clone().requires_grad_(), t.clone().requires_grad_()
    scale = torch.tensor(s, requires_grad=True)
    logits, T = ot_logits(pp, tt, scale, normalize=False, return_plan=True)
    assert not T.requires_grad
    (w * logits).sum().backward()
    # T is a constant: d logit_bc / d sim_bcmn = s * T_bcmn
    grad_t = s * torch.einsum("bc,bcmn,bmd->ncd", w, T, p)
    grad_p = s * torch.einsum("bc,bcmn,ncd->bmd", w, T, t)
    assert torch.allclose(tt.grad, grad_t, rtol=1e-5, atol=1e-6)
    assert torch.allclose(pp.grad, grad_p, rtol=1e-5, atol=1e-6)
    sim = similarity(p, t, normalize=False)
    assert scale.grad.item() == pytest.approx(float((w * (T * sim).sum((-2, -1))).sum()), rel=1e-5)
    # the same logits with a differentiable plan give a different gradient: the check above can fail
    t2 = t.clone().requires_grad_()
    sim2 = similarity(p, t2, normalize=False)
    T2 = partial_ot_plan(1 - sim2)
    (w * (s * (T2 * sim2).sum((-2, -1)))).sum().backward()
    assert torch.allclose(T2.detach(), T, atol=1e-6)
    assert (t2.grad - grad_t).abs().max() > 1e-3


def test_gradient_through_normalisation():
    p, t = _features(8)
    tt = t.clone().requires_grad_()
    ot_logits(p, tt, 10.0).sum().backward()
    assert tt.grad is not None and torch.isfinite(tt.grad).all() and tt.grad.abs().max() > 0
    # normalising is idempotent: unit inputs give the same gradient with or without it
    tu = _unit(t).detach()
    a = tu.clone().requires_grad_()
    b = tu.clone().requires_grad_()
    ot_logits(_unit(p), a, 10.0).sum().backward()
    ot_logits(_unit(p), b, 10.0, normalize=False).sum().backward()
    # d/dt of normalize at a unit vector is the tangential projection
    proj = b.grad - (b.grad * tu).sum(-1, keepdim=True) * tu
    assert torch.allclose(a.grad, proj, atol=1e-5)


# --- batching, dtype, determinism ----------------------------------------------------------------


@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
def test_batched_equals_per_sample(OT):
    p, t = _features(9, b=5, m=12, c=6)
    logits, T = ot_logits(p, t, 100.0, ot=OT, return_plan=True)
    for b in range(5):
        lb, Tb = ot_logits(p[b : b + 1], t, 100.0, ot=OT, return_plan=True)
        assert torch.allclose(logits[b : b + 1], lb, rtol=1e-6, atol=1e-5)
        assert torch.allclose(T[b : b + 1], Tb, rtol=1e-6, atol=1e-9)
        for c in range(6):  # and per class
            lbc = ot_logits(p[b : b + 1], t[:, c : c + 1], 100.0, ot=OT)
            assert torch.allclose(logits[b, c], lbc[0, 0], rtol=1e-6, atol=1e-5)


def test_bf16_inputs_match_float32_up_to_rounding():
    p, t = _features(10, b=4, m=49, c=5, d=64)
    s = 100.0
    l32, T32 = ot_logits(p, t, s, return_plan=True)
    pb, tb = p.bfloat16(), t.bfloat16()
    l16, T16 = ot_logits(pb, tb, s, return_plan=True)
    assert l16.dtype == torch.float32 and T16.dtype == torch.float32
    # the OT runs in float32: bf16 inputs give exactly the float32 result of the rounded values
    assert torch.equal(l16, ot_logits(pb.float(), tb.float(), s))
    # and differ from the unrounded float32 result only by bf16 rounding (2^-8 relative)
    assert (l16 - l32).abs().max() < 1e-3 * s
    assert (T16 - T32).abs().max() < 1e-3
    assert torch.allclose(T16.sum((-2, -1)), torch.full((4, 5), 0.8), atol=1e-6)


def test_float32_under_autocast_and_fp16_underflow_safe():
    p, t = _features(11)
    ref = ot_logits(p, t, 100.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(ot_logits(p, t, 100.0), ref)
    # sim = -0.9: exp(-1.9 / 0.1) = 5.6e-9 underflows to 0 in fp16 (the reference's default
    # precision) but not in float32, where the plan here is computed
    e = torch.tensor([[1.0, 0.0]])
    patches = torch.cat([e, e]).unsqueeze(0).half()  # (1, 2, 2)
    texts = torch.tensor([[-0.9, math.sqrt(1 - 0.81)]]).half().expand(2, 1, 2)  # (N=2, C=1, 2)
    assert torch.exp(-(1 - torch.tensor(-0.9).half()) / 0.1).item() == 0.0
    logits, T = ot_logits(patches, texts, 100.0, return_plan=True)
    assert torch.isfinite(T).all() and torch.isfinite(logits).all()
    assert T.sum().item() == pytest.approx(0.8, abs=1e-6)


def test_deterministic():
    p, t = _features(12, b=3, m=20, c=4)
    a = ot_logits(p, t, 100.0, return_plan=True)
    b = ot_logits(p, t, 100.0, return_plan=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_errors():
    p, t = _features(13)
    with pytest.raises(ValueError):
        ot_logits(p, t, 1.0, ot="UOT")
    with pytest.raises(ValueError):
        partial_ot_plan(torch.zeros(3, 2), eps=0.0)
    with pytest.raises(ValueError):
        balanced_ot_plan(torch.zeros(3, 2), max_iter=0)
    with pytest.raises(ValueError):
        partial_ot_plan(torch.zeros(3, 2), top_percent=0.0)
    # eps too small for float32: exp(-2 / 0.01) underflows, the plan is NaN, and that is an error
    with pytest.raises(ConfigError, match="larger --method.eps"):
        ot_plan(torch.full((1, 1, 3, 2), -1.0), eps=0.01)


# --- host synchronisation: the loops read their stop state back only every few iterations ---------
#
# The solvers as they were when they read the stop state back after every iteration (bool(active.any())
# and err.item() < thresh), transcribed verbatim as the oracle: the loops that read it less often must
# give the same bits.


def _old_flatten_problems(cost, a, b):
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


def _old_balanced_ot_plan(cost, a=None, b=None, *, eps=0.1, max_iter=100, thresh=1e-3, per_problem_stop=True):
    with full_precision(cost.device):
        c_, a, b, lead = _old_flatten_problems(cost, a, b)
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
        T = (r.unsqueeze(-1) * c.unsqueeze(-2)) * K
        return T.reshape(*lead, m, n)


def _old_partial_ot_plan(
    cost, a=None, b=None, *, top_percent=0.8, eps=0.1, max_iter=100, thresh=1e-3, per_problem_stop=True
):
    with full_precision(cost.device):
        c_, a, b, lead = _old_flatten_problems(cost, a, b)
        p, m, n = c_.shape
        if b is None:
            mass = torch.clamp(a.sum(-1, keepdim=True), max=top_percent)
            b = torch.full((p, n), 1.0 / n, dtype=torch.float32, device=c_.device) * mass
        K = torch.exp(-c_ / eps)
        Kp = (1.0 / a).unsqueeze(-1) * K
        Kq = (1.0 / b).unsqueeze(-1) * K.transpose(-1, -2)
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


SOLVERS = {"COT": (partial_ot_plan, _old_partial_ot_plan), "Sinkhorn": (balanced_ot_plan, _old_balanced_ot_plan)}

# aten ops that read a tensor's values back to the host (item(), bool(), float(), tolist(), ...
# all end in _local_scalar_dense) or that must wait for the device to size their output
_SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.equal.default,
}


class _SyncCounter(TorchDispatchMode):
    """Counts host synchronisations (reads of device values) under it, at the dispatcher, so whatever
    Python spelling (bool, .item(), float, if tensor) reaches them."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _SYNC_OPS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def _syncs(fn, *args, **kwargs):
    with _SyncCounter() as counter:
        out = fn(*args, **kwargs)
    return out, counter.n


def _same_bits(x, y):
    """Bitwise equality (NaN payloads and the sign of zero included), not ==."""
    return x.shape == y.shape and x.dtype == y.dtype == torch.float32 and torch.equal(x.view(torch.int32), y.view(torch.int32))


def _reads(max_iter, check_every):
    """The loop's reads when it never stops: after the powers of two below check_every and its multiples,
    under max_iter; at most ceil(log2(check_every)) + floor((max_iter - 1) / check_every)."""
    powers = {2**k for k in range(64) if 2**k < min(check_every, max_iter)}
    multiples = set(range(check_every, max_iter, check_every))
    return len(powers | multiples)


def _random_problem(g):
    """A random batch of OT problems: cost (lead..., M, N), marginals or None, and solver settings."""
    lead = [(), (1,), (5,), (2, 3), (4, 6)][int(torch.randint(5, (1,), generator=g))]
    m = int(torch.randint(1, 13, (1,), generator=g))
    n = int(torch.randint(1, 4, (1,), generator=g))
    kind = int(torch.randint(4, (1,), generator=g))
    if kind == 0:  # 1 - cosine similarity, as FedOTP's
        d = 8
        base = torch.randn(d, generator=g)
        x = F.normalize(base + 0.8 * torch.randn(*lead, m, d, generator=g), dim=-1)
        y = F.normalize(base + 0.8 * torch.randn(*lead, n, d, generator=g), dim=-1)
        cost = 1 - x @ y.transpose(-1, -2)
    elif kind == 1:
        cost = 2 * torch.rand(*lead, m, n, generator=g)
    elif kind == 2:  # some problems constant (converge at once), the others not: staggered stops
        cost = 2 * torch.rand(*lead, m, n, generator=g)
        flat = cost.view(-1, m, n)
        flat[:: 2] = flat[:: 2, :1, :1].clone()
    else:  # wide costs: at small eps, exp(-cost/eps) underflows and the scalings go inf / NaN
        cost = 4 * torch.rand(*lead, m, n, generator=g) - 0.5
    if torch.rand(1, generator=g).item() < 0.3:
        a = torch.rand(*lead, m, generator=g) + 0.05
        a = a / a.sum(-1, keepdim=True)
        b = torch.rand(*lead, n, generator=g) + 0.05
        b = b / b.sum(-1, keepdim=True) * (0.5 + torch.rand(1, generator=g).item())
    else:
        a = b = None
    eps = [0.01, 0.05, 0.1, 0.3, 1.0, 3.0][int(torch.randint(6, (1,), generator=g))]
    thresh = [0.0, -1.0, 1e-7, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.7, 5.0, math.inf, math.nan][int(torch.randint(12, (1,), generator=g))]
    max_iter = [1, 2, 3, 5, 8, 16, 17, 33, 100, 150][int(torch.randint(10, (1,), generator=g))]
    top_percent = [0.3, 0.8, 1.0, 1.7][int(torch.randint(4, (1,), generator=g))]
    return cost, a, b, dict(eps=eps, thresh=thresh, max_iter=max_iter), top_percent


@pytest.mark.parametrize("per_problem_stop", [True, False])
@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
@pytest.mark.slow  # 60 random problems per case x seven check intervals: the sweep
def test_sparse_stop_checks_bitwise_equal_to_per_iteration_checks(OT, per_problem_stop):
    new, old = SOLVERS[OT]
    g = torch.Generator().manual_seed(100 + 2 * (OT == "COT") + per_problem_stop)
    ran = []  # (iterations the old loop ran, max_iter)
    for _ in range(60):
        cost, a, b, kw, tp = _random_problem(g)
        kw["per_problem_stop"] = per_problem_stop
        extra = dict(top_percent=tp) if OT == "COT" else {}
        ref, n_old = _syncs(old, cost, a, b, **kw, **extra)  # the old loop reads once per iteration run
        ran.append((n_old, kw["max_iter"]))
        for check_every in (None, 1, 2, 3, 7, 16, 1000):
            T = new(cost, a, b, **kw, **extra, check_every=check_every)
            assert _same_bits(T, ref), (kw, check_every)
    # the cases cover a stop at the first iteration, early and late stops, and no stop
    assert any(n == 1 < mi for n, mi in ran)
    assert any(1 < n < mi // 2 for n, mi in ran) and any(mi // 2 <= n < mi for n, mi in ran)
    assert any(n == mi >= 16 for n, mi in ran)


@pytest.mark.parametrize("per_problem_stop", [True, False])
@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
@pytest.mark.slow  # every check interval around the stopping iteration
def test_stop_between_checks_keeps_the_stopping_iterate(OT, per_problem_stop):
    # Around the reference's stopping iteration s: max_iter s - 1, s, s + 1 and every check period,
    # so the stop falls on, before and after a check, and the state kept is the one of iteration s
    # (updated in s, as the reference breaks after its update).
    new, old = SOLVERS[OT]
    p, t = _features(20, b=4, m=9, c=5)
    cost = 1 - similarity(p, t)
    for thresh in (1e-2, 1e-3, 1e-4):
        _, s = _syncs(old, cost, thresh=thresh, per_problem_stop=per_problem_stop, max_iter=1000)
        assert 3 < s < 1000
        for max_iter in (s - 1, s, s + 1, 2 * s):
            kw = dict(thresh=thresh, per_problem_stop=per_problem_stop, max_iter=max_iter)
            ref = old(cost, **kw)
            for check_every in range(1, s + 3):
                assert _same_bits(new(cost, **kw, check_every=check_every), ref), (thresh, max_iter, check_every)


def test_batch_stop_is_the_reference_double_comparison():
    # The reference compares err.item() (float32 read as a double) with the double thresh. A device-side
    # err < thresh rounds thresh to float32 first: for thresh = 0.7, float32(0.7) < 0.7, so err = float32(0.7)
    # stops the reference but not `err < 0.7` on the device. The bound used instead agrees for every float32.
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    x = torch.tensor(f32(0.7))
    assert x.item() < 0.7 and not bool(x < 0.7)
    bound = fedotp_math._float32_lt_bound
    tiny = 2.0**-149
    threshes = [0.7, 1e-3, 0.1, 1 / 3, 1.0, 0.0, -0.0, -1e-3, -0.7, 1e-45, 1e-50, -1e-50, tiny, 3 * tiny,
                3.4028234663852886e38, 3.4028235e38, 3.5e38, 1e39, -1e39, math.inf, -math.inf, math.nan, 2, 0]
    for thresh in threshes:
        t = torch.tensor(float(thresh), dtype=torch.float64).float()
        near = torch.stack([t] + [torch.nextafter(t, torch.tensor(d)) for d in (math.inf, -math.inf)])
        near = torch.cat([near, torch.nextafter(near, torch.tensor(math.inf)), torch.nextafter(near, torch.tensor(-math.inf)),
                          torch.tensor([0.0, -0.0, tiny, -tiny, 1.0, -1.0, math.inf, -math.inf, math.nan])])
        lhs = near < bound(thresh)
        assert lhs.tolist() == [v < thresh for v in near.tolist()], thresh
    # and in the solvers: thresh just above (in double) the float32 error of iteration k, so
    # float32(thresh) == err_k: the reference stops at k, a float32 device-side comparison would not
    cost = 1 - similarity(*_features(23, b=2, m=6, c=3))
    for OT, (new, old) in SOLVERS.items():
        k = 6
        errs = _batch_errors(OT, cost, k)
        assert all(e1 > e2 for e1, e2 in zip(errs, errs[1:]))  # decreasing: iteration k is the first below
        thresh = math.nextafter(errs[-1], math.inf)
        assert f32(thresh) == errs[-1] < thresh
        kw = dict(thresh=thresh, max_iter=50, per_problem_stop=False)
        ref, n_old = _syncs(old, cost, **kw)
        assert n_old == k
        assert not _same_bits(ref, old(cost, **{**kw, "max_iter": k + 1, "thresh": 0.0}))  # the stop matters
        for check_every in (1, 2, 5, 16):
            assert _same_bits(new(cost, **kw, check_every=check_every), ref)


def _batch_errors(OT, cost, n):
    """The reference's batch-wide errors err.item() of iterations 1..n (default marginals), the same ops."""
    with full_precision(cost.device):
        c_ = cost.float().reshape(-1, *cost.shape[-2:])
        p, m, n_ = c_.shape
        a = torch.full((p, m), 1.0 / m)
        K = torch.exp(-c_ / 0.1)
        errs = []
        if OT == "Sinkhorn":
            b = torch.full((p, n_), 1.0 / n_)
            r, c = torch.ones_like(a), torch.ones_like(b)
            for _ in range(n):
                r0 = r
                r = a / torch.matmul(K, c.unsqueeze(-1)).squeeze(-1)
                c = b / torch.matmul(K.transpose(-1, -2), r.unsqueeze(-1)).squeeze(-1)
                errs.append((r - r0).abs().mean().item())
        else:
            b = torch.full((p, n_), 1.0 / n_) * torch.clamp(a.sum(-1, keepdim=True), max=0.8)
            Kp = (1.0 / a).unsqueeze(-1) * K
            Kq = (1.0 / b).unsqueeze(-1) * K.transpose(-1, -2)
            u = ones_m = torch.ones_like(a)
            v = torch.ones_like(b)
            for _ in range(n):
                v0 = v
                u = torch.minimum(1.0 / torch.matmul(Kp, v.unsqueeze(-1)).squeeze(-1), ones_m)
                v = 1.0 / torch.matmul(Kq, u.unsqueeze(-1)).squeeze(-1)
                errs.append((v - v0).abs().mean().item())
        return errs


@pytest.mark.parametrize("per_problem_stop", [True, False])
@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
def test_host_syncs_per_call(OT, per_problem_stop):
    new, old = SOLVERS[OT]
    p, t = _features(21, b=3, m=10, c=4)
    cost = 1 - similarity(p, t)
    for max_iter in (1, 2, 7, 16, 17, 100):
        kw = dict(thresh=0.0, max_iter=max_iter, per_problem_stop=per_problem_stop)  # never stops: the worst case
        ref, n_old = _syncs(old, cost, **kw)
        assert n_old == max_iter  # before: one read per iteration
        for check_every in (1, 2, 4, 10, 16):
            T, n = _syncs(new, cost, **kw, check_every=check_every)
            assert _same_bits(T, ref)
            assert n == _reads(max_iter, check_every) <= max_iter - 1
            assert n <= math.ceil(math.log2(check_every)) + (max_iter - 1) // check_every
    # the defaults (max_iter 100, check_every 16 off the CPU: pretend the CPU syncs): 10 reads instead of 100
    # in the loop, and ot_plan adds one for its finiteness check
    kw = dict(thresh=0.0, per_problem_stop=per_problem_stop)
    _, n_old = _syncs(old, cost, **kw)
    _, n_cpu = _syncs(new, cost, **kw)
    assert (n_old, n_cpu) == (100, 99)  # on the CPU, where a read costs nothing, the default reads every iteration
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedotp_math, "_NO_SYNC_DEVICES", frozenset())
        _, n = _syncs(new, cost, **kw)
        assert n == _reads(100, fedotp_math.CHECK_EVERY) == 10
        T, n_plan = _syncs(ot_plan, 1 - cost, ot=OT, **kw)
        assert n_plan == 11 and _same_bits(T, old(cost, **kw, **({"top_percent": 0.8} if OT == "COT" else {})))
        # an early stop leaves the loop at the next check: at the default thresh it reads a few times only
        _, n_early = _syncs(ot_plan, 1 - cost, ot=OT, per_problem_stop=per_problem_stop)
        _, n_early_old = _syncs(old, cost, per_problem_stop=per_problem_stop)
        assert n_early <= min(n_early_old, 11)


def test_check_every_default_and_errors():
    cost = torch.rand(2, 5, 2)
    assert fedotp_math._resolve_check_every(None, cost) == 1  # CPU
    assert fedotp_math._resolve_check_every(None, torch.empty(2, 5, 2, device="meta")) == fedotp_math.CHECK_EVERY
    assert fedotp_math._resolve_check_every(3, cost) == 3
    # while autograd records through the cost: a read every iteration, so the graph is the plain loop's
    grad_cost = torch.empty(2, 5, 2, device="meta", requires_grad=True)
    assert fedotp_math._resolve_check_every(None, grad_cost) == 1
    with torch.no_grad():
        assert fedotp_math._resolve_check_every(None, grad_cost) == fedotp_math.CHECK_EVERY
    for solver in (balanced_ot_plan, partial_ot_plan):
        with pytest.raises(ValueError):
            solver(cost, check_every=0)
    checks = [it for it in range(1, 101) if fedotp_math._is_check(it, 16, 100)]
    assert checks == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96]
    assert [it for it in range(1, 31) if fedotp_math._is_check(it, 10, 31)] == [1, 2, 4, 8, 10, 20, 30]


@pytest.mark.parametrize("OT", ["COT", "Sinkhorn"])
def test_gradient_unchanged_by_default(OT):
    # with autograd recording, the default reads every iteration: the same graph, the same gradient bits
    new, old = SOLVERS[OT]
    w = torch.randn(3, 4, 10, 2, generator=torch.Generator().manual_seed(22))
    p, t = _features(22, b=3, m=10, c=4)
    for per_problem_stop in (True, False):
        grads = []
        for solver in (new, old):
            cost = (1 - similarity(p, t)).requires_grad_()
            (w * solver(cost, per_problem_stop=per_problem_stop)).sum().backward()
            grads.append(cost.grad)
        assert _same_bits(*grads)
