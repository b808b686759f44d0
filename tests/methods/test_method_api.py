"""The method API on hand-written tensors: SCAFFOLD's hooks against the paper's Algorithm 1, the pieces'
initial values, what a method prints, and the server's metrics."""

import numpy as np
import pytest
import torch

from examples.server_momentum import ServerMomentum
from fedur.errors import PluginError
from fedur.federated.client import ClientState
from fedur.methods import SCAFFOLD, Aggregated, FedUR, LocalRound, LocalStep, PFedPrompt, Piece, ServerRound
from fedur.methods.pieces import initial_values, piece_seed
from fedur.model.prompts import init_prompt

SHAPE = (2, 3)


def quadratic_targets(num_clients: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(SHAPE, generator=generator, dtype=torch.float64) for _ in range(num_clients)]


def textbook_scaffold(targets, x, rounds, steps, lr, server_lr, participants, federation=None):
    """Karimireddy et al. 2020, Algorithm 1 with option II, on f_k(y) = |y - a_k|^2 / 2 (gradient y - a_k):
    y <- y - lr (g(y) - c_k + c); c_k+ = c_k - c + (x - y) / (K lr); x <- x + server_lr * mean(dy);
    c <- c + |S| / N * mean(dc) over the participants S, N the federation's clients (`federation`; default: all)."""
    n = len(targets) if federation is None else federation
    c, cs = torch.zeros_like(x), [torch.zeros_like(x) for _ in targets]
    for r in range(rounds):
        dys, dcs = [], []
        for k in participants[r]:
            y = x.clone()
            for _ in range(steps):
                y = y - lr * ((y - targets[k]) - cs[k] + c)
            new = cs[k] - c + (x - y) / (steps * lr)
            dys.append(y - x)
            dcs.append(new - cs[k])
            cs[k] = new
        x = x + server_lr * torch.stack(dys).mean(0)
        c = c + len(participants[r]) / n * torch.stack(dcs).mean(0)
    return x, c, cs


def fedur_scaffold(method, targets, x, rounds, steps, lr, participants, training=None):
    """The same through fedur's hooks, in the round loop's order: before_step between backward and the
    optimizer's step, after_step after it; upload with the LocalRound; aggregate (`training`: the federation's
    clients, as the round loop hands it); every client downloads. The clients' selected pseudo-label counts differ,
    and the method's own weighting (`client_weights`) weighs their uploads, as in the round loop."""
    n = len(targets)
    clients = [ClientState(k, np.arange(2), np.arange(2), {"visual": x.clone(), "text_ctx": torch.zeros(0)}) for k in range(n)]
    shared, state = {"visual": x.clone()}, {}
    selected = torch.arange(1, n + 1, dtype=torch.float64) * 7  # unequal |D~_k|
    for r in range(rounds):
        joined = torch.zeros(n, dtype=torch.float64)
        joined[participants[r]] = 1.0
        weights = method.client_weights(selected, selected) * joined
        uploads = {name: torch.zeros(n, *SHAPE, dtype=torch.float64) for name in ("visual", "dc_visual")}
        for k in participants[r]:
            client = clients[k]
            start = dict(client.pieces)
            y = client.pieces["visual"].clone().requires_grad_()
            optimizer = torch.optim.SGD([y], lr=lr, momentum=0.0, weight_decay=0.0)
            for t in range(steps):
                optimizer.zero_grad()
                (0.5 * (y - targets[k]).pow(2).sum()).backward()
                step = LocalStep(client, {"visual": y}, ("visual",), t, 0, lr, optimizer)
                method.before_step(step)
                optimizer.step()
                method.after_step(step)
            client.pieces = {**client.pieces, "visual": y.detach().clone()}
            sent = method.upload(client, None, LocalRound(start, steps, steps * lr))
            for name in uploads:
                uploads[name][k] = sent[name]
        result = method.aggregate(ServerRound(r + 1, rounds, uploads, weights, shared, state, training))
        shared, state = result.shared, result.state
        for client in clients:
            method.download(client, shared, state)
    return shared["visual"], state["c_visual"], [c.extra["c_local_visual"] for c in clients], result.metrics


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_scaffold_through_the_hooks_is_algorithm_1_with_plain_sgd(server_lr):
    targets = quadratic_targets(3)
    x0 = torch.zeros(SHAPE, dtype=torch.float64)
    participants = [[0, 1, 2], [0, 2], [1, 2]]  # a client that sits a round out keeps its c_k
    expected = textbook_scaffold(targets, x0, 3, 4, 0.1, server_lr, participants)
    method = SCAFFOLD(server_lr=server_lr)  # its default weighting: uniform, Algorithm 1's mean
    x, c, cs, metrics = fedur_scaffold(method, targets, x0, 3, 4, 0.1, participants)
    torch.testing.assert_close(x, expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, expected[1], rtol=1e-12, atol=1e-12)
    for ours, theirs in zip(cs, expected[2]):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert metrics["control_norm_visual"] == pytest.approx(float(expected[1].norm()))
    assert float(c.norm()) > 0.1  # the control variates are not trivially zero


def test_scaffold_counts_the_federations_clients_not_the_new_ones_held_out():
    """N in c's step is the federation's: with client 3 held out of every round (evaluation.new_clients), Algorithm 1
    over the three that train; and a new client that adapts alone corrects by c (its c_k = 0), or with
    new_clients 'none' takes plain steps."""
    targets = quadratic_targets(4)
    x0 = torch.zeros(SHAPE, dtype=torch.float64)
    participants = [[0, 1, 2], [0, 2], [1, 2]]
    expected = textbook_scaffold(targets[:3], x0, 3, 4, 0.1, 1.0, participants)
    training = torch.tensor([True, True, True, False])
    x, c, cs, _ = fedur_scaffold(SCAFFOLD(), targets, x0, 3, 4, 0.1, participants, training)
    torch.testing.assert_close(x, expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, expected[1], rtol=1e-12, atol=1e-12)
    counted_all = textbook_scaffold(targets, x0, 3, 4, 0.1, 1.0, participants)  # N = 4: each step of c 3/4 as large
    assert not torch.allclose(c, counted_all[1], atol=1e-6)

    for setting, corrected in (("control", True), ("none", False)):
        method = SCAFFOLD(new_clients=setting)
        state = {"c_visual": c, "federation": training}
        new = ClientState(3, np.arange(2), np.arange(2), {"visual": x.clone(), "text_ctx": torch.zeros(0)})
        method.download(new, {"visual": x}, state)
        y = x.clone().requires_grad_()
        (0.5 * (y - targets[3]).pow(2).sum()).backward()
        plain = y.grad.clone()
        method.before_step(LocalStep(new, {"visual": y}, ("visual",), 0, 0, 0.1, torch.optim.SGD([y], lr=0.1)))
        torch.testing.assert_close(y.grad, plain + c if corrected else plain)


def test_scaffold_without_the_correction_would_not_match():
    """The test above can fail: FedAvg (no correction) on the same problem ends elsewhere."""
    targets = quadratic_targets(3)
    x0 = torch.zeros(SHAPE, dtype=torch.float64)
    participants = [[0, 1, 2], [0, 2], [1, 2]]
    expected = textbook_scaffold(targets, x0, 3, 4, 0.1, 1.0, participants)

    class NoCorrection(SCAFFOLD):
        def before_step(self, step):
            pass

    x, *_ = fedur_scaffold(NoCorrection(weighting="uniform"), targets, x0, 3, 4, 0.1, participants)
    assert not torch.allclose(x, expected[0], atol=1e-4)


def test_fedurs_prompts_start_from_the_values_of_the_fixed_slots_they_replace(tiny_clip):
    """The declared visual prompt and text context are the old slots' inits (seed * 1000 + 2 and + 1), so every
    run starts where it did; a piece of a method's own gets a seed of its name, the same everywhere."""
    from fedur.methods import FedOTP
    from fedur.model.classifier import PromptedCLIP

    model = PromptedCLIP(tiny_clip, ["cat", "dog"], 3, 2, None, 0.02, seed=4)
    start = initial_values(FedOTP().pieces(), model, 4) | initial_values(FedUR().pieces(), model, 4)
    assert torch.equal(start["visual"], init_prompt(model.visual_prompt_shape, 0.02, 4 * 1000 + 2))
    assert torch.equal(start["text_ctx"], init_prompt((3, model.text_context_shape[1]), 0.02, 4 * 1000 + 1))
    assert torch.equal(start["text_local"], init_prompt((3, model.text_context_shape[1]), 0.02, 4 * 1000 + 3))
    own = Piece(lambda m, seed: torch.randn(2, generator=torch.Generator().manual_seed(seed)))
    assert piece_seed(4, "adapter", own) == piece_seed(4, "adapter", own) != piece_seed(4, "other", own)
    assert 4000 + 100 <= piece_seed(4, "adapter", own) < 4000 + 1000
    with pytest.raises(PluginError, match="piece 'bad': its init must return a tensor"):
        initial_values({"bad": Piece(lambda m, seed: [0.0])}, model, 4)


def test_a_method_prints_its_settings_not_its_bookkeeping():
    method = PFedPrompt(cache_shots=4)
    method.scratch = torch.zeros(1000)  # something a method keeps for itself
    text = repr(method)
    assert text.startswith("PFedPrompt(") and "cache_shots=4" in text and "weighting='selected'" in text
    assert "scratch" not in text


def test_server_momentum_returns_its_velocity_as_state_and_its_norm_as_a_metric():
    method = ServerMomentum(server_lr=1.0, momentum=0.5)
    uploads = {"visual": torch.tensor([[1.0, 1.0], [3.0, 3.0]])}
    first = method.aggregate(ServerRound(1, 2, uploads, torch.tensor([1.0, 1.0]), {"visual": torch.zeros(2)}, {}))
    assert isinstance(first, Aggregated)
    torch.testing.assert_close(first.state["velocity_visual"], torch.tensor([-2.0, -2.0]))  # 0 - mean
    torch.testing.assert_close(first.shared["visual"], torch.tensor([2.0, 2.0]))
    assert float(first.metrics["velocity_norm_visual"]) == pytest.approx(8 ** 0.5)
    second = method.aggregate(ServerRound(2, 2, uploads, torch.tensor([1.0, 1.0]), first.shared, first.state))
    torch.testing.assert_close(second.state["velocity_visual"], torch.tensor([-1.0, -1.0]))  # 0.5 * -2 + (2 - 2)
