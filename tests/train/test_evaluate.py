"""Every protocol at the cost of one: where the server's model scores the same image features as the clients' models,
the global protocol reads the personal pass (each test image through the image tower once), with the counts a pass of
its own would give; where it does not, it has a pass of its own. Counted on the tiny model, one process."""

from __future__ import annotations

import pytest
import torch

from fedur.app.cli import parse_config
from fedur.federated.collectives import Collectives
from fedur.model.classifier import PromptedCLIP
from fedur.train.evaluate import evaluate_global, evaluate_round, global_model_of, ready, shares_pass
from fedur.train.progress import QUIET
from fedur.train.server import ServerState
from fedur.train.setup import setup

from ..test_device_guards import StubFabric

pytestmark = pytest.mark.slow  # a rank set up per case (a second each): not in the fast lane


def host_of(*flags: str):
    cfg = parse_config(["--config", "configs/tiny.yaml", *flags])
    fabric = StubFabric(torch.device("cpu"))
    host = setup(fabric, Collectives(fabric), cfg, QUIET)[0]
    server = ServerState.start(host.method, host.model, host.start)
    for client in host.clients:  # after a download: every client holds the global pieces
        host.method.download(client, server.shared, server.method)
    return host, server


@pytest.fixture
def encoded(monkeypatch):
    """The images each call of the image tower encodes, counted."""
    counts = []
    features, tokens = PromptedCLIP.image_features, PromptedCLIP.image_tokens

    def counting(original):
        def call(self, images, *args, **kwargs):
            counts.append(len(images))
            return original(self, images, *args, **kwargs)
        return call

    monkeypatch.setattr(PromptedCLIP, "image_features", counting(features))
    monkeypatch.setattr(PromptedCLIP, "image_tokens", counting(tokens))
    return counts


@pytest.mark.parametrize("method, shares", [("FedUR", True), ("PromptFL", True), ("FedPGP", True), ("GDAU", True),
                                            ("PFedPrompt", False), ("FedOTP", False)])
def test_the_global_protocol_reads_the_personal_pass_where_the_image_features_are_the_same(method, shares, encoded):
    host, server = host_of("--method", method)
    if method == "GDAU":  # the classifier every client downloads after the first round, the server's own
        dim, classes = host.model.zero_shot_text.shape[1], host.model.num_classes
        server.method = {"W": torch.randn(classes, dim, dtype=torch.float64), "b": torch.zeros(classes, dtype=torch.float64)}
        for client in host.clients:
            host.method.download(client, server.shared, server.method)
    if method == "PFedPrompt":  # its cache of each client's pseudo-labelled features, as after a refresh
        dim = host.model.zero_shot_text.shape[1]
        for client in host.clients:
            client.extra = {"cache_keys": torch.nn.functional.normalize(torch.randn(4, dim)),
                            "cache_labels": torch.arange(4) % 2, "cache_rows": torch.arange(4)}
    assert shares_pass(host, ready(host, global_model_of(host, server, host.model), host.model)) is shares
    tested = sum(len(c.test_indices) for c in host.clients)
    encoded.clear()
    with torch.no_grad():
        evaluation = evaluate_round(host, server)
    assert sum(encoded) == tested * (1 if shares else 2)  # one pass per test image, or the server's own beside
    own = evaluate_global(host, ready(host, global_model_of(host, server, host.model), host.model))
    assert torch.equal(evaluation.global_counts, own)  # the counts a pass of its own gives
    assert int(evaluation.global_counts[1]) == len(host.global_rows)


def test_a_personal_visual_prompt_gives_the_server_a_pass_of_its_own(encoded):
    """FedUR with share none: each client's visual prompt is its own, so its image features are not the server's."""
    host, server = host_of("--method.share", "none")
    for k, client in enumerate(host.clients):
        client.pieces = {**client.pieces, "visual": client.pieces["visual"] + 0.01 * (k + 1)}
    assert not shares_pass(host, ready(host, global_model_of(host, server, host.model), host.model))
    encoded.clear()
    with torch.no_grad():
        evaluate_round(host, server)
    assert sum(encoded) == 2 * sum(len(c.test_indices) for c in host.clients)


def test_a_test_image_several_clients_hold_is_scored_once_for_the_server(encoded):
    """With every client tested on the whole test set (ImageFolder-like shared test sets), the union is the test set
    and each image counts once for the server's model, for the lowest-id client that holds it."""
    host, server = host_of()
    every = host.clients[0].test_indices
    for client in host.clients:
        client.test_indices = every
    host.test_owners[:] = -1
    host.test_owners[every] = 0
    with torch.no_grad():
        evaluation = evaluate_round(host, server)
    assert int(evaluation.global_counts[1]) == len(every)
    assert torch.equal(evaluation.global_counts, evaluate_global(host, ready(host, global_model_of(host, server, host.model),
                                                                              host.model)))


@pytest.mark.parametrize("method, shares", [("FedUR", True), ("FedOTP", False)])
def test_a_validation_split_costs_one_pass_over_it_per_model_and_the_estimates_read_the_passes(method, shares, encoded):
    """With a validation split, the personal and the server's model each pass once over the validation images; where
    the server's model has a pass of its own, its accuracy on each client's test set has one too. Without one, nothing
    is added: the estimates read the test logits (tested above). The server's accuracy per client read from the
    personal pass is the one a pass of its own gives."""
    from fedur.train.label_free import Seen, server_counts

    host, server = host_of("--method", method, "--data.validation_fraction", "0.2")
    tested = sum(len(c.test_indices) for c in host.clients)
    held = sum(len(c.validation_indices) for c in host.clients)
    assert held > 0 and host.label_free.validation
    encoded.clear()
    with torch.no_grad():
        evaluation = evaluate_round(host, server)
    assert sum(encoded) == tested * (1 if shares else 3) + 2 * held
    found = evaluation.label_free
    assert found.estimates["personal"]["mano"] is not None and found.estimates["server"]["mano"] is not None
    model = ready(host, global_model_of(host, server, host.model), host.model)
    with torch.no_grad():
        own = server_counts(host, Seen(), (model.client, model.text), host.label_free, True)
    assert torch.equal(found.server_counts, own)
    assert int(found.personal_bins[:, :, 0].sum()) == tested and int(found.server_bins[:, 0].sum()) == len(host.global_rows)


def test_without_a_validation_split_the_server_estimates_come_from_the_personal_pass():
    """FedUR's server model shares the personal pass: its estimates on each client's test images are those of its own
    logits there."""
    from fedur.evaluation.estimators import estimates

    host, server = host_of()
    with torch.no_grad():
        evaluation = evaluate_round(host, server)
        model = ready(host, global_model_of(host, server, host.model), host.model)
        theirs = host.predict("test", model_of=(model.client, model.text))
    for client in host.clients:
        logits = theirs[client.client_id][0]
        want = estimates(logits, {"zero_shot": client.label_free.get("zero_shot_predictions")})
        assert evaluation.label_free.estimates["server"]["confidence"][client.client_id] == pytest.approx(
            100 * want["confidence"], abs=1e-9)
