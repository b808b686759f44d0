"""FedPGP on the tiny CLIP, by hand: the personalised prompt sigma + U V, and the contrastive term
mean_c -log softmax([cos(f0, fs), cos(fs, fp)] / tau)_0 (TianyuCuiOvO/FedPGP @ d43045b, trainers/fedpgp.py:343-367)."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedur.federated.client import ClientState
from fedur.methods import FedPGP
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP


def test_fedpgp_classifies_with_sigma_plus_uv_and_adds_the_contrastive_term(tiny_clip):
    method = FedPGP(rank=3, mu=0.7, temperature=0.5)
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 4, 0, None, 0.02, seed=2)
    pieces = {n: t.requires_grad_() for n, t in initial_values(method.pieces(), model, 2).items()}
    assert pieces["lowrank_u"].shape == (4, 3) and pieces["lowrank_v"].shape == (3, model.text_context_shape[1])
    assert [name for name, piece in method.pieces().items() if piece.shared] == ["text_ctx"]
    client = ClientState(0, np.arange(2), np.arange(2), pieces)
    text = method.text_side(model, pieces)
    personal = model.text_features(pieces["text_ctx"] + pieces["lowrank_u"] @ pieces["lowrank_v"])
    torch.testing.assert_close(text, personal)

    term = method.penalty(model, pieces, pieces, client, text)
    words = tiny_clip.tokenizer(["X X X X cat."])[0, 1:5]  # CLIP's own "X X X X {class}." as the anchor
    anchor = model.text_features(tiny_clip.model.token_embedding(words)).detach()
    glob, personal = model.text_features(pieces["text_ctx"]).detach(), personal.detach()
    expected = 0.0
    for c in range(3):
        pos, neg = float(anchor[c] @ glob[c]) / 0.5, float(glob[c] @ personal[c]) / 0.5
        expected += -math.log(math.exp(pos) / (math.exp(pos) + math.exp(neg))) / 3
    assert abs(float(term.detach()) - 0.7 * expected) < 1e-5

    term.backward()  # the positive pair moves sigma only; the negative one sigma, U and V
    assert all(float(pieces[n].grad.abs().sum()) > 0 for n in ("text_ctx", "lowrank_u", "lowrank_v"))


def test_fedpgp_without_the_contrastive_term_is_cross_entropy_alone(tiny_clip):
    method = FedPGP(mu=0.0)
    model = PromptedCLIP(tiny_clip, ["cat", "dog"], 2, 0, None, 0.02, seed=1)
    pieces = initial_values(method.pieces(), model, 1)
    client = ClientState(0, np.arange(2), np.arange(2), pieces)
    assert method.penalty(model, pieces, pieces, client, method.text_side(model, pieces)) is None
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = method.logits(model, images, pieces, method.text_side(model, pieces), client)
        image = F.normalize(tiny_clip.model.encode_image(images), dim=-1)
    torch.testing.assert_close(logits, tiny_clip.model.logit_scale.exp() * image @ method.text_side(model, pieces).t())
