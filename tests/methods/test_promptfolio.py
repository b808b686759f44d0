"""PromptFolio's logits on the tiny CLIP, by hand: CLIP's scale x cos(image, (1 - theta) f_global + theta f_local),
the mixture of the two prompts' unit-norm class features not normalised again (PanBikang/PromptFolio @ 8f729aa,
trainers/PromptFolio.py:215-235)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedur.federated.client import ClientState
from fedur.methods import PromptFL, PromptFolio
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP


@pytest.mark.parametrize("theta", [0.4, 0.0, 1.0])
def test_promptfolio_mixes_the_global_and_local_class_features(tiny_clip, theta):
    method = PromptFolio(theta=theta)
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 2, 0, None, 0.02, seed=1)
    pieces = initial_values(method.pieces(), model, 1)
    assert set(pieces) == {"text_ctx", "text_local"} and not torch.equal(pieces["text_ctx"], pieces["text_local"])
    client = ClientState(0, np.arange(2), np.arange(2), pieces)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = method.logits(model, images, pieces, method.text_side(model, pieces), client)
        image = F.normalize(tiny_clip.model.encode_image(images), dim=-1)
        mixed = (1 - theta) * model.text_features(pieces["text_ctx"]) + theta * model.text_features(pieces["text_local"])
        expected = tiny_clip.model.logit_scale.exp() * image @ mixed.t()
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    if 0 < theta < 1:  # the mixture is shorter than a unit vector: not normalised again
        assert float(mixed.norm(dim=-1).max()) < 1 - 1e-3
    if theta == 0:  # the global prompt alone: PromptFL's logits with it
        promptfl = PromptFL()
        with torch.no_grad():
            same = promptfl.logits(model, images, pieces, promptfl.text_side(model, pieces), client)
        torch.testing.assert_close(logits, same)


def test_promptfolio_shares_the_global_prompt_only():
    pieces = PromptFolio().pieces()
    assert pieces["text_ctx"].shared and not pieces["text_local"].shared
