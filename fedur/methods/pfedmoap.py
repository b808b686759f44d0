"""pFedMoAP (Luo, Chen, Wu, ICLR 2025, "Mixture of experts made personalized: federated prompt learning for
vision-language models"): each client trains its own CoOp prompt, the local expert, starting every round from the
server's average of the clients' prompts, and mixes it with the prompts other clients trained (non-local experts,
downloaded, frozen) by a gating network of its own, an attention over the experts' class features:

    logit[b, c] = lam * s cos(f_b, t_local,c) + s <pool(f_b), g_bc>,
    g_bc = W_o concat_h sum_e softmax_e(scaling <W_q pool(f_b), W_k pool(t_e,c)>_h) W_v pool(t_e,c)

f the frozen image features, t_e,c expert e's class-c features (the local expert first, with its gradient), pool()
every (D / gate_dim)-th dimension, s CLIP's logit scale; without experts (a client's first round) the local logits
alone. Cross-entropy only (the labeller's loss). The prompts are averaged by the server (data size: the preset); the
gate never leaves the client.

Read from ljaiverson/pFedMoAP @ a481de35edc7c83244709f540f5fe573df4455dc: trainers/pfedmoap.py, `PromptLearner`
L27-146 (ctx N(0, 0.02^2)), `CustomCLIP` L148-237 (the gate L162-174, `pool` L176-183, the experts' pooled features
under no_grad L185-210, `forward` L217-237), `sparse_selection` L321-356, `MultiheadAttention` L429-471 (the gate:
W_q, W_k, W_v, W_o Linear(gate_dim, gate_dim), `scaling` in place of 1/sqrt(d_k), no dropout applied), the two SGDs
L276-283 (the gate's at 0.01, 5x the prompt's 0.002: configs/trainers/PFEDMOAP/vit_b16.yaml L15-33);
federated_main.py L347-412 (each round the prompt starts from `global_prompt`, the trained prompts' average weighted
by local data size, L392; each client's own last prompt, its gate and E - 1 experts, L358-375); with Yuqin-G/PMFLT
@ 7c433a25012132ee66e10ad2993c823ae61aff6c (model/pFedMoAP.py, federated/{client,server}_pfedmoap.py) as a cross-check:
its server model (`forward_global`: CoOp with the averaged prompt) is the global protocols' here. docs/sources/
pfedmoap-fedpha.md is the reading. FLiP has no pFedMoAP.

Where fedur differs, deliberately: the experts are the other trained clients' prompts nearest the client's by
Frobenius distance (`selection` 'nearest', the paper's KNN and its script's flag) [guess: the released code runs its
'random' fixed order, the flag never reaching it; both give every other trained client when the federation has at most
num_experts clients]; they are the bank's at the end of the previous round (the released loop may hand a client a
prompt trained earlier in the same round); each client's gate starts from one init (the released loop's first-round
gates are inherited from the client before); each client has its own SGD and schedule, the gate's rate `gate_lr_ratio`
x the prompt's under the same schedule (the released gate's is constant) [guess]; float32 pieces and SGD, the towers
bf16-mixed on GPUs with bf16 units under fabric.precision auto (fp16 there, the gate too). A client is tested (and
pseudo-labels) after the round's download, as every fedur method: with its own last prompt, its gate and the experts
it will train with next round (the released loop tests a client that trained right after training, with the experts it
trained with; one that sat out with fresh ones, as here). Without an expert the logits are the local ones alone, and
the gate's gradient is zero (weight decay still acts on it; the released gate is not in the graph then).
docs/reference-parity.md lists every difference.
"""

from __future__ import annotations

import weakref
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor, nn

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import Aggregated, GlobalModel, GlobalView, Method, ServerRound
from fedur.methods.pieces import Piece, text_context
from fedur.model.precision import full_precision

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

BANK, TRAINED, CHOSEN = "bank", "trained", "experts"  # the server state: every client's last prompt, whether it has
# one, and each client's chosen experts (client ids, -1: an empty slot)


class PFedMoAP(Method):
    """pFedMoAP: a local prompt (averaged) mixed with other clients' prompts by a personal attention gate; FPL
    pseudo-labels."""

    label = "pFedMoAP"
    preset = "pfedmoap"
    reads_rows = "own"  # each client's own prompt goes into the bank of experts

    def __init__(self, num_experts: PositiveInt = 10, lam: NonNegativeFloat = 0.5, scaling: PositiveFloat = 10.0,
                 gate_dim: PositiveInt | None = None, gate_heads: PositiveInt = 8, gate_lr_ratio: PositiveFloat = 5.0,
                 selection: Literal["nearest", "random"] = "nearest", eval_prompt: Literal["own", "global"] = "own", **kwargs) -> None:
        """
        Args:
            num_experts: E, the experts a client mixes, its own among them (10): E - 1 other clients' prompts.
            lam: The local logits' weight beside the gated term (0.5).
            scaling: The gate's attention scale, in place of 1/sqrt(d_k) (10).
            gate_dim: d_g, the gate's width: the features are pooled to every (D / d_g)-th dimension; D must be a
                multiple of it. null: 128, or D where D is smaller (fedur's small CPU models; the released code needs D >= 128).
            gate_heads: The gate's attention heads (8).
            gate_lr_ratio: The gate's learning rate as a multiple of the prompt's (the released 0.01 / 0.002 = 5) [guess:
                its schedule is the prompt's].
            selection: The experts: the other trained clients whose last prompts are nearest the client's (Frobenius;
                ties to the lower id) ('nearest'), or the first in a fixed random order of the clients ('random', the
                released code's; a permutation seeded with 0).
            eval_prompt: The local expert a client is tested (and pseudo-labels) with: its own last trained prompt
                ('own', the authors'), or the server's average ('global', PMFLT's personal evaluation).
        """
        super().__init__(**kwargs)
        if gate_dim is not None and gate_dim % gate_heads:
            raise ConfigError(f"pFedMoAP: --method.gate_dim {gate_dim} does not divide into {gate_heads} heads (--method.gate_heads)")
        self.num_experts, self.lam, self.scaling = int(num_experts), float(lam), float(scaling)
        self.gate_dim, self.gate_heads, self.gate_lr_ratio = gate_dim, int(gate_heads), float(gate_lr_ratio)
        self.selection, self.eval_prompt = selection, eval_prompt
        self._expert_memo: dict[tuple[int, int], tuple] = {}  # a pass's experts' features, per model

    def pieces(self) -> dict[str, Piece]:
        slots, dim, heads, scale = self.num_experts - 1, self.gate_dim, self.gate_heads, self.gate_lr_ratio
        return {
            "text_ctx": text_context(shared=True),  # the local expert being trained: the average at each round's start
            "own_ctx": Piece(text_context().init, trains=False, salt=1),  # the client's last trained prompt
            "gate_w": Piece(partial(gate_weight, name="w", dim=dim, heads=heads), lr_scale=scale, salt=7),  # W_q, W_k, W_v, W_o
            "gate_b": Piece(partial(gate_weight, name="b", dim=dim, heads=heads), lr_scale=scale, salt=7),
            "experts": Piece(lambda model, seed: torch.zeros(slots, *model.text_context_shape, device="cpu"), trains=False),
            "expert_mask": Piece(lambda model, seed: torch.zeros(slots, device="cpu"), trains=False),
        }

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def aggregate(self, round: ServerRound) -> Aggregated:
        """The prompts' weighted average; each participant's prompt into the bank; every trained client's experts."""
        shared = super().aggregate(round).shared
        prompts, joined = round.rows("text_ctx"), round.participants  # (K, n_ctx, width), (K,)
        bank = round.state.get(BANK, torch.zeros_like(prompts))
        bank = torch.where(joined.view(-1, 1, 1), prompts.to(bank.dtype), bank)
        trained = round.state.get(TRAINED, torch.zeros(len(joined), dtype=torch.bool, device="cpu")) | joined
        chosen = choose_experts(bank, trained, self.num_experts - 1, self.selection)
        return Aggregated(shared, {BANK: bank, TRAINED: trained, CHOSEN: chosen}, {"trained_clients": float(trained.sum())})

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        """The average to train from; the client's own last prompt and its experts from the bank (a client that never
        trained: the average, and no experts)."""
        super().download(client, shared, state)
        pieces = dict(client.pieces)
        k = client.client_id
        if TRAINED in state and bool(state[TRAINED][k]):
            ids = state[CHOSEN][k]  # (E - 1,)
            pieces["own_ctx"] = state[BANK][k].clone()
            pieces["experts"] = state[BANK][ids.clamp(min=0)] * (ids >= 0).view(-1, 1, 1)
            pieces["expert_mask"] = (ids >= 0).float()
        else:
            pieces["own_ctx"] = shared["text_ctx"]
            pieces["experts"], pieces["expert_mask"] = torch.zeros_like(pieces["experts"]), torch.zeros_like(pieces["expert_mask"])
        client.pieces = pieces

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """The local expert's class features (the prompt being trained in a training step, else `eval_prompt`'s), and
        the experts' (no gradient; once per pass)."""
        local = pieces["text_ctx"] if model.training or self.eval_prompt == "global" else pieces["own_ctx"]
        return {"local": model.text_features(local), "experts": self.expert_features(model, pieces["experts"])}

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        features = model.image_features(images)  # (B, D): the frozen tower
        local = model.logits(features, text["local"])  # (B, C)
        mixed = gated_logits(model, features, text["local"], text["experts"], pieces, local, self)
        return torch.where(pieces["expert_mask"].any(), mixed, local)  # no expert: the local logits alone

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """CoOp with the averaged prompt, no experts (PMFLT's `forward_global`; the authors test no global model)."""
        pieces = {**view.start, **view.shared}
        return GlobalModel({**pieces, "own_ctx": view.shared["text_ctx"], "expert_mask": torch.zeros_like(view.start["expert_mask"])})

    @torch.no_grad()
    def expert_features(self, model: PromptedCLIP, experts: Tensor) -> Tensor:
        """(E - 1, C, D) the experts' class features, one pass for all; computed once per tensor of experts (a client's
        round, a pass: the same tensor until the next download, as the original computes them once per download)."""
        key = (id(experts), id(model))  # the model too: the server's model is also asked over other classes
        hit = self._expert_memo.get(key)
        if hit is not None and hit[0]() is experts and hit[1]() is model and hit[2] == experts._version:
            return hit[3]
        features = model.text_features(experts) if len(experts) else experts.new_zeros(0, model.num_classes, model.feature_dim)
        self._expert_memo = {k: v for k, v in self._expert_memo.items() if v[0]() is not None}  # drop dead tensors' entries
        self._expert_memo[key] = (weakref.ref(experts), weakref.ref(model), experts._version, features)
        return features


def gated_logits(model: PromptedCLIP, features: Tensor, local: Tensor, experts: Tensor, pieces: dict[str, Tensor],
                 local_logits: Tensor, method: PFedMoAP) -> Tensor:
    """lam x the local logits + s <pool(f), gate output> (the released `CustomCLIP.forward` L226-235), the experts whose
    slot is empty out of the attention."""
    dim = pieces["gate_b"].shape[-1]  # d_g
    stride = model.feature_dim // dim
    w, b = pieces["gate_w"], pieces["gate_b"]
    with full_precision(features.device):
        query = features.float()[:, ::stride]  # (B, d_g)
        keys = torch.cat([local.float().unsqueeze(0), experts.float()])[..., ::stride]  # (E, C, d_g): the local expert first
        heads, d_k = method.gate_heads, dim // method.gate_heads
        q = F.linear(query, w[0], b[0]).view(len(query), heads, d_k)  # (B, h, d_k)
        k = F.linear(keys, w[1], b[1]).view(*keys.shape[:2], heads, d_k)  # (E, C, h, d_k)
        v = F.linear(keys, w[2], b[2]).view(*keys.shape[:2], heads, d_k)
        scores = method.scaling * torch.einsum("bhd,echd->bche", q, k)  # (B, C, h, E)
        filled = torch.cat([torch.ones(1, device=features.device), pieces["expert_mask"].float()]) > 0  # (E,)
        attention = scores.masked_fill(~filled, float("-inf")).softmax(dim=-1)
        gated = F.linear(torch.einsum("bche,echd->bchd", attention, v).reshape(len(query), keys.shape[1], dim), w[3], b[3])
        return method.lam * local_logits.float() + model.logit_scale.float() * torch.einsum("bd,bcd->bc", query, gated)


def choose_experts(bank: Tensor, trained: Tensor, slots: int, rule: str, seed: int = 0) -> Tensor:
    """(K, slots) int64: each trained client's experts among the other trained clients (-1: an empty slot; an
    untrained client's row is all -1): the nearest by the Frobenius distance of their prompts, ties to the lower id
    ('nearest'), or the first in a fixed random permutation of the clients ('random')."""
    num = len(bank)
    chosen = torch.full((num, slots), -1, dtype=torch.long, device="cpu")
    if slots == 0:
        return chosen
    flat = bank.reshape(num, -1).double()
    distances = torch.cdist(flat, flat)  # (K, K)
    order = torch.randperm(num, generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")
    rank = torch.empty(num, dtype=torch.long, device="cpu")
    rank[order] = torch.arange(num, device="cpu")
    for k in torch.nonzero(trained).flatten().tolist():
        candidates = torch.nonzero(trained & (torch.arange(num, device="cpu") != k)).flatten()  # ascending ids
        key = distances[k, candidates] if rule == "nearest" else rank[candidates].double()
        picked = candidates[torch.sort(key, stable=True).indices[:slots]]
        chosen[k, :len(picked)] = picked
    return chosen


def gate_weight(model: PromptedCLIP, seed: int, name: str, dim: int | None, heads: int) -> Tensor:
    """The gate's initial weights ("w": (4, d_g, d_g)) or biases ("b": (4, d_g)) of W_q, W_k, W_v, W_o, as PyTorch
    initialises them built in that order under `seed` (`dim` None: 128, or D where smaller)."""
    dim = min(128, model.feature_dim) if dim is None else dim
    if model.feature_dim % dim or dim % heads:
        raise ConfigError(f"pFedMoAP: the features' width {model.feature_dim} is not a multiple of the gate's {dim} "
                          f"(--method.gate_dim), or {dim} does not divide into {heads} heads (--method.gate_heads)")
    return _gate(dim, seed)[name].clone()


@lru_cache(maxsize=4)
def _gate(dim: int, seed: int) -> dict[str, Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = [nn.Linear(dim, dim, device="cpu") for _ in range(4)]  # W_q, W_k, W_v, W_o
    return {"w": torch.stack([layer.weight.detach() for layer in layers]), "b": torch.stack([layer.bias.detach() for layer in layers])}
