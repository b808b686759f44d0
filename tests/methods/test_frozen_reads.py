"""Where a method's image tower carries no prompt, its passes read the frozen-feature cache: decided from the class and
the pieces (`forward.frozen_reads`), nothing declared. For every method fedur has: the logits on cached rows are its
logits on the images, bit for bit, where the decision reads the cache; a method whose tower carries a prompt cannot be
served from it."""

import numpy as np
import pytest
import torch

from examples.feature_adapter import FeatureAdapter
from fedur import plugins
from fedur.federated.client import ClientState
from fedur.methods import FedUR, Method, forward
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP
from fedur.model.frozen import FrozenImages, FrozenTowerError, cat_images

METHODS = [cls() for cls in plugins.builtin("method")] + [FeatureAdapter()]


def model_of(tiny_clip, visual_tokens: int = 2) -> PromptedCLIP:
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 2, visual_tokens, None, 0.02, seed=1)
    model.zero_shot_text = model.text_features()
    return model


def cached(model: PromptedCLIP, images: torch.Tensor) -> FrozenImages:
    """The rows the cache holds for `images`: what the tower gives them without a prompt."""
    return FrozenImages(model.image_features(images, prompted=False), model.image_tokens(images))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("method", METHODS, ids=lambda m: type(m).__name__)
def test_cached_rows_give_the_logits_images_give_wherever_the_cache_is_read(tiny_clip, method, training):
    model = model_of(tiny_clip)
    pieces = initial_values(method.pieces(), model, 1)
    reads = forward.frozen_reads(method, model, pieces)
    client = ClientState(0, np.arange(4), np.arange(2), pieces)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    model.train(training)
    with torch.no_grad():
        rows = cached(model, images)
        text = method.text_side(model, pieces)
        if reads is None:  # a prompt reaches the tower: only images can be scored
            with pytest.raises(FrozenTowerError, match="data.feature_cache=false"):
                method.logits(model, rows, pieces, text, client, None)
            return
        kept = rows if reads == "tokens" else FrozenImages(rows.features)  # what the cache is built with
        on_images = method.logits(model, images, pieces, text, client, torch.arange(4))
        on_rows = method.logits(model, kept, pieces, method.text_side(model, pieces), client, torch.arange(4))
    assert torch.equal(on_rows, on_images)


def test_fedurs_and_the_visual_prompt_methods_read_images_the_text_side_methods_the_cache(tiny_clip):
    """The issue's count: 14 of fedur's 19 methods run a tower without a prompt; FedOTP reads its output tokens."""
    model = model_of(tiny_clip)
    reads = {type(m).__name__: forward.frozen_reads(m, model, initial_values(m.pieces(), model, 1)) for m in METHODS}
    assert {name for name, r in reads.items() if r is None} == {"FedUR", "FedCoPL", "SCAFFOLD", "FedMaPLe", "FedPromptSRC",
                                                               "FeatureAdapter"}
    assert {name for name, r in reads.items() if r == "tokens"} == {"FedOTP"}
    assert sum(r is not None for name, r in reads.items() if name != "FeatureAdapter") == 14
    no_tokens = model_of(tiny_clip, visual_tokens=0)  # FedUR without visual tokens: its tower carries no prompt
    assert forward.frozen_reads(FedUR(), no_tokens, initial_values(FedUR().pieces(), no_tokens, 1)) == "features"


class TextFirst(Method):  # its logits read the text side before the tower: the probe cannot see, so images are read
    def logits(self, model, images, pieces, text, client, rows=None):
        classes = text.float()
        return model.logits(model.image_features(images, visual=None), classes)


class FeaturesThenTokens(Method):  # both of the tower's outputs, features first
    def logits(self, model, images, pieces, text, client, rows=None):
        pooled = model.image_features(images, prompted=False)
        patches = model.image_tokens(images)[:, 1:].mean(dim=1)
        return model.logits(pooled + patches, text)


class Silent(Method):  # asks the tower for nothing
    def logits(self, model, images, pieces, text, client, rows=None):
        return torch.zeros(len(images), model.num_classes)


def test_what_the_probe_cannot_see_reads_images(tiny_clip):
    model = model_of(tiny_clip, visual_tokens=0)
    assert forward.frozen_reads(TextFirst(), model, initial_values(TextFirst().pieces(), model, 1)) is None
    assert forward.frozen_reads(Silent(), model, initial_values(Silent().pieces(), model, 1)) is None
    assert forward.frozen_reads(FeaturesThenTokens(), model, initial_values(FeaturesThenTokens().pieces(), model, 1)) == "tokens"
    model.train()
    forward.frozen_reads(FeaturesThenTokens(), model, initial_values(FeaturesThenTokens().pieces(), model, 1))
    assert model.training  # the probe runs in evaluation mode and leaves the mode as it was


def test_frozen_images_move_split_and_join_like_image_tensors(tiny_clip):
    model = model_of(tiny_clip)
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    rows = cached(model, images)
    parts = rows.split([2, 3])
    assert [len(p) for p in parts] == [2, 3] and rows.device == torch.device("cpu")
    joined = cat_images(parts)
    assert torch.equal(joined.features, rows.features) and torch.equal(joined.tokens, rows.tokens)
    assert torch.equal(cat_images([images[:2], images[2:]]), images)
    moved = rows.to("cpu")
    assert torch.equal(model.image_features(moved), rows.features)  # a call with no prompt: the cached features
    assert torch.equal(model.image_tokens(moved), rows.tokens)
    visual = initial_values({"visual": FedUR().pieces()["visual"]}, model, 1)["visual"]
    with pytest.raises(FrozenTowerError, match="prompted pass"):
        model.image_features(moved, visual=visual)
    with pytest.raises(FrozenTowerError, match="tokens"):
        model.image_tokens(FrozenImages(rows.features))
