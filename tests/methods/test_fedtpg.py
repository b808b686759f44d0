"""FedTPG's prompt generator against a transcription of the original's (boschresearch/FedTPG @ f141c29,
model/prompt_net.py L26-171: PreNorm, GEGLU, FeedForward, CrossAttention, PromptTranslator at depth 0, einops'
`repeat` written as `expand`): built under the same seed it holds the same weights, and with them it writes the same
context; every weight is a shared piece, seeded once; a client that trains conditions it on its own classes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedur.federated.client import ClientState
from fedur.labels.base import PseudoLabels
from fedur.methods import FedTPG
from fedur.methods.fedtpg import PREFIX, generate, reference_init, shapes
from fedur.methods.pieces import initial_values, piece_seed
from fedur.model.classifier import PromptedCLIP


# --- the original's generator, transcribed --------------------------------------------------------------------------
class PreNorm(nn.Module):
    def __init__(self, dim, fn, context_dim=None):
        super().__init__()
        self.fn = fn
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if context_dim is not None else None

    def forward(self, x_q, x_kv=None, **kwargs):
        x_q = self.norm(x_q)
        x_kv = self.norm_context(x_kv) if x_kv is not None else x_q
        return self.fn(x_q, x_kv, x_kv, **kwargs)


class GEGLU(nn.Module):
    def forward(self, x):
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * mult * 2), GEGLU(), nn.Linear(dim * mult, dim))

    def forward(self, x):
        return self.net(x)


class CrossAttention(nn.Module):
    def __init__(self, latent_dim, kv_dim, cross_heads=4, seq_dropout_prob=0.0):
        super().__init__()
        self.cross_attend_blocks = nn.ModuleList([
            PreNorm(latent_dim, nn.MultiheadAttention(latent_dim, num_heads=cross_heads, kdim=kv_dim, vdim=kv_dim,
                                                      dropout=seq_dropout_prob, batch_first=True), context_dim=kv_dim),
            FeedForward(latent_dim)])

    def forward(self, data, soft_prompt, mask=None):
        x = soft_prompt.unsqueeze(0).expand(data.shape[0], -1, -1)  # repeat(soft_prompt, 'n d -> b n d', b=b)
        cross_attn, cross_ff = self.cross_attend_blocks
        x, _ = cross_attn(x, data, key_padding_mask=mask)
        return cross_ff(x) + x


class PromptTranslator(nn.Module):
    def __init__(self, prompt_len, prompt_depth, prompt_dim=512, depth=4, self_heads=4, cross_heads=4, textemb_dim=512):
        super().__init__()
        self.prompt_len, self.prompt_depth = prompt_len, prompt_depth
        soft_prompt = torch.empty(prompt_len * prompt_depth, prompt_dim)
        nn.init.normal_(soft_prompt, std=0.02)
        self.soft_prompt = nn.Parameter(soft_prompt)
        self.encoder = CrossAttention(latent_dim=prompt_dim, kv_dim=textemb_dim, cross_heads=cross_heads)
        assert depth == 0  # FedTPG's setting (cfg.MODEL.DEPTH 0): no self-attention blocks
        self.depth = depth

    def forward(self, text_emb):
        prompt = self.encoder(text_emb, self.soft_prompt)
        prompt = prompt.reshape(self.prompt_depth, self.prompt_len, -1)
        return prompt, prompt


def reference_translator(n_ctx, width, text_dim, heads, seed):
    torch.manual_seed(seed)
    return PromptTranslator(n_ctx, 1, prompt_dim=width, depth=0, cross_heads=heads, textemb_dim=text_dim)


def as_fedur(translator: PromptTranslator) -> dict[str, torch.Tensor]:
    """The transcription's weights under the names of fedur's generator."""
    attention_block, feed_forward = translator.encoder.cross_attend_blocks
    attention = attention_block.fn
    if attention._qkv_same_embed_dim:
        q, k, v = attention.in_proj_weight.chunk(3)
    else:
        q, k, v = attention.q_proj_weight, attention.k_proj_weight, attention.v_proj_weight
    qb, kb, vb = attention.in_proj_bias.chunk(3)
    net = feed_forward.net
    return {k_: t.detach() for k_, t in {
        "soft_prompt": translator.soft_prompt, "norm.weight": attention_block.norm.weight, "norm.bias": attention_block.norm.bias,
        "norm_context.weight": attention_block.norm_context.weight, "norm_context.bias": attention_block.norm_context.bias,
        "query.weight": q, "query.bias": qb, "key.weight": k, "key.bias": kb, "value.weight": v, "value.bias": vb,
        "out.weight": attention.out_proj.weight, "out.bias": attention.out_proj.bias,
        "ff_norm.weight": net[0].weight, "ff_norm.bias": net[0].bias, "ff_in.weight": net[1].weight,
        "ff_in.bias": net[1].bias, "ff_out.weight": net[3].weight, "ff_out.bias": net[3].bias}.items()}


# --- the tests --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text_dim", [64, 48])  # one packed q/k/v matrix (the original's 512 = 512), and three
def test_the_generator_starts_from_the_weights_the_originals_module_draws(text_dim):
    expected = as_fedur(reference_translator(4, 64, text_dim, 4, seed=3007))
    ours = reference_init(4, 64, text_dim, 4, seed=3007)
    assert ours.keys() == expected.keys()
    for name in ours:
        assert torch.equal(ours[name], expected[name]), name


def test_query_key_and_value_share_one_xavier_bound_at_vit_b_width():
    """At the original's d = 512 the packed (3d x d) matrix's xavier std is sqrt(2 / 4d) = 0.0312 (three d x d: 0.0442)."""
    weights = reference_init(4, 512, 512, 4, seed=1)
    for name in ("query.weight", "key.weight", "value.weight"):
        assert float(weights[name].std()) == pytest.approx((2 / (4 * 512)) ** 0.5, rel=0.02)


def test_fedtpg_writes_the_context_the_original_writes_from_the_class_names(tiny_clip):
    method = FedTPG(heads=4)
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 4, 0, None, 0.02, seed=3)
    pieces = initial_values(method.pieces(), model, 3)
    assert all(piece.shared for piece in method.pieces().values()) and all(n.startswith(PREFIX) for n in pieces)
    assert pieces[PREFIX + "soft_prompt"].shape == model.text_context_shape
    seed = piece_seed(3, PREFIX + "soft_prompt", method.pieces()[PREFIX + "soft_prompt"])
    translator = reference_translator(*shapes(model), 4, seed)
    for name, value in as_fedur(translator).items():  # every piece from the one seeded build
        assert torch.equal(pieces[PREFIX + name], value), name

    names = F.normalize(tiny_clip.model.encode_text(tiny_clip.tokenizer(["cat", "dog", "a red bird"])), dim=-1).detach()
    torch.testing.assert_close(model.name_features(torch.device("cpu")), names)
    with torch.no_grad():
        text_ctx, _ = translator(names.unsqueeze(0))  # (1, n_ctx, width): the client's context
        torch.testing.assert_close(generate(model, pieces, 4), text_ctx[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(method.text_side(model, pieces), model.text_features(text_ctx[0]), rtol=1e-5, atol=1e-6)

    trained = {n: t.clone().requires_grad_() for n, t in pieces.items()}
    method.text_side(model, trained).sum().backward()  # the gradient reaches every generator weight
    assert all(t.grad is not None and float(t.grad.abs().sum()) > 0 for t in trained.values())


def test_other_class_names_get_another_context(tiny_clip):
    method = FedTPG()
    a = PromptedCLIP(tiny_clip, ["cat", "dog"], 4, 0, None, 0.02, seed=3)
    b = PromptedCLIP(tiny_clip, ["truck", "ship"], 4, 0, None, 0.02, seed=3)
    pieces = initial_values(method.pieces(), a, 3)
    with torch.no_grad():
        assert not torch.allclose(generate(a, pieces, 4), generate(b, pieces, 4))


def client_with_labels(labels: list[int], num_classes: int) -> ClientState:
    n = len(labels)
    pseudo = PseudoLabels(torch.arange(n), torch.tensor(labels), torch.zeros(n, num_classes, dtype=torch.bool))
    return ClientState(0, np.arange(n), np.arange(0), {}, pseudo_labels=pseudo)


@torch.no_grad()
def test_a_training_client_conditions_on_and_classifies_among_its_own_classes(tiny_clip):
    """classes 'selected': in a training step the context comes from the names of the classes the client's
    pseudo-labels select, and the others are out of its softmax (the original's client with its own classes);
    every other pass conditions on every class."""
    names = ["cat", "dog", "a red bird", "ship"]
    model = PromptedCLIP(tiny_clip, names, 4, 0, None, 0.02, seed=3)
    method = FedTPG()
    pieces = initial_values(method.pieces(), model, 3)
    images = torch.rand(5, 3, 32, 32)
    client = client_with_labels([0, 2, 2, 0, 3], len(names))
    text = method.text_side(model, pieces)
    assert not model.training  # pseudo-labelling and evaluation: every class, unrestricted
    everywhere = method.logits(model, images, pieces, text, client)
    torch.testing.assert_close(everywhere, model.logits(model.image_features(images), text))

    model.train()
    try:
        own = method.logits(model, images, pieces, text, client)
        every = FedTPG(classes="all").logits(model, images, pieces, text, client)
    finally:
        model.eval()
    assert torch.isneginf(own[:, 1]).all() and torch.isfinite(own[:, [0, 2, 3]]).all()
    mine = torch.tensor([True, False, True, True])
    seed = piece_seed(3, PREFIX + "soft_prompt", method.pieces()[PREFIX + "soft_prompt"])
    own_names = model.name_features(torch.device("cpu"))[mine].unsqueeze(0)  # the original's client: its names only
    context = reference_translator(*shapes(model), 4, seed)(own_names)[0][0]
    torch.testing.assert_close(generate(model, pieces, 4, mine), context, rtol=1e-5, atol=1e-6)
    expected = model.logits(model.image_features(images), model.text_features(context))
    torch.testing.assert_close(own[:, mine], expected[:, mine])
    assert not torch.allclose(own[:, mine], everywhere[:, mine])  # another context than every class's
    torch.testing.assert_close(every, everywhere)  # 'all': as in evaluation


def test_fedtpgs_presets_keep_each_clients_sgd_across_rounds():
    """The original builds each client's SGD once (federated/client.py L86-88) and copies the global weights into its
    model in place (L121-122): its momentum survives from round to round, optim.optimizer_state client, in the
    published preset and the demo one; and it averages uniformly."""
    import yaml

    from fedur import plugins

    for path in (plugins.configs_dir() / "presets" / "fedtpg.yaml", plugins.demo_preset(FedTPG)):
        preset = yaml.safe_load(path.read_text())
        assert preset["optim"]["optimizer_state"] == "client", path
        assert preset["method"]["init_args"]["weighting"] == "uniform", path
