"""Several clients in one step (run.clients_per_step): the grouped forward of every method is its own
per-client forward, up to rounding, decided from the method's class with nothing declared: a class with logits of
its own (or a text side of its own) is computed once per client, whatever it inherits."""

import numpy as np
import pytest
import torch

from fedur import plugins
from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import CoDPL
from fedur.methods import FedUR, Method, PFedPrompt, PromptFL, forward
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP


def clients_and_prompts(model: PromptedCLIP, method: Method, count: int) -> tuple[list[ClientState], list[dict]]:
    """`count` clients with prompts of their own (seeded), as a round hands them to the grouped forward."""
    generator = torch.Generator().manual_seed(7)
    prompts = []
    for _ in range(count):
        own = initial_values(method.pieces(), model, 1)
        prompts.append({n: t + 0.05 * torch.randn(t.shape, generator=generator) for n, t in own.items()})
    clients = [ClientState(k, np.arange(3), np.arange(2), p) for k, p in enumerate(prompts)]
    return clients, prompts


class Scaled(FedUR):  # logits of its own: never FedUR's fused forward
    def logits(self, model, images, pieces, text, client, rows=None):
        return 2 * super().logits(model, images, pieces, text, client, rows)


class OwnText(PromptFL):  # a text side of its own: the base's fused logits still apply, not the fused text pass
    def text_side(self, model, pieces):
        return model.text_features(pieces["text_ctx"] * 2)


class DoubleLogits:
    def logits(self, model, images, pieces, text, client, rows=None):
        return 2 * Method.logits(self, model, images, pieces, text, client, rows)


class Mixed(DoubleLogits, FedUR):  # logits from a mixin, before FedUR's in the MRO
    pass


TRAINABLE = [cls for cls in plugins.builtin("method") if cls.trains]


@pytest.mark.parametrize("method", [cls() for cls in TRAINABLE] + [Scaled(), OwnText(), Mixed()],
                         ids=lambda m: type(m).__name__)
def test_the_grouped_forward_equals_each_clients_own(tiny_clip, method):
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 2, 2, None, 0.02, seed=1)
    model.zero_shot_text = model.text_features()
    clients, prompts = clients_and_prompts(model, method, 3)
    images = [torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n)) for n in (2, 1, 3)]
    with torch.no_grad():
        texts = forward.text_sides(method, model, prompts)
        grouped = forward.group_logits(method, model, images, prompts, texts, clients)
        alone = [method.logits(model, x, p, method.text_side(model, p), c) for x, p, c in zip(images, prompts, clients)]
    assert [g.shape for g in grouped] == [a.shape for a in alone]
    for g, a in zip(grouped, alone):
        torch.testing.assert_close(g, a, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # a client alone takes exactly its own path
        one = forward.group_logits(method, model, images[:1], prompts[:1], forward.text_sides(method, model, prompts[:1]),
                                   clients[:1])
    assert torch.equal(one[0], alone[0])


def test_what_is_fused_is_read_from_the_class():
    """The base's logits (FedUR's, PromptFL's, FedTPG's with its own text side) fuse the image tower; a class with
    logits of its own (pFedPrompt's cache, a subclass's, a mixin's) never does, and says nothing to get there."""
    assert forward.default_logits(FedUR()) and forward.default_text_side(FedUR())
    assert not forward.default_logits(Scaled()) and not forward.default_logits(Mixed()) and not forward.default_logits(PFedPrompt())
    assert forward.default_logits(OwnText()) and not forward.default_text_side(OwnText())
    assert not hasattr(Method, "group_logits") and not hasattr(Method, "group_forward")


def test_the_grouped_text_tower_equals_one_pass_per_context(tiny_clip):
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a very long class name"], 3, 0, None, 0.02, seed=1)
    contexts = torch.randn(4, *model.text_prompt.ctx.shape, generator=torch.Generator().manual_seed(3)) * 0.1
    for shared in (True, False):
        model.shared_prefix_text = shared
        together = model.text_features(contexts)  # (G, C, D)
        each = torch.stack([model.text_features(c) for c in contexts])
        torch.testing.assert_close(together, each, atol=1e-5, rtol=1e-5)


def test_a_method_that_trains_needs_a_labeller():
    class NoLabeller(FedUR):
        def default_labeller(self):
            return None

    with pytest.raises(ConfigError, match="trains on pseudo-labels but has no labeller"):
        NoLabeller().pair(None)
    assert type(NoLabeller().pair(CoDPL())).__name__ == "CoDPL"
