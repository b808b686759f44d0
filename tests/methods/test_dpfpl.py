"""DP-FPL against its original's functions (linhhtran/DP-FPL @ cce74b479525c6f3fc16586e54c93669c72c63c0,
trainers/DP_FPL.py): the factorisation, the rebuilt gradient, the clipped and noised factor gradients, the hook that
applies them, and a run through fedur's round loop on the tiny model."""

import numpy as np
import pytest
import torch

from fedur.app.cli import parse_config
from fedur.federated.client import ClientState
from fedur.methods import DPFPL, LocalStep
from fedur.methods.dpfpl import factorize, orthonormal_columns, privatised, rebuilt_gradient
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP

# ------------------------------------------------- the original's functions, verbatim (trainers/DP_FPL.py)

def orthogonalize(matrix):  # DP_FPL.py:40-49
    m = matrix.shape[1]
    for i in range(m):
        # Normalize the i'th column
        col = matrix[:, i : i + 1]
        col /= torch.sqrt(torch.sum(col ** 2))
        # Project it on the rest and remove it
        if i + 1 < m:
            rest = matrix[:, i + 1 :]
            rest -= torch.sum(col * rest, dim=0) * col


def factorize_ctx(origin, rank):  # DP_FPL.py:51-66
    if torch.cuda.is_available():
        device = torch.device('cuda:0')
    else:
        device = torch.device('cpu')

    with torch.no_grad():
        v = torch.normal(0, 1, size=(origin.shape[1], rank)).type(origin.dtype) # [ctx_dim, rank]
        u = torch.matmul(origin.to(device), v.to(device)) # [n_ctx, rank]
        orthogonalize(u)
        v = torch.matmul(origin.t().to(device), u.to(device)) # [ctx_dim, rank]
        orthogonalize(v)
        v = v.t() # [rank, ctx_dim]
        residual = origin.to(device) - torch.matmul(u.to(device), v.to(device)) # [n_ctx, ctx_dim]

    return (u, v, residual)


def compute_full_grad(left, right, dtype):  # DP_FPL.py:68-76
        left_w, left_g = left.data.type(dtype), left.grad.type(dtype) / 10.0
        right_w, right_g = right.data.type(dtype), right.grad.type(dtype) / 10.0

        left_g_right_w = torch.matmul(left_g, right_w)
        m1 = left_g_right_w + torch.matmul(left_w, right_g)
        m2 = torch.matmul(left_w, torch.matmul(left_w.T, left_g_right_w))

        return m1 + m2


# ------------------------------------------------- the math

def test_a_hand_written_rank_one_prompt_and_both_gradients():
    """L = [[1, 0, 0], [0, 0, 0]], Omega = 1: U = e1, V = e1^T, so P_U = diag(1, 0), P_V = diag(1, 0, 0)."""
    prompt = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    u, v = factorize(prompt, torch.ones(3, 1, dtype=torch.float64))
    assert torch.equal(u, torch.tensor([[1.0], [0.0]], dtype=torch.float64))
    assert torch.equal(v, torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    grad = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    grad_u, grad_v = grad @ v.t(), u.t() @ grad
    # P_U G + G P_V - P_U G P_V: the first row and the first column of G
    expected = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(rebuilt_gradient(u, v, grad_u, grad_v, "projection"), expected)
    # (P_U G + G P_V + P_U G P_V) / 10: the corner counted three times
    expected = torch.tensor([[0.3, 0.2, 0.3], [0.4, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(rebuilt_gradient(u, v, grad_u, grad_v, "reference"), expected)


def test_gram_schmidt_is_the_originals_in_place_one():
    matrix = torch.tensor([[3.0, 1.0, 2.0], [4.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 5.0]], dtype=torch.float64)
    expected = matrix.clone()
    orthogonalize(expected)
    out = orthonormal_columns(matrix)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.t() @ out, torch.eye(3, dtype=torch.float64))
    assert torch.equal(matrix[0], torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64))  # on a copy


@pytest.mark.parametrize("shape, rank", [((16, 512), 8), ((4, 32), 2), ((4, 32), 4)])
def test_factorize_is_the_originals_and_its_residual_restores_the_prompt(shape, rank):
    """The same test matrix into both (the original draws it from torch's global generator): the same U and V;
    U V + residual is the prompt, so the original's global + U V + residual is fedur's global + local."""
    prompt = 0.02 * torch.randn(shape, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(11)
    ref_u, ref_v, residual = factorize_ctx(prompt.clone(), rank)
    torch.manual_seed(11)
    test = torch.normal(0, 1, size=(shape[1], rank))
    u, v = factorize(prompt, test)
    torch.testing.assert_close(u, ref_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, ref_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(u @ v + residual, prompt, rtol=0, atol=1e-7)
    torch.testing.assert_close(u.t() @ u, torch.eye(rank), rtol=0, atol=1e-5)
    torch.testing.assert_close(v @ v.t(), torch.eye(rank), rtol=0, atol=1e-5)


def test_the_reference_gradient_is_compute_full_grad_of_any_factor_gradients():
    """Noised factor gradients are not G V^T and U^T G: the reference rebuild must still be the original's."""
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randn(6, 20, generator=generator, dtype=torch.float64)
    u, v = factorize(prompt, torch.randn(20, 3, generator=generator, dtype=torch.float64))
    grad_u = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    grad_v = torch.randn(3, 20, generator=generator, dtype=torch.float64)
    left, right = torch.nn.Parameter(u.clone()), torch.nn.Parameter(v.clone())
    left.grad, right.grad = grad_u.clone(), grad_v.clone()
    torch.testing.assert_close(rebuilt_gradient(u, v, grad_u, grad_v, "reference"), compute_full_grad(left, right, torch.float64))
    # and, from the factors of G itself, the projections the docstring names
    grad = torch.randn(6, 20, generator=generator, dtype=torch.float64)
    p_u, p_v = u @ u.t(), v.t() @ v
    torch.testing.assert_close(rebuilt_gradient(u, v, grad @ v.t(), u.t() @ grad, "reference"),
                               (grad @ p_v + p_u @ grad + p_u @ grad @ p_v) / 10)
    torch.testing.assert_close(rebuilt_gradient(u, v, grad @ v.t(), u.t() @ grad, "projection"),
                               p_u @ grad + grad @ p_v - p_u @ grad @ p_v)


def test_the_factor_gradients_are_clipped_then_noised_at_z_times_the_clip():
    generator = torch.Generator().manual_seed(0)
    large = torch.tensor([[12.0, 16.0]])  # norm 20 -> 10
    torch.testing.assert_close(privatised(large, 10.0, 0.0, generator), torch.tensor([[6.0, 8.0]]))
    small = torch.tensor([[3.0, 4.0]])  # norm 5: kept
    torch.testing.assert_close(privatised(small, 10.0, 0.0, generator), small)
    torch.testing.assert_close(privatised(torch.zeros(2, 2), 10.0, 0.0, generator), torch.zeros(2, 2))  # no 0/0
    noised = privatised(torch.zeros(400, 500), 3.0, 2.0, generator)  # 200,000 draws of N(0, 6^2)
    assert abs(float(noised.std()) - 6.0) < 0.03 and abs(float(noised.mean())) < 0.03
    clipped_and_noised = privatised(torch.full((400, 500), 1.0), 3.0, 2.0, generator) - 3.0 / np.sqrt(400 * 500)
    assert abs(float(clipped_and_noised.mean())) < 0.03 and abs(float(clipped_and_noised.std()) - 6.0) < 0.03


# ------------------------------------------------- the hook

def stepped(method: DPFPL, prompt: torch.Tensor, grad: torch.Tensor, client_id: int = 0, step: int = 0,
            round_idx: int | None = 3) -> torch.Tensor:
    """The local prompt's gradient after `method.before_step` on one step of a client holding run.seed 5."""
    local = prompt.clone().requires_grad_()
    local.grad = grad.clone()
    extra = {"noise_seed": torch.tensor(5)}
    client = ClientState(client_id, np.arange(2), np.arange(2), {"local_ctx": prompt}, extra=extra)
    optimizer = torch.optim.SGD([local], lr=0.1)
    method.before_step(LocalStep(client, {"local_ctx": local}, ("text_ctx", "local_ctx"), step, 0, 0.1, optimizer,
                                 0 if round_idx is None else round_idx))
    return local.grad


def test_projection_without_noise_keeps_a_gradient_the_factors_span():
    """local_ctx of rank <= r: U V is the prompt, and a G in the tangent space at it (A V + U B) comes back whole;
    with r >= n_ctx (U U^T = I) every G does."""
    generator = torch.Generator().manual_seed(4)
    left, right = torch.randn(6, 2, generator=generator), torch.randn(2, 24, generator=generator)
    prompt = left @ right  # rank 2
    tangent = torch.randn(6, 2, generator=generator) @ right + left @ torch.randn(2, 24, generator=generator)
    method = DPFPL(rank=2, local_noise=0.0, gradient="projection")
    torch.testing.assert_close(stepped(method, prompt, tangent), tangent, rtol=1e-4, atol=1e-5)
    other = torch.randn(6, 24, generator=generator)
    assert not torch.allclose(stepped(method, prompt, other), other, atol=1e-3)  # outside: projected
    full = torch.randn(6, 24, generator=generator)
    torch.testing.assert_close(stepped(DPFPL(rank=6, local_noise=0.0, gradient="projection"), full, other), other,
                               rtol=1e-4, atol=1e-5)


def test_a_rank_above_n_ctx_is_read_as_n_ctx():
    generator = torch.Generator().manual_seed(5)
    prompt, grad = torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)
    for noise in (0.0, 1.0):
        torch.testing.assert_close(stepped(DPFPL(rank=8, local_noise=noise), prompt, grad),
                                   stepped(DPFPL(rank=4, local_noise=noise), prompt, grad))


def test_the_hooks_draws_are_the_clients_own_for_each_round_and_step():
    """The test matrix and the noise come from (run.seed, client, round, step): the same step again draws the same;
    another client, round or step draws others; the noise changes the gradient; before the first download, round 0."""
    generator = torch.Generator().manual_seed(6)
    prompt, grad = 0.02 * torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)
    noised = DPFPL(rank=2, local_noise=1.0)
    first = stepped(noised, prompt, grad)
    assert torch.equal(first, stepped(noised, prompt, grad))
    for other in (dict(client_id=1), dict(step=1), dict(round_idx=4)):
        assert not torch.equal(first, stepped(noised, prompt, grad, **other)), other
    assert torch.equal(stepped(noised, prompt, grad, round_idx=None), stepped(noised, prompt, grad, round_idx=0))
    plain = stepped(DPFPL(rank=2, local_noise=0.0), prompt, grad)
    assert float((first - plain).norm()) > 10 * float(plain.norm())  # z 1 x clip 10 swamps a gradient of norm ~4 / 10
    u, v = factorize(prompt, torch.randn(16, 2, generator=torch.Generator().manual_seed(0)))
    assert plain.shape == grad.shape and u.shape == (4, 2) and v.shape == (2, 16)


def test_the_client_classifies_with_global_plus_local_the_originals_global_plus_uv_plus_residual(tiny_clip):
    method = DPFPL(rank=2)
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 4, 0, None, 0.02, seed=2)
    pieces = initial_values(method.pieces(), model, 2)
    assert [name for name, piece in method.pieces().items() if piece.shared] == ["text_ctx"]
    assert pieces["local_ctx"].shape == pieces["text_ctx"].shape and not torch.equal(pieces["local_ctx"], pieces["text_ctx"])
    u, v, residual = factorize_ctx(pieces["local_ctx"].clone(), 2)
    with torch.no_grad():
        torch.testing.assert_close(method.text_side(model, pieces), model.text_features(pieces["text_ctx"] + u @ v + residual))
    assert method.weighting == "uniform" and type(method.default_labeller()).__name__ == "FPL"


# ------------------------------------------------- the round loop

def test_dpfpl_runs_through_the_round_loop(tmp_path):
    """One round of the tiny run: the global prompt averaged and downloaded by every client, each local prompt its
    own, the round and the run's secret seed (local noise on: nobody with config.yaml can replay the noise) kept with
    each client (checkpointed) for its next steps' streams."""
    from fedur.app.run import run

    cfg = parse_config(["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--federation.local_epochs", "1",
                        "--run.progress", "false", "--run.output_dir", str(tmp_path), "--method", "DPFPL",
                        "--method.rank", "2", "--method.local_noise", "1"])
    result = run(cfg)
    clients = result.clients
    assert all(torch.equal(c.pieces["text_ctx"], clients[0].pieces["text_ctx"]) for c in clients)
    start = initial_values(DPFPL().pieces(), result.host.model, cfg.run.seed)["local_ctx"]
    locals_ = [c.pieces["local_ctx"] for c in clients]
    assert all(not torch.equal(a, start) for a in locals_) and not torch.equal(locals_[0], locals_[1])
    secret = result.host.secret_seed
    assert secret is not None and secret != cfg.run.seed  # drawn from the operating system's randomness
    assert all(int(c.extra["round"]) == 1 and int(c.extra["noise_seed"]) == secret for c in clients)
    assert int(torch.load(tmp_path / "checkpoints" / "round_00001" / "global.pt", weights_only=True)["secret_seed"]) == secret
    saved = torch.load(tmp_path / "prompts" / "client_001.pt", weights_only=True)
    assert torch.equal(saved["local_ctx"], locals_[1]) and int(saved["round"]) == 1


# ------------------------------------------------- the hook against the original's autograd path

def the_originals_local_gradient(global_ctx, local_ctx, loss_of, rank, std, rng_state):
    """The local prompt's gradient as the original computes it in one step, with torch's global generator in
    `rng_state`: `PromptLearner.forward` (DP_FPL.py:166-172: U, V and the residual from `factorize_ctx`, U and V set
    as the parameters' data, the context global + U V + residual), the backward of the loss (L266-270), U's and V's
    gradients clipped to NORM_THRESH 10 and noised with N(0, std^2) when noise is on (L294-310, verbatim), and
    `compute_full_grad` of them (L312-315)."""
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng_state)
        u, v, residual = factorize_ctx(local_ctx.detach().clone(), rank)
        param_dict = {"prompt_learner.local_u_ctx": torch.nn.Parameter(u), "prompt_learner.local_v_ctx": torch.nn.Parameter(v)}
        left, right = param_dict["prompt_learner.local_u_ctx"], param_dict["prompt_learner.local_v_ctx"]
        loss_of(global_ctx + torch.matmul(left, right) + residual).backward()
        if std > 0:
            NORM_THRESH = 10.0  # noqa: N806  the original's cfg.NORM_THRESH
            grad = param_dict['prompt_learner.local_u_ctx'].grad.data
            norm = grad.norm(2)
            if norm > NORM_THRESH:
                scale = NORM_THRESH / norm
                scale[scale>1] = 1
                param_dict['prompt_learner.local_u_ctx'].grad *= scale
            noise = torch.normal(0, std, size=grad.shape, device=grad.device)
            param_dict['prompt_learner.local_u_ctx'].grad += noise
            grad = param_dict['prompt_learner.local_v_ctx'].grad.data
            norm = grad.norm(2)
            if norm > NORM_THRESH:
                scale = NORM_THRESH / norm
                scale[scale>1] = 1
                param_dict['prompt_learner.local_v_ctx'].grad *= scale
            noise = torch.normal(0, std, size=grad.shape, device=grad.device)
            param_dict['prompt_learner.local_v_ctx'].grad += noise
        return compute_full_grad(left, right, torch.float32)


@pytest.mark.parametrize("shape, rank, local_noise", [((4, 32), 2, 0.0), ((4, 32), 2, 1.0), ((16, 64), 8, 0.0),
                                                      ((16, 64), 8, 0.5)])
def test_before_step_is_the_originals_autograd_path_for_u_and_v(shape, rank, local_noise):
    """fedur trains global + local and rebuilds local's gradient G in `before_step` (g_U = G V^T, g_V = U^T G, then
    clipped, noised and recombined); the original trains global + U V + residual and reads U's and V's gradients from
    autograd. With the original's draws taken from the step's stream (its test matrix, then U's noise, then V's, the
    order of both), the two give the local prompt the same gradient, in float32 as the original's PREC "fp32": within
    4 float32 epsilons of the largest entry (measured: 1.5e-8 to 3.0e-7, at largest entries 0.057 to 2.3)."""
    from fedur.federated.streams import step_generator

    generator = torch.Generator().manual_seed(31)
    n_ctx, width = shape
    global_ctx, local_ctx = 0.02 * torch.randn(shape, generator=generator), 0.02 * torch.randn(shape, generator=generator)
    classes, projection = torch.randn(5, n_ctx, width, generator=generator), torch.randn(width, 8, generator=generator)
    images, labels = torch.nn.functional.normalize(torch.randn(6, 8, generator=generator), dim=-1), torch.tensor([0, 1, 2, 3, 4, 0])

    def loss_of(context):  # (n_ctx, width) -> a stand-in text tower's cross-entropy
        features = torch.nn.functional.normalize(torch.tanh(context + classes).mean(dim=1) @ projection, dim=-1)  # (5, 8)
        return torch.nn.functional.cross_entropy(30 * images @ features.t(), labels)

    local = local_ctx.clone().requires_grad_()
    loss_of(global_ctx + local).backward()
    ours = stepped(DPFPL(rank=rank, local_noise=local_noise), local_ctx, local.grad, client_id=2, step=7)
    state = step_generator(5, 2, 3, 7).get_state()  # stepped's client: run.seed 5, client 2, round 3, step 7
    theirs = the_originals_local_gradient(global_ctx, local_ctx, loss_of, rank, local_noise * 10.0, state)
    error = float((ours - theirs).abs().max())
    largest = float(theirs.abs().max())
    assert error <= 4 * torch.finfo(torch.float32).eps * largest, (error, largest)  # float32 rounding: 1.5e-8 to 3.0e-7
    assert float(theirs.abs().max()) > 1e-4  # a gradient, not zeros
