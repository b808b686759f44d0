"""pFedMoAP and FedPHA against transcriptions of their released code's call sequence, on the tiny CLIP.

pFedMoAP: ljaiverson/pFedMoAP @ a481de35edc7c83244709f540f5fe573df4455dc, trainers/pfedmoap.py: `CustomCLIP.forward`
L217-237 (with `pool` L176-183 and the experts' features of `_compute_nonlocal_text_features` L185-210), the gate
`MultiheadAttention` L429-471 (built in float32 here, fp16 there), `sparse_selection` L321-356 (its 'random' rule;
'nearest' as a brute force: the released branch calls topk on a list and returns positions, not ids); federated_main.py
L347-412 (the round loop: download, train, upload, `average_weights` of utils/fed_utils.py L5-28).

FedPHA: CYFang6/FedPHA @ 1ab33df395204efd811218b6d135f3469654db6e, trainers/GL_SVDMSE.py: `compute_null_space` L129-147,
`PromptLearner.forward` L149-196 (the local, global and projected local prompts; class token at the end),
`CustomCLIP.forward` L259-281, `forward_backward` L335-371 (the loss, fp32 branch).

The text and image towers are fedur's (`model.text_features`, `model.image_features`): what is transcribed is what the
originals do with the features, the prompts and the clients' uploads. docs/sources/pfedmoap-fedpha.md is the reading.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedur.federated.client import ClientState
from fedur.labels import FPL
from fedur.methods import FedPHA, PFedMoAP
from fedur.methods.base import GlobalView, ServerRound
from fedur.methods.fedpha import projector
from fedur.methods.pfedmoap import choose_experts
from fedur.methods.pieces import initial_values, piece_seed
from fedur.model.classifier import PromptedCLIP
from fedur.train.module import PromptTuner

NAMES = ["cat", "dog", "a red bird", "ship", "truck"]
RUN_SEED = 3


@pytest.fixture
def model(tiny_clip):
    """A fresh classifier per test: the tests switch it between training and evaluation."""
    return PromptedCLIP(tiny_clip, NAMES, 4, 0, None, 0.02, seed=RUN_SEED)


def draw(*shape, seed, scale=1.0):
    """A seeded random tensor: prompts far enough apart that their class features differ clearly on the tiny model."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def images(n=6, seed=11):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def client_of(pieces, client_id=0):
    return ClientState(client_id, np.arange(8), np.arange(0), dict(pieces))


# --- pFedMoAP, transcribed (trainers/pfedmoap.py) ----------------------------------------------------------------------
class MultiheadAttention(nn.Module):
    """L429-471, as released (its `dropout` stored, never applied)."""

    def __init__(self, d_model, num_heads, dropout=0.1, scaling=1.0, dtype=torch.float16):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.scaling = scaling
        self.dtype = dtype
        self.W_q = nn.Linear(d_model, d_model, dtype=self.dtype)
        self.W_k = nn.Linear(d_model, d_model, dtype=self.dtype)
        self.W_v = nn.Linear(d_model, d_model, dtype=self.dtype)
        self.W_o = nn.Linear(d_model, d_model, dtype=self.dtype)

    def scaled_dot_product_attention(self, Q, K, V, mask=None):
        attn_scores = torch.matmul(Q, K.transpose(-2, -1)) * self.scaling
        if mask is not None:
            attn_scores = attn_scores.masked_fill(mask == 0, -1e9)
        attn_probs = F.softmax(attn_scores, dim=-1)
        output = torch.matmul(attn_probs, V)
        return output, attn_probs

    def split_heads(self, x):
        batch_size, seq_length, d_model = x.size()
        return x.view(batch_size, seq_length, self.num_heads, self.d_k).transpose(1, 2)

    def combine_heads(self, x):
        batch_size, num_heads, seq_length, d_k = x.size()
        return x.transpose(1, 2).contiguous().view(batch_size, seq_length, self.d_model)

    def forward(self, Q, K, V, mask=None):
        Q = self.split_heads(self.W_q(Q))
        K = self.split_heads(self.W_k(K))
        V = self.split_heads(self.W_v(V))
        attn_output, attn_probs = self.scaled_dot_product_attention(Q, K, V, mask)
        output = self.W_o(self.combine_heads(attn_output))
        return output, torch.mean(attn_probs, dim=1)


def layers_of(gate):
    return [gate.W_q, gate.W_k, gate.W_v, gate.W_o]


def gate_holding(w, b, heads, scaling):
    """The transcribed gate holding fedur's gate pieces (4, d_g, d_g) and (4, d_g) as its parameters."""
    gate = MultiheadAttention(w.shape[-1], heads, dropout=0.1, scaling=scaling, dtype=torch.float32)
    with torch.no_grad():
        for layer, weight, bias in zip(layers_of(gate), w, b):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
    return gate


def pool(t, reduce_times):
    """`CustomCLIP.pool` L176-183."""
    if len(t.shape) == 4:
        return t[:, :, :, ::reduce_times]
    if len(t.shape) == 3:
        return t[:, :, ::reduce_times]
    if len(t.shape) == 2:
        return t[:, ::reduce_times]
    return None


def nonlocal_features(model, contexts, reduce_times):
    """`_compute_nonlocal_text_features` L185-210: each expert's normalised, pooled class features, no gradient."""
    out = []
    for ctx in contexts:
        with torch.no_grad():
            out.append(pool(model.text_features(ctx), reduce_times).detach())
    return out


def reference_logits(model, image_features, text_features, nonlocal_text_features, gating, lmbda, reduce_times):
    """`CustomCLIP.forward` L217-237 from the normalised features on (the towers are fedur's)."""
    n_class = text_features.shape[0]
    logit_scale = model.logit_scale
    local_logits = logit_scale * image_features @ text_features.t()
    if nonlocal_text_features:
        q = pool(image_features, reduce_times).repeat(n_class, 1, 1)  # (n_class, Batch, feature_dim)
        k = v = torch.stack([pool(text_features, reduce_times)] + nonlocal_text_features).permute(1, 0, 2)  # (n_class, n_experts, d)
        new_features = gating(q, k, v)[0].permute(1, 2, 0)  # (Batch, feature_dim, n_class)
        return lmbda * local_logits + logit_scale * torch.bmm(pool(image_features, reduce_times).unsqueeze(1), new_features).squeeze(1)
    return local_logits


def moap_pieces(method, model, experts, mask):
    """The method's pieces with prompts and a gate away from their init (a trained client's), the given experts."""
    pieces = initial_values(method.pieces(), model, RUN_SEED)
    pieces["text_ctx"] = draw(*model.text_context_shape, seed=21)
    pieces["own_ctx"] = draw(*model.text_context_shape, seed=22)
    pieces["gate_w"] = pieces["gate_w"] * 3 + draw(*pieces["gate_w"].shape, seed=23, scale=0.1)  # a gate whose attention is
    pieces["gate_b"] = pieces["gate_b"] + draw(*pieces["gate_b"].shape, seed=24, scale=0.1)  # far from uniform
    pieces["experts"] = torch.stack(experts)
    pieces["expert_mask"] = torch.tensor(mask, dtype=torch.float32)
    return pieces


def moap_logits(method, model, x, pieces):
    return method.logits(model, x, pieces, method.text_side(model, pieces), client_of(pieces))


EXPERTS = [draw(4, 64, seed=31), draw(4, 64, seed=32), draw(4, 64, seed=33)]


@pytest.mark.parametrize("gate_dim, heads", [(16, 8), (32, 4), (None, 8)])
def test_the_gate_starts_from_the_linear_layers_the_original_draws_under_the_pieces_seed(model, gate_dim, heads):
    """gate_w / gate_b are W_q, W_k, W_v, W_o of `MultiheadAttention` built under torch.manual_seed(the pieces' seed);
    gate_dim None: D for a model narrower than 128 (64 here)."""
    method = PFedMoAP(num_experts=3, gate_dim=gate_dim, gate_heads=heads)
    declared = method.pieces()
    pieces = initial_values(declared, model, RUN_SEED)
    dim = gate_dim or model.feature_dim
    seed = piece_seed(RUN_SEED, "gate_w", declared["gate_w"])
    assert seed == piece_seed(RUN_SEED, "gate_b", declared["gate_b"])  # one build gives both
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gate = MultiheadAttention(dim, heads, dropout=0.1, scaling=10.0, dtype=torch.float32)
    assert pieces["gate_w"].shape == (4, dim, dim) and pieces["gate_b"].shape == (4, dim)
    assert torch.equal(pieces["gate_w"], torch.stack([layer.weight.detach() for layer in layers_of(gate)]))
    assert torch.equal(pieces["gate_b"], torch.stack([layer.bias.detach() for layer in layers_of(gate)]))
    # the gate trains at gate_lr_ratio x the prompt's rate (the released SGDs: 0.01 and 0.002); the experts, their mask
    # and the client's own last prompt are held, not trained; only the prompt is averaged
    assert declared["gate_w"].lr_scale == declared["gate_b"].lr_scale == 5.0 and declared["text_ctx"].lr_scale == 1.0
    assert [name for name, piece in declared.items() if piece.trains] == ["text_ctx", "gate_w", "gate_b"]
    assert [name for name, piece in declared.items() if piece.shared] == ["text_ctx"]
    assert pieces["experts"].shape == (2, *model.text_context_shape) and not pieces["expert_mask"].any()


@pytest.mark.parametrize("gate_dim, heads", [(16, 8), (32, 4)])
def test_logits_and_gradients_with_experts_are_the_original_forwards(model, gate_dim, heads):
    """A training step (the local expert: the prompt being trained) with two filled expert slots: the logits, and the
    gradients of their cross-entropy (the method's whole loss, FPL's CE) in the prompt and the gate."""
    method = PFedMoAP(num_experts=3, lam=0.5, scaling=10.0, gate_dim=gate_dim, gate_heads=heads)
    start = moap_pieces(method, model, EXPERTS[:2], [1.0, 1.0])
    x, labels = images(), torch.tensor([0, 1, 2, 3, 4, 0])
    reduce_times = model.feature_dim // gate_dim

    ctx = start["text_ctx"].clone().requires_grad_()
    gate = gate_holding(start["gate_w"], start["gate_b"], heads, scaling=10.0)
    image_features = model.image_features(x)
    expected = reference_logits(model, image_features, model.text_features(ctx), nonlocal_features(model, EXPERTS[:2], reduce_times),
                                gate, 0.5, reduce_times)
    F.cross_entropy(expected, labels).backward()

    pieces = {name: t.clone().requires_grad_(name in ("text_ctx", "gate_w", "gate_b", "experts")) for name, t in start.items()}
    tuner = PromptTuner(model, method, FPL())
    batch = (x, labels, torch.zeros(len(x), len(NAMES), dtype=torch.bool), torch.arange(len(x)))
    model.train()
    try:
        logits = moap_logits(method, model, x, pieces)
        loss = tuner.training_step([batch], [pieces], [client_of(start)])[0]["loss"]
    finally:
        model.eval()
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-6)
    loss.backward()
    torch.testing.assert_close(pieces["text_ctx"].grad, ctx.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(pieces["gate_w"].grad, torch.stack([layer.weight.grad for layer in layers_of(gate)]), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(pieces["gate_b"].grad, torch.stack([layer.bias.grad for layer in layers_of(gate)]), rtol=1e-4, atol=1e-6)
    assert pieces["experts"].grad is None  # the experts are frozen features (computed under no_grad)

    # the comparison can fail: the gated term is large, and 1/sqrt(d_k) or lam on the gated term instead would not match
    local = model.logits(image_features, model.text_features(start["text_ctx"])).detach()
    assert (logits - local).abs().max() > 0.1
    other_scaling = reference_logits(model, image_features.detach(), model.text_features(start["text_ctx"]).detach(),
                                     nonlocal_features(model, EXPERTS[:2], reduce_times),
                                     gate_holding(start["gate_w"], start["gate_b"], heads, (gate_dim // heads) ** -0.5), 0.5, reduce_times)
    assert (other_scaling - expected).abs().max() > 1e-3


def test_an_empty_slot_is_the_same_as_dropping_that_expert(model):
    """Slot 1 holds a prompt but its mask is 0: the logits are those of the original with the other two experts only
    (and of fedur with those two in two slots); filling the slot changes them."""
    wide = PFedMoAP(num_experts=4, gate_dim=16, gate_heads=8)
    narrow = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8)
    x = images()
    holes = moap_pieces(wide, model, EXPERTS, [1.0, 0.0, 1.0])
    full = {**holes, "expert_mask": torch.ones(3)}
    dropped = {**holes, "experts": torch.stack([EXPERTS[0], EXPERTS[2]]), "expert_mask": torch.ones(2)}
    gate = gate_holding(holes["gate_w"], holes["gate_b"], 8, scaling=10.0)
    model.train()
    with torch.no_grad():
        try:
            ours, ours_dropped, ours_full = (moap_logits(m, model, x, p) for m, p in ((wide, holes), (narrow, dropped), (wide, full)))
        finally:
            model.eval()
        expected = reference_logits(model, model.image_features(x), model.text_features(holes["text_ctx"]),
                                    nonlocal_features(model, [EXPERTS[0], EXPERTS[2]], 4), gate, 0.5, 4)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, ours_dropped, rtol=1e-5, atol=1e-5)
    assert (ours_full - ours).abs().max() > 1e-3


def test_without_any_expert_the_logits_are_the_local_logits_alone_and_the_gate_learns_nothing(model):
    """A client's first round (no expert): the original returns `local_logits` (no lam, no gate)."""
    method = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8)
    start = moap_pieces(method, model, EXPERTS[:2], [0.0, 0.0])  # prompts in the slots, none filled
    x = images()
    pieces = {name: t.clone().requires_grad_(name in ("text_ctx", "gate_w", "gate_b")) for name, t in start.items()}
    model.train()
    try:
        logits = moap_logits(method, model, x, pieces)
    finally:
        model.eval()
    ctx = start["text_ctx"].clone().requires_grad_()
    expected = reference_logits(model, model.image_features(x), model.text_features(ctx), [], None, 0.5, 4)
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    F.cross_entropy(logits, torch.arange(6) % 5).backward()
    F.cross_entropy(expected, torch.arange(6) % 5).backward()
    torch.testing.assert_close(pieces["text_ctx"].grad, ctx.grad, rtol=1e-5, atol=1e-7)
    for name in ("gate_w", "gate_b"):  # out of the original's graph: no gradient (here an exact zero)
        assert pieces[name].grad is None or not pieces[name].grad.any(), name


@pytest.mark.parametrize("eval_prompt", ["own", "global"])
def test_the_local_expert_is_the_trained_prompt_in_training_and_the_eval_prompt_in_evaluation(model, eval_prompt):
    """Training: `text_ctx` (the round's average being trained). Evaluation and pseudo-labelling: the client's own last
    prompt (`own_ctx`, the original's `load_ctx(local_prompts[idx])`, federated_main L405) or, 'global', the average."""
    method = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8, eval_prompt=eval_prompt)
    pieces = moap_pieces(method, model, EXPERTS[:2], [1.0, 1.0])
    gate = gate_holding(pieces["gate_w"], pieces["gate_b"], 8, scaling=10.0)
    x = images()
    with torch.no_grad():
        features = model.image_features(x)
        experts = nonlocal_features(model, EXPERTS[:2], 4)
        with_local = lambda ctx: reference_logits(model, features, model.text_features(ctx), experts, gate, 0.5, 4)
        model.train()
        try:
            training = moap_logits(method, model, x, pieces)
        finally:
            model.eval()
        evaluation = moap_logits(method, model, x, pieces)
    torch.testing.assert_close(training, with_local(pieces["text_ctx"]), rtol=1e-5, atol=1e-5)
    local = pieces["own_ctx"] if eval_prompt == "own" else pieces["text_ctx"]
    torch.testing.assert_close(evaluation, with_local(local), rtol=1e-5, atol=1e-5)
    if eval_prompt == "own":
        assert (evaluation - training).abs().max() > 1e-3  # two prompts: the comparison tells them apart


def test_the_experts_features_are_those_of_the_experts_held_now(model):
    """The features are computed once per tensor of experts (the original: once per download), and again when that
    tensor changes in place or another one comes."""
    method = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8)
    pieces = moap_pieces(method, model, EXPERTS[:2], [1.0, 1.0])
    with torch.no_grad():
        first = method.text_side(model, pieces)["experts"]
        torch.testing.assert_close(first, model.text_features(torch.stack(EXPERTS[:2])))
        assert method.text_side(model, pieces)["experts"] is first  # the same pass's tensor: no second text pass
        pieces["experts"].mul_(0.5)
        torch.testing.assert_close(method.text_side(model, pieces)["experts"], model.text_features(torch.stack(EXPERTS[:2]) * 0.5))
        pieces["experts"] = torch.stack(EXPERTS[1:])
        torch.testing.assert_close(method.text_side(model, pieces)["experts"], model.text_features(torch.stack(EXPERTS[1:])))


def test_the_experts_features_follow_the_model_they_are_asked_for(model):
    """The same pieces scored over other classes: `evaluate_round` builds the server's model over the base classes and
    then over each held-out set's (base-to-novel's novel classes) from the same `view.start` tensors, which
    `ClientState.on` leaves the same objects on the CPU. The experts' features must be the other classes', and the
    logits the other model's local logits (no expert filled). Fails: the memo is keyed by the experts tensor alone, so
    the base classes' (2, 5, D) features come back and `gated_logits` cannot concatenate them with (1, 2, D)."""
    method = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8)
    pieces = initial_values(method.pieces(), model, RUN_SEED)  # the server's model: no expert filled
    other = model.for_classes(["plane", "frog"], "a photo of a {}.")
    x = images()
    with torch.no_grad():
        method.text_side(model, pieces)  # the base classes' pass first, as evaluate_round runs them
        text = method.text_side(other, pieces)
        assert text["experts"].shape == (2, 2, model.feature_dim)
        logits = method.logits(other, x, pieces, text, client_of(pieces))
        torch.testing.assert_close(logits, other.logits(other.image_features(x), other.text_features(pieces["own_ctx"])))


# --- pFedMoAP's server (federated_main.py L347-412) ------------------------------------------------------------------------
def average_weights(w, idxs_users, datanumber_client, islist=False):
    """utils/fed_utils.py L5-28 (its list branch)."""
    total_data_points = sum([datanumber_client[r] for r in idxs_users])
    w_avg = w[idxs_users[0]].clone()
    for idx in range(len(idxs_users)):
        fed_avg_freqs = datanumber_client[idxs_users[idx]] / total_data_points
        if idx == 0:
            w_avg = w_avg * fed_avg_freqs
        else:
            w_avg += w[idxs_users[idx]] * fed_avg_freqs
    return w_avg


def random_selection(idx, ctxs, shuffled_all_indices, num_experts):
    """`sparse_selection`'s 'random' rule (L322-332): the first E - 1 trained clients, not idx, in a fixed order."""
    selected_indices = []
    for x in shuffled_all_indices:
        if x != idx and ctxs[x] is not None:  # random_selection_condition (L298), `ctxs[x] != []`
            selected_indices.append(x)
        if len(selected_indices) == num_experts - 1:
            break
    return selected_indices


def nearest_selection(idx, ctxs, num_experts):
    """'nearest' (L335-353) as it means to be: all other trained clients when at most E have trained, else the E - 1
    nearest by torch.norm(ctxs[idx] - ctxs[j]), by brute force (ties: the lower id)."""
    trained_indices = [i for i in range(len(ctxs)) if ctxs[i] is not None]
    if len(trained_indices) <= num_experts:
        return [i for i in trained_indices if i != idx]
    others = [j for j in trained_indices if j != idx]
    distances = [float(torch.norm((ctxs[idx] - ctxs[j]).double())) for j in others]
    return [j for _, j in sorted(zip(distances, others))][:num_experts - 1]


def padded(ids, slots):
    return ids + [-1] * (slots - len(ids))


def as_chosen(row, slots):
    """A row of chosen experts in id order, the empty slots last. The order of the filled slots is no part of the
    model (the gate's softmax over the experts is the same in any order), and the original's differs by branch: ids
    ascending when every other trained client is taken, nearest first otherwise (its topk)."""
    ids = row.tolist()
    filled = [i for i in ids if i >= 0]
    assert ids == filled + [-1] * (slots - len(filled)), ids  # empty slots only at the end
    return padded(sorted(filled), slots)


def one_hot(index, value=1.0):
    """A (2, 3) prompt with one non-zero entry: integer distances, so that ties are exact."""
    t = torch.zeros(6)
    t[index] = value
    return t.view(2, 3)


K, SLOTS = 6, 2  # num_experts 3: two other clients' prompts per trained client
ROUNDS = [  # (who uploads what, their train-set sizes): client 0 trains in round 1 only, client 5 never
    ({0: one_hot(5, 3.0), 2: one_hot(1, 2.0)}, {0: 10.0, 2: 30.0}),
    ({1: one_hot(0), 2: one_hot(1, 2.0), 3: one_hot(0, -1.0), 4: one_hot(2)}, {1: 5.0, 2: 10.0, 3: 15.0, 4: 20.0}),
]


def run_server(method):
    """The rounds above through aggregate and every client's download; each round's (aggregated, the clients' pieces)."""
    empty = {"text_ctx": torch.zeros(2, 3), "own_ctx": torch.full((2, 3), 7.0), "gate_w": torch.ones(4, 2, 2),
             "gate_b": torch.ones(4, 2), "experts": torch.zeros(SLOTS, 2, 3), "expert_mask": torch.zeros(SLOTS)}
    clients = [client_of(empty, k) for k in range(K)]
    shared, state, out = {"text_ctx": empty["text_ctx"]}, {}, []
    for number, (uploads, sizes) in enumerate(ROUNDS, start=1):
        stacked = torch.zeros(K, 2, 3)
        weights = torch.zeros(K)
        for k, prompt in uploads.items():
            stacked[k], weights[k] = prompt, sizes[k]
        result = method.aggregate(ServerRound(number, len(ROUNDS), {"text_ctx": stacked}, weights, shared, state))
        shared, state = result.shared, result.state
        for client in clients:
            method.download(client, shared, state)
        out.append((result, [dict(c.pieces) for c in clients]))
    return out


def banks():
    """The original's `local_prompts` after each round (None: `[]`, never trained)."""
    prompts, out = [None] * K, []
    for uploads, _ in ROUNDS:
        for k, prompt in uploads.items():
            prompts[k] = prompt
        out.append(list(prompts))
    return out


@pytest.mark.parametrize("selection", ["nearest", "random"])
def test_the_server_banks_prompts_marks_trained_clients_and_chooses_their_experts(selection):
    method = PFedMoAP(num_experts=SLOTS + 1, selection=selection)
    order = torch.randperm(K, generator=torch.Generator().manual_seed(0)).tolist()  # the rule's fixed order ('random')
    for (result, _), (uploads, sizes), ctxs in zip(run_server(method), ROUNDS, banks()):
        joined = sorted(uploads)
        torch.testing.assert_close(result.shared["text_ctx"], average_weights(ctxs, joined, sizes, islist=True))
        bank = torch.stack([torch.zeros(2, 3) if c is None else c for c in ctxs])
        assert torch.equal(result.state["bank"], bank)
        assert result.state["trained"].tolist() == [c is not None for c in ctxs]
        assert result.metrics["trained_clients"] == sum(c is not None for c in ctxs)
        for k in range(K):
            if ctxs[k] is None:
                expected = []
            elif selection == "nearest":
                expected = nearest_selection(k, ctxs, SLOTS + 1)
            else:
                expected = random_selection(k, ctxs, order, SLOTS + 1)
            assert as_chosen(result.state["experts"][k], SLOTS) == padded(sorted(expected), SLOTS), (k, ctxs)
    if selection == "nearest":  # the second round, written out: from client 0 (and 2) clients 1, 3 and 4 tie (sqrt 10,
        # sqrt 5), from client 4 clients 1 and 3 (sqrt 2): the lower ids first
        assert result.state["experts"].tolist() == [[1, 3], [4, 3], [1, 3], [4, 1], [1, 3], [-1, -1]]


@pytest.mark.parametrize("trial", range(6))
def test_nearest_is_the_brute_force_top_e_minus_1_among_the_other_trained_clients(trial):
    """Random banks, trained sets and slot counts; integer prompts in odd trials (ties decided by the lower id)."""
    generator = torch.Generator().manual_seed(trial)
    num, slots = 7, 1 + trial % 4
    bank = torch.randn(num, 2, 3, generator=generator)
    if trial % 2:
        bank = bank.mul(1.5).round()
    trained = torch.rand(num, generator=generator) < 0.7
    chosen = choose_experts(bank, trained, slots, "nearest")
    ctxs = [bank[k] if trained[k] else None for k in range(num)]
    for k in range(num):
        expected = nearest_selection(k, ctxs, slots + 1) if trained[k] else []
        assert as_chosen(chosen[k], slots) == padded(sorted(expected), slots), (k, trained.tolist())


def test_download_gives_a_trained_client_its_own_prompt_and_its_experts_and_a_new_one_the_average():
    """Every client trains from the round's data-weighted average; a client that trained holds its last upload as
    `own_ctx` (also after sitting a round out) and its experts' last uploads; one that never trained holds the average
    and no expert (federated_main L358-375, L405-408). The gate is the client's own: never touched."""
    method = PFedMoAP(num_experts=SLOTS + 1)
    rounds = run_server(method)
    for (result, clients), ctxs in zip(rounds, banks()):
        average = result.shared["text_ctx"]
        for k, pieces in enumerate(clients):
            assert torch.equal(pieces["text_ctx"], average)
            assert torch.equal(pieces["gate_w"], torch.ones(4, 2, 2)) and torch.equal(pieces["gate_b"], torch.ones(4, 2))
            ids = result.state["experts"][k].tolist()
            if ctxs[k] is None:
                assert torch.equal(pieces["own_ctx"], average)
                assert not pieces["experts"].any() and not pieces["expert_mask"].any()
                continue
            assert torch.equal(pieces["own_ctx"], ctxs[k])
            assert pieces["expert_mask"].tolist() == [float(i >= 0) for i in ids]
            for slot, i in enumerate(ids):
                assert torch.equal(pieces["experts"][slot], ctxs[i] if i >= 0 else torch.zeros(2, 3)), (k, slot)
    first, second = rounds[0][1], rounds[1][1]
    assert first[0]["expert_mask"].tolist() == [1.0, 0.0] and torch.equal(first[0]["experts"][0], ROUNDS[0][0][2])
    assert torch.equal(second[0]["own_ctx"], ROUNDS[0][0][0])  # sat round 2 out: its round-1 prompt


@pytest.mark.parametrize("eval_prompt", ["own", "global"])
def test_pfedmoap_server_model_is_coop_with_the_averaged_prompt(model, eval_prompt):
    """PMFLT's `forward_global`: the average alone, whatever the clients' experts and own prompts."""
    method = PFedMoAP(num_experts=3, gate_dim=16, gate_heads=8, eval_prompt=eval_prompt)
    start = initial_values(method.pieces(), model, RUN_SEED)
    start = {**start, "own_ctx": draw(4, 64, seed=41), "experts": torch.stack(EXPERTS[:2])}  # neither may matter
    average = draw(4, 64, seed=42)
    state = {"bank": torch.stack(EXPERTS), "trained": torch.ones(3, dtype=torch.bool), "experts": torch.tensor([[1, 2], [0, 2], [0, 1]])}
    view = GlobalView({"text_ctx": average}, state, start, client_mean=lambda name: start[name])
    held = method.global_model(model, view)
    x = images()
    with torch.no_grad():
        text = method.text_side(model, held.pieces) if held.text is None else held.text
        logits = method.logits(model, x, held.pieces, text, client_of(held.pieces, -1))
        torch.testing.assert_close(logits, model.logits(model.image_features(x), model.text_features(average)), rtol=1e-6, atol=1e-6)


# --- FedPHA, transcribed (trainers/GL_SVDMSE.py) ------------------------------------------------------------------------
def compute_null_space(global_ctx, ratio=0.8):
    """L129-147 (its CPU fallback left out)."""
    global_ctx = global_ctx.view(-1, global_ctx.shape[-1])  # Flatten: (N * n_ctx, ctx_dim)
    global_ctx = global_ctx.to(torch.float32)
    U, S, V = torch.svd(global_ctx)
    cutoff = int(S.shape[0] * (1 - ratio))
    V2 = V[:, cutoff:]
    return V2.to(global_ctx.dtype)


def reference_fedpha_loss(model, ctx_local, ctx_global, x, label, alpha, ratio, weights=(1.0, 1.0, 1.0), detach_basis=False):
    """`PromptLearner.forward` L149-196 (N = 1), `CustomCLIP.forward` L259-281 in training and `forward_backward`
    L348-361; `weights`: (global CE, pull, push), the released 1, 1, 1 (lambda_pull, lambda_push hard-coded)."""
    null_space = compute_null_space(ctx_global.detach() if detach_basis else ctx_global, ratio)
    ctx_flat = ctx_local.view(-1, ctx_local.shape[-1])
    null_space = null_space.to(ctx_flat.dtype)
    projected_ctx = torch.mm(ctx_flat, torch.mm(null_space, null_space.T))
    projected_ctx_local = projected_ctx.view(ctx_local.shape)

    text_features = model.text_features(ctx_local)  # normalised, as L264-265
    image_features = model.image_features(x)
    logit_scale = model.logit_scale
    output = logit_scale * image_features @ text_features.t()
    global_features = model.text_features(ctx_global)
    projected_local_features = model.text_features(projected_ctx_local)
    output_global = logit_scale * image_features @ global_features.t()
    local_features = text_features

    pull_loss = F.mse_loss(local_features, projected_local_features)
    push_loss = F.relu(alpha - torch.norm(local_features - global_features, dim=-1)).mean()
    lambda_global, lambda_pull, lambda_push = weights
    loss = F.cross_entropy(output, label)
    loss2 = F.cross_entropy(output_global, label)
    loss = loss + lambda_global * loss2
    loss = loss + lambda_pull * pull_loss + lambda_push * push_loss
    return loss, output, push_loss, (local_features - global_features).norm(dim=-1)


@pytest.mark.parametrize("shape", [(4, 64), (16, 64), (16, 512), (8, 4)])
@pytest.mark.parametrize("ratio", [0.8, 0.5, 0.3, 1.0])
def test_fedphas_projector_is_the_originals_null_space_projection(shape, ratio):
    global_ctx = draw(*shape, seed=51, scale=0.02)
    V2 = compute_null_space(global_ctx, ratio)
    P = projector(global_ctx, ratio)
    torch.testing.assert_close(P, V2 @ V2.T, rtol=1e-5, atol=1e-5)
    kept = min(shape) - int(min(shape) * (1 - ratio))  # the weakest directions: L minus the top int(L (1 - ratio))
    assert float(torch.trace(P)) == pytest.approx(kept, abs=1e-4)
    if kept < min(shape):  # the global prompt's strongest direction is projected away (L = 4 at 0.8 drops none)
        _, _, vh = torch.linalg.svd(global_ctx)
        assert float((vh[0] @ P).norm()) < 1e-4


PHA_CASES = [  # alpha, ratio, (global CE, pull, push) weights, detach_basis
    pytest.param(1.0, 0.8, (1.0, 1.0, 1.0), False, id="released"),  # the hinge active for one class of five
    pytest.param(2.0, 0.5, (1.0, 1.0, 1.0), False, id="all-pushed"),
    pytest.param(1.0, 0.8, (3.0, 2.0, 0.5), False, id="weighted"),
    pytest.param(1.0, 0.8, (1.0, 1.0, 1.0), True, id="detached-basis"),
]


def fedpha_step(model, method, ctx_local, ctx_global, x, labels):
    """One PromptTuner training step (FPL: cross-entropy) of the two prompts; (loss, logits, grads)."""
    pieces = {"text_ctx": ctx_global.clone().requires_grad_(), "text_local": ctx_local.clone().requires_grad_()}
    batch = (x, labels, torch.zeros(len(x), len(NAMES), dtype=torch.bool), torch.arange(len(x)))
    model.train()
    try:
        logits = method.logits(model, x, pieces, method.text_side(model, pieces), client_of(pieces))
        loss = PromptTuner(model, method, FPL()).training_step([batch], [pieces], [client_of(pieces)])[0]["loss"]
    finally:
        model.eval()
    loss.backward()
    return loss, logits, pieces["text_local"].grad, pieces["text_ctx"].grad


@pytest.mark.parametrize("alpha, ratio, weights, detach_basis", PHA_CASES)
def test_fedphas_training_loss_and_gradients_are_the_originals(model, alpha, ratio, weights, detach_basis):
    """CE(local logits) + CE(global logits) + mse(local, projected) + relu(alpha - |local - global|).mean(), and its
    gradients in both prompts: through the SVD into the global prompt unless detach_basis."""
    method = FedPHA(alpha=alpha, ratio=ratio, global_weight=weights[0], pull_weight=weights[1], push_weight=weights[2],
                    detach_basis=detach_basis)
    ctx_local, ctx_global = draw(4, 64, seed=61), draw(4, 64, seed=62)
    x, labels = images(), torch.tensor([0, 1, 2, 3, 4, 1])
    loss, logits, grad_local, grad_global = fedpha_step(model, method, ctx_local, ctx_global, x, labels)

    local, global_ = ctx_local.clone().requires_grad_(), ctx_global.clone().requires_grad_()
    expected, output, push, gaps = reference_fedpha_loss(model, local, global_, x, labels, alpha, ratio, weights, detach_basis)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, output, rtol=1e-5, atol=1e-5)  # the step's logits: the local prompt's
    torch.testing.assert_close(grad_local, local.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad_global, global_.grad, rtol=1e-4, atol=1e-6)
    assert grad_local.abs().sum() > 0 and grad_global.abs().sum() > 0
    assert float(push.detach()) > 0  # the hinge takes part: a wrong margin or norm would show
    if alpha < 2:
        assert 0 < int((gaps < alpha).sum()) < len(NAMES)  # active for some classes only

    # the gradient through the SVD is there (or not): the other setting's global gradient differs
    other = FedPHA(alpha=alpha, ratio=ratio, global_weight=weights[0], pull_weight=weights[1], push_weight=weights[2],
                   detach_basis=not detach_basis)
    _, _, other_local, other_global = fedpha_step(model, other, ctx_local, ctx_global, x, labels)
    torch.testing.assert_close(other_local, grad_local, rtol=1e-5, atol=1e-7)  # the same P: the local prompt's alike
    assert (other_global - grad_global).abs().max() > 1e-4 * grad_global.abs().max()


def test_fedphas_evaluation_logits_read_the_local_prompt_only(model):
    """Outside a training step the original returns the local logits (L281); the global prompt has no part."""
    method = FedPHA()
    ctx_local = draw(4, 64, seed=71)
    x = images()
    with torch.no_grad():
        expected = model.logits(model.image_features(x), model.text_features(ctx_local))
        for ctx_global in (draw(4, 64, seed=72), draw(4, 64, seed=73)):
            pieces = {"text_ctx": ctx_global, "text_local": ctx_local}
            text = method.text_side(model, pieces)
            assert text.global_ is None and text.projected is None  # no SVD, no second text pass
            torch.testing.assert_close(method.logits(model, x, pieces, text, client_of(pieces)), expected, rtol=1e-6, atol=1e-6)


def test_fedphas_server_model_classifies_with_the_global_prompt_alone(model):
    """PMFLT's `forward_global`: the averaged global prompt in place of the local one."""
    method = FedPHA()
    start = initial_values(method.pieces(), model, RUN_SEED)
    global_ctx = draw(4, 64, seed=81)
    view = GlobalView({"text_ctx": global_ctx}, {}, start, client_mean=lambda name: draw(4, 64, seed=82))
    held = method.global_model(model, view)
    x = images()
    with torch.no_grad():
        text = method.text_side(model, held.pieces) if held.text is None else held.text
        logits = method.logits(model, x, held.pieces, text, client_of(held.pieces, -1))
        torch.testing.assert_close(logits, model.logits(model.image_features(x), model.text_features(global_ctx)), rtol=1e-6, atol=1e-6)
        local = model.logits(model.image_features(x), model.text_features(start["text_local"]))
    assert (logits - local).abs().max() > 1e-3  # not the personal prompt's init
