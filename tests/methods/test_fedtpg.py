"""FedTPG's prompt generator on the tiny CLIP: the context it writes from the bare class names, run with a
client's weights, equals the generator module's own forward; every weight is a shared piece, seeded once."""

import torch
import torch.nn.functional as F

from fedur.methods import FedTPG
from fedur.methods.fedtpg import PREFIX, generator_for, shapes
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP


def test_fedtpg_writes_the_context_from_the_class_names_with_the_clients_weights(tiny_clip):
    method = FedTPG(heads=4)
    model = PromptedCLIP(tiny_clip, ["cat", "dog", "a red bird"], 4, 0, None, 0.02, seed=3)
    pieces = initial_values(method.pieces(), model, 3)
    assert all(piece.shared for piece in method.pieces().values()) and all(n.startswith(PREFIX) for n in pieces)
    assert pieces[PREFIX + "soft_prompt"].shape == model.text_context_shape
    assert torch.equal(initial_values(method.pieces(), model, 3)[PREFIX + "ff_in.weight"], pieces[PREFIX + "ff_in.weight"])

    generator = generator_for(*shapes(model), 4, device="cpu")  # the module itself, loaded with the same weights
    generator.load_state_dict({name[len(PREFIX):]: t for name, t in pieces.items()})
    names = F.normalize(tiny_clip.model.encode_text(tiny_clip.tokenizer(["cat", "dog", "a red bird"])), dim=-1).detach()
    torch.testing.assert_close(model.name_features(torch.device("cpu")), names)
    with torch.no_grad():
        expected = model.text_features(generator(names))
        text = method.text_side(model, pieces)
    torch.testing.assert_close(text, expected)

    trained = {n: t.clone().requires_grad_() for n, t in pieces.items()}
    method.text_side(model, trained).sum().backward()  # the gradient reaches every generator weight
    assert all(t.grad is not None and float(t.grad.abs().sum()) > 0 for t in trained.values())


def test_other_class_names_get_another_context(tiny_clip):
    method = FedTPG()
    a = PromptedCLIP(tiny_clip, ["cat", "dog"], 4, 0, None, 0.02, seed=3)
    b = PromptedCLIP(tiny_clip, ["truck", "ship"], 4, 0, None, 0.02, seed=3)
    pieces = initial_values(method.pieces(), a, 3)
    from fedur.methods.fedtpg import generate
    with torch.no_grad():
        assert not torch.allclose(generate(a, pieces, 4), generate(b, pieces, 4))
