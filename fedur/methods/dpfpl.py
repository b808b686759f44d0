"""DP-FPL (Tran et al., ICLR 2025, "Privacy-preserving personalized federated prompt learning for multimodal large
language models"): a global text prompt, averaged by the server, plus a full personal local prompt each client keeps;
a client classifies with their sum. Every local step the local prompt's gradient G is replaced by one built from a
low-rank factorisation of the prompt, whose factors' gradients are clipped and noised (the method's local privacy):

    U, V = factorize(L, Omega)   Omega (width, r) ~ N(0, 1) drawn afresh, one power iteration with Gram-Schmidt
    g_U = G V^T,  g_V = U^T G    each clipped to local_clip (L2), + N(0, (local_noise x local_clip)^2)
    reference:  G <- (g_U/10) V + U (g_V/10) + U U^T (g_U/10) V     (the original's compute_full_grad)
    projection: G <- g_U V + U g_V - U U^T g_U V                      (the tangent-space projection P_U G + G P_V - P_U G P_V)

The original's client context, global + U V + residual with the residual L - U V, is global + L exactly: the
factorisation changes only which gradient reaches L, never the forward value (tested), so here the context is
text_ctx + local_ctx.

Read from linhhtran/DP-FPL @ cce74b479525c6f3fc16586e54c93669c72c63c0: trainers/DP_FPL.py (orthogonalize L40-49,
factorize_ctx L51-66, compute_full_grad L68-76, the prompts L105-172, the clipping and noise L252-315),
federated_main.py L116-200 (the round), with 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f (client_dpfpl.py,
server_dpfpl.py) as a cross-check. Its global noise is not here: fedur's `privacy:` settings (docs/privacy.md,
fedur/privacy/) clip and noise every method's shared pieces with an accountant; privacy.mode central is DP-FPL's
server-side noise on the average, calibrated and accounted, and local puts the noise on each upload.
Where fedur differs, deliberately (docs/reference-parity.md#dp-fpl has each with its switch):
- FedAvg of the global prompt once per round, not its gradients averaged every batch: fedur's rounds are local
  epochs (FLiP's port does the same);
- each client its own SGD and its own local prompt: the original steps every client's local prompt with the last
  client's gradient and keeps one step per round of each (bugs);
- no closed-form sigma from epsilon: it counts rounds, not the batch steps it noises, assumes per-sample clipping it
  does not do and makes the server noise B times too small, and no accountant checks it; `local_noise` is a noise
  multiplier, and the global prompt's privacy is the accounted `privacy:` group's;
- FLiP's port runs none of this: `args.optim_rounds` and `self.dtype` are undefined, it loads client states before
  it has kept any, an `elif` skips the U/V noise whenever the global gradient is clipped, it has no global noise, and
  it averages the local prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.errors import PluginError
from fedur.federated.client import ClientState
from fedur.federated.streams import step_generator
from fedur.labels import FPL, Labeller
from fedur.methods.base import Aggregated, ClientData, GlobalModel, GlobalView, LocalStep, Method, ServerRound
from fedur.methods.pieces import Piece, local_text_context, text_context
from fedur.model.precision import full_precision

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

SEED, ROUND = "noise_seed", "round"  # client.extra: its streams' seed (after_refresh) and the round it trains (download)


class DPFPL(Method):
    """DP-FPL: a global text prompt (averaged) plus a personal local prompt whose gradient is rebuilt from a noised
    low-rank factorisation; FPL pseudo-labels."""

    key = "dpfpl"
    label = "DP-FPL"
    preset = "dpfpl"
    stale_inputs = ("the mean of a step's staleness-weighted arrivals, as FedAvg's; the step count its server keeps "
                    "counts the server's steps; its local noise's streams follow each client's own rounds")

    def __init__(self, rank: PositiveInt = 8, local_clip: PositiveFloat = 10.0, local_noise: NonNegativeFloat = 0.0,
                 gradient: Literal["reference", "projection"] = "reference",
                 weighting: Literal["selected", "data", "uniform"] = "uniform", **kwargs) -> None:
        """
        Args:
            rank: Rank r of the local prompt's factorisation (the published 8). Read as min(r, n_ctx): U (n_ctx x r)
                has orthonormal columns, so it has no more than n_ctx to give (the original's Gram-Schmidt would
                normalise round-off columns, as FLiP's default n_ctx 4 with rank 8 does); at n_ctx, U U^T = I and
                'projection' passes the gradient whole.
            local_clip: L2 bound of each factor's gradient, g_U and g_V apart (the original's NORM_THRESH, 10).
            local_noise: Noise multiplier z_l: N(0, (z_l x local_clip)^2) on each factor's clipped gradient every step;
                0 clips and noises nothing, the original's default (--noise 0). Not accounted: the local prompt is
                never released; the original's ε 0.4 / 0.2 / 0.1 at its published settings give z_l 2.65 / 5.30 / 10.6.
            gradient: The local prompt's gradient from its factors' ('reference': the original's compute_full_grad,
                (G P_V + P_U G + P_U G P_V) / 10 without noise; 'projection': P_U G + G P_V - P_U G P_V, the
                tangent space of the rank-r matrices at U V).
            weighting: The server's weight of each client in the average of the global prompt: the same for every
                client ('uniform', the original's unweighted mean), its selected pseudo-labels ('selected') or its
                train images ('data', FLiP's).
        """
        super().__init__(weighting=weighting, **kwargs)
        self.rank, self.local_clip, self.local_noise = int(rank), float(local_clip), float(local_noise)
        self.gradient = gradient

    def pieces(self) -> dict[str, Piece]:
        return {"text_ctx": text_context(shared=True), "local_ctx": local_text_context()}  # global, local: N(0, 0.02^2)

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """(C, D) the class features of global + local (the original's global + U V + residual)."""
        return model.text_features(pieces["text_ctx"] + pieces["local_ctx"])

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The global prompt alone, the local prompt at zero [guess: the original tests personal models only]."""
        return GlobalModel({**view.shared, "local_ctx": torch.zeros_like(view.start["local_ctx"])})

    @property
    def draws_secret_noise(self) -> bool:
        return self.local_noise > 0

    def after_refresh(self, client: ClientState, data: ClientData) -> None:
        """Keep the seed of its steps' streams with the client (every client, also a new one, is pseudo-labelled before
        it trains): the run's secret seed where it noises (nobody with config.yaml can replay the noise), else
        run.seed (its test matrices only)."""
        seed = data.secret_seed if self.draws_secret_noise else data.model.seed
        if seed is None:
            raise PluginError("DPFPL.after_refresh: local_noise > 0 and the run has no secret seed")  # internal: fit draws one
        client.extra = {**client.extra, SEED: torch.tensor(seed, device="cpu")}

    def aggregate(self, round: ServerRound) -> Aggregated:
        """FedAvg of the global prompt; the server's state counts the rounds done (each client's next round)."""
        return Aggregated(super().aggregate(round).shared, {**round.state, ROUND: torch.tensor(round.number, device="cpu")})

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        super().download(client, shared, state)
        if ROUND in state:  # (a round that kept the global state before any aggregation has none)
            client.extra = {**client.extra, ROUND: state[ROUND]}

    def before_step(self, step: LocalStep) -> None:
        """The local prompt's gradient rebuilt from its factors' (clipped and noised where local_noise > 0), every draw
        from the client's stream of this step (the same whichever rank hosts it)."""
        if "local_ctx" not in step.trained:
            return
        extra = step.client.extra
        if SEED not in extra:
            raise PluginError("DPFPL.before_step: the client holds no run seed; its after_refresh keeps it")
        generator = step_generator(int(extra[SEED]), step.client.client_id, step.round_idx, step.step)
        prompt = step.pieces["local_ctx"]
        n_ctx, width = prompt.shape
        rank = min(self.rank, n_ctx)
        test = torch.randn(width, rank, generator=generator, device="cpu").to(prompt.device)  # Omega, first: the same at any noise
        with torch.no_grad(), full_precision(prompt.device):
            u, v = factorize(prompt.detach().float(), test)
            grad = prompt.grad.float()
            grad_u, grad_v = grad @ v.t(), u.t() @ grad  # (n_ctx, r), (r, width): d loss / dU, d loss / dV at U V
            if self.local_noise > 0:
                grad_u = privatised(grad_u, self.local_clip, self.local_noise, generator)
                grad_v = privatised(grad_v, self.local_clip, self.local_noise, generator)
            prompt.grad = rebuilt_gradient(u, v, grad_u, grad_v, self.gradient).to(prompt.grad.dtype)


def orthonormal_columns(matrix: Tensor) -> Tensor:
    """(m, r) orthonormal columns spanning `matrix`'s, by Gram-Schmidt from the first on: each column normalised,
    then removed from every later one (the original's in-place `orthogonalize`, DP_FPL.py:40-49, on a copy)."""
    out = matrix.clone()
    for i in range(out.shape[1]):
        out[:, i] /= out[:, i].norm()
        out[:, i + 1:] -= out[:, i:i + 1] * (out[:, i:i + 1] * out[:, i + 1:]).sum(dim=0)
    return out


def factorize(prompt: Tensor, test: Tensor) -> tuple[Tensor, Tensor]:
    """U (n, r) with orthonormal columns and V (r, d) with orthonormal rows from the (n, d) `prompt` and a (d, r)
    Gaussian test matrix: a randomised range finder with one power iteration (U from L Omega, V from L^T U), the
    original's `factorize_ctx` (DP_FPL.py:51-66); not an SVD, and U V is not scaled by singular values. Its residual
    L - U V makes U V + residual == L exactly."""
    u = orthonormal_columns(prompt @ test)  # (n, r)
    v = orthonormal_columns(prompt.t() @ u)  # (d, r)
    return u, v.t()


def privatised(grad: Tensor, clip: float, noise: float, generator: torch.Generator) -> Tensor:
    """`grad` scaled to an L2 norm of at most `clip`, plus N(0, (noise x clip)^2) on every element drawn from
    `generator` (on the CPU, then moved to grad's device)."""
    scale = torch.clamp(clip / grad.norm(), max=1.0)  # a zero gradient: inf, clamped to 1
    drawn = torch.randn(grad.shape, generator=generator, device="cpu").to(grad.device)
    return grad * scale + noise * clip * drawn


def rebuilt_gradient(u: Tensor, v: Tensor, grad_u: Tensor, grad_v: Tensor, gradient: str) -> Tensor:
    """(n, d) the local prompt's gradient from its factors' gradients g_U (n, r) and g_V (r, d).
    'reference': (g_U/10) V + U (g_V/10) + U U^T (g_U/10) V, the original's compute_full_grad (DP_FPL.py:68-76);
    with g_U = G V^T, g_V = U^T G, that is (G P_V + P_U G + P_U G P_V) / 10.
    'projection': g_U V + U g_V - U U^T g_U V, that is P_U G + G P_V - P_U G P_V, the tangent space's projection."""
    if gradient == "reference":
        grad_u, grad_v, sign = grad_u / 10.0, grad_v / 10.0, 1.0
    else:
        sign = -1.0
    left = grad_u @ v  # (n, d)
    return left + u @ grad_v + sign * (u @ (u.t() @ left))
