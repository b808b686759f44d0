"""Several clients in one step (run.clients_per_step): the grouped forward of every method is its own
per-client forward, up to rounding, and a subclass that changes the logits can never keep a fused forward
written for other logits."""

import numpy as np
import pytest
import torch

from fedur.federated.client import ClientState
from fedur.labels import CoDPL
from fedur.methods import FedOTP, FedPGP, FedTPG, FedUR, Method, PFedPrompt, PromptFL, PromptFolio
from fedur.methods.base import ClientSide
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


METHODS = [FedUR(), PromptFL(), PFedPrompt(), FedOTP(), PromptFolio(), FedPGP(), FedTPG()]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: type(m).__name__)
def test_the_grouped_forward_equals_each_clients_own(tiny_clip, method):
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 2, 2, None, 0.02, seed=1)
    model.zero_shot_text = model.text_features()
    clients, prompts = clients_and_prompts(model, method, 3)
    images = [torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n)) for n in (2, 1, 3)]
    with torch.no_grad():
        texts = method.group_text_side(model, prompts)
        grouped = method.group_logits(model, images, prompts, texts, clients)
        alone = [method.logits(model, x, p, method.text_side(model, p), c) for x, p, c in zip(images, prompts, clients)]
    assert [g.shape for g in grouped] == [a.shape for a in alone]
    for g, a in zip(grouped, alone):
        torch.testing.assert_close(g, a, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # a client alone takes exactly its own path
        one = method.group_logits(model, images[:1], prompts[:1], method.group_text_side(model, prompts[:1]), clients[:1])
    assert torch.equal(one[0], alone[0])


def test_a_subclass_with_other_logits_must_say_which_grouped_forward_it_takes():
    """A fused forward is written for its class's logits: a subclass with other logits that inherits it is refused
    when the class is made (it used to lose the fused forward without a word); saying 'per_client' gives the
    per-client default, always right."""
    with pytest.raises(TypeError, match="overrides logits but inherits FedUR's fused group_logits"):
        class Scaled(FedUR):  # other logits, no grouped forward of its own
            def logits(self, model, images, pieces, text, client, rows=None):
                return 2 * super().logits(model, images, pieces, text, client, rows)

    with pytest.raises(TypeError, match="overrides text_side but inherits PromptFL's fused group_logits"):
        class OwnText(PromptFL):  # another text side: its fused text pass no longer applies
            def text_side(self, model, pieces):
                return model.text_features(pieces["text_ctx"] * 2)

    class PerClient(FedUR):
        group_forward = "per_client"

        def logits(self, model, images, pieces, text, client, rows=None):
            return 2 * super().logits(model, images, pieces, text, client, rows)

    class Kept(FedUR):  # FedUR's own logits: its fused forward stays
        pass

    with pytest.raises(TypeError, match="writes group_logits but does not declare it"):
        class Undeclared(Method):
            def group_logits(self, model, images, pieces, texts, clients, rows=None):
                return []

    assert FedUR.group_logits is not Method.group_logits and FedUR.group_text_side is not Method.group_text_side
    assert PerClient.group_logits is ClientSide.group_logits and PerClient.group_text_side is ClientSide.group_text_side
    assert Kept.group_logits is FedUR.group_logits
    assert PFedPrompt.group_logits is ClientSide.group_logits  # its logits read each client's cache


def test_the_grouped_text_tower_equals_one_pass_per_context(tiny_clip):
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a very long class name"], 3, 0, None, 0.02, seed=1)
    contexts = torch.randn(4, *model.text_prompt.ctx.shape, generator=torch.Generator().manual_seed(3)) * 0.1
    for shared in (True, False):
        model.shared_prefix_text = shared
        together = model.text_features(contexts)  # (G, C, D)
        each = torch.stack([model.text_features(c) for c in contexts])
        torch.testing.assert_close(together, each, atol=1e-5, rtol=1e-5)


def test_logits_from_a_mixin_are_refused_beside_a_fused_forward():
    class DoubleLogits:
        def logits(self, model, images, pieces, text, client, rows=None):
            return 2 * Method.logits(self, model, images, pieces, text, client, rows)

    with pytest.raises(TypeError, match="Mixed overrides logits but inherits FedUR's fused group_logits"):
        class Mixed(DoubleLogits, FedUR):  # FedUR's fused forward was written for FedUR's logits, not these
            pass


def test_a_method_that_trains_needs_a_labeller():
    class NoLabeller(FedUR):
        def default_labeller(self):
            return None

    with pytest.raises(ValueError, match="trains on pseudo-labels but has no labeller"):
        NoLabeller().pair(None)
    assert type(NoLabeller().pair(CoDPL())).__name__ == "CoDPL"
