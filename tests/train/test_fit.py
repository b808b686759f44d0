"""One in-process federated run (1 rank) through the library: what the round loop must guarantee."""

import json

import pytest
import torch

from fedur.app.cli import parse_config
from fedur.app.run import run
from fedur.model.clip import load_clip

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane


def test_smoke_run_trains_only_prompts_and_keeps_text_prompts_personal(tmp_path):
    run_dir = tmp_path / "run"
    cfg = parse_config(
        ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--run.output_dir", str(run_dir)]
    )
    result = run(cfg)

    torch.manual_seed(cfg.run.seed)
    fresh = load_clip(cfg.model.name, cfg.model.pretrained)
    trained = result.tuner.model.clip.state_dict()
    assert trained.keys() == fresh.model.state_dict().keys()
    assert all(torch.equal(trained[k], v) for k, v in fresh.model.state_dict().items()), "backbone changed"

    texts = [c.pieces["text_ctx"] for c in result.clients]
    assert len(texts) == 4
    assert all(not torch.equal(texts[i], texts[j]) for i in range(4) for j in range(i)), "text prompts were shared"
    global_visual = result.global_pieces["visual"]
    assert set(result.global_pieces) == {"visual"}  # FedUR shares the visual prompt only
    assert all(torch.equal(c.pieces["visual"], global_visual) for c in result.clients)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]  # counted from 1, as on the console
    row = rows[0]
    assert len(row["client_accuracy"]) == 4 and len(row["bytes_sent"]) == 4 and row["refreshed"]
    visual_bytes = global_visual.numel() * 4
    assert row["bytes_sent"][0] == visual_bytes + 2 * 5 * 8  # prompt + two C-vectors of int64 at a refresh
    assert rows[1]["bytes_sent"][0] == visual_bytes
    assert row["selected"] == [len(c.pseudo_labels.labels) for c in result.clients]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["final_mean_accuracy"] == rows[-1]["mean_accuracy"]
    saved = torch.load(run_dir / "prompts" / "client_002.pt", weights_only=True)
    assert torch.equal(saved["text_ctx"], texts[2]) and torch.equal(saved["visual"], global_visual)
    assert torch.equal(torch.load(run_dir / "prompts" / "global.pt", weights_only=True)["visual"], global_visual)


def run_smoke(tmp_path, *overrides):
    cfg = parse_config(
        ["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--run.output_dir", str(tmp_path / "run"), *overrides]
    )
    result = run(cfg)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    return result, row


def differ(tensors):
    return all(not torch.equal(tensors[i], tensors[j]) for i in range(len(tensors)) for j in range(i))


def test_share_both_makes_text_prompts_global(tmp_path):
    result, row = run_smoke(tmp_path, "--method.share", "both")
    texts = [c.pieces["text_ctx"] for c in result.clients]
    assert all(torch.equal(t, texts[0]) for t in texts) and set(result.global_pieces) == {"visual", "text_ctx"}
    assert row["bytes_sent"][0] == (result.clients[0].pieces["visual"].numel() + texts[0].numel()) * 4 + 2 * 5 * 8


def test_share_none_keeps_every_prompt_local(tmp_path):
    result, row = run_smoke(tmp_path, "--method.share", "none")
    assert differ([c.pieces["visual"] for c in result.clients]) and differ([c.pieces["text_ctx"] for c in result.clients])
    assert result.global_pieces == {} and row["bytes_sent"] == [2 * 5 * 8] * 4


def test_clients_that_sit_out_keep_their_text_prompt(tmp_path):
    result, row = run_smoke(tmp_path, "--federation.join_rate", "0.5")
    assert len(row["participants"]) == 2
    init = initial_text_prompt(result)
    for client in result.clients:
        joined = client.client_id in row["participants"]
        assert torch.equal(client.pieces["text_ctx"], init) != joined
        assert (row["loss"][client.client_id] is None) != joined
        assert torch.equal(client.pieces["visual"], result.global_pieces["visual"])  # everyone downloads P^v


def initial_text_prompt(result):
    from fedur.data.synthetic import CLASSNAMES
    from fedur.model.classifier import PromptedCLIP

    torch.manual_seed(1)
    fresh = PromptedCLIP(load_clip("fedur-tiny", None), CLASSNAMES[:5], 4, 5, None, 0.02, seed=1)
    return fresh.text_prompt.ctx.detach()


def test_without_selection_or_filters_every_sample_is_trained_on(tmp_path):
    result, row = run_smoke(
        tmp_path, "--labeller", "CoDPL", "--labeller.cooperative_selection", "false", "--labeller.confidence_filter",
        "false", "--labeller.entropy_filter", "false",
    )
    assert row["selected"] == [len(c.train_indices) for c in result.clients]


def test_fedcopl_switches_turn_weights_and_negatives_off(tmp_path):
    result, row = run_smoke(tmp_path, "--labeller", "CoDPL", "--labeller.class_weights", "none", "--labeller.negatives", "none")
    assert row["refreshed"] and row["class_weights"] is None and all(v == 0.0 for v in row["loss_neg"])
    assert all(not c.pseudo_labels.mask.any() for c in result.clients)


def test_online_negatives_and_client_momentum(tmp_path):
    result, row = run_smoke(tmp_path, "--labeller", "CoDPL", "--labeller.negatives", "online", "--optim.optimizer_state", "client")
    assert all(v > 0 for v in row["loss_neg"])
    assert all(c.optimizer_state is not None for c in result.clients)


def test_feature_skew_runs_end_to_end_with_one_domain_per_client(tmp_path):
    """A tiny DomainNet copy (6 domains x 10 classes): federation.partition=domain gives client d the
    whole of domain d, domain_dirichlet gives clients 2d and 2d+1 domain d; summary.json has each domain's accuracy."""
    from tests.data.test_layouts import write_domainnet

    root = write_domainnet(tmp_path / "domainnet")
    for scheme, clients in (("domain", 6), ("domain_dirichlet", 12)):
        run_dir = tmp_path / scheme
        cfg = parse_config([
            "--config", "configs/tiny.yaml", "--dataset", "DomainNet", "--dataset.root", str(root),
            "--federation.partition", scheme, "--federation.num_clients", str(clients),
            "--federation.clients_per_domain", "2", "--federation.beta", "0.5", "--federation.min_train_per_client", "1",
            "--federation.rounds", "1", "--federation.local_epochs", "1", "--run.output_dir", str(run_dir),
        ])
        result = run(cfg)
        from fedur.train.setup import load_data

        domains = load_data(cfg).train.domains
        for client in result.clients:
            expected = client.client_id if scheme == "domain" else client.client_id // 2
            assert set(domains[client.train_indices].tolist()) == {expected}
        summary = json.loads((run_dir / "summary.json").read_text())
        assert list(summary["final_domain_accuracy"]) == ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
        partition = json.loads((run_dir / "partition.json").read_text())
        assert sum(map(sum, partition["train"])) == 6 * 10 * 2


def test_step_losses_are_printed_every_n_steps(tmp_path, capsys):
    run_smoke(tmp_path, "--run.log_every_n_steps", "1", "--federation.local_epochs", "1")
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  client ")]
    assert {line[1] for line in lines} == {"0", "1", "2", "3"} and all(float(line[-1]) >= 0 for line in lines)
    assert [line[3] for line in lines if line[1] == "0"][0] == "1"  # "client 0 step 1 loss x"


def test_the_image_cache_changes_nothing_but_speed(tmp_path):
    """Cached uint8 pixels normalised by the model give the very numbers of CLIP's per-sample preprocess."""
    rows = []
    for cache in ("true", "false"):
        _, row = run_smoke(tmp_path / cache, "--data.cache", cache)
        rows.append({k: v for k, v in row.items() if k not in ("round_seconds", "phase_seconds")})
    assert rows[0] == rows[1]


def test_clients_trained_together_equal_one_after_the_other(tmp_path):
    """run.clients_per_step 3 (groups {0, 1, 2} and {3}, which trains alone) for FedUR, and 2 for PromptProx (its
    penalty), with client momentum over two refreshes: the same pseudo-labels and accuracies, and prompts and
    momenta equal up to rounding."""
    runs = {}
    for name, extra in (("one", []), ("three", ["--run.clients_per_step", "3"]),
                        ("prox-one", ["--method", "PromptProx"]),
                        ("prox-two", ["--method", "PromptProx", "--run.clients_per_step", "2"])):
        cfg = parse_config(["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--federation.refresh_every", "1",
                                         "--optim.optimizer_state", "client", "--run.output_dir", str(tmp_path / name), *extra])
        runs[name] = run(cfg)
    for a, b in (("one", "three"), ("prox-one", "prox-two")):
        rows = [[json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()] for n in (a, b)]
        for x, y in zip(*rows):
            assert x["selection"] == y["selection"] and x["client_accuracy"] == y["client_accuracy"]
            assert x["loss"] == pytest.approx(y["loss"], rel=1e-4)
        for p, q in zip(runs[a].clients, runs[b].clients):
            assert p.pieces.keys() == q.pieces.keys()
            for name in p.pieces:
                assert torch.allclose(p.pieces[name], q.pieces[name], atol=1e-5), name
            momentum = [s["momentum_buffer"] for s in (p.optimizer_state[0], q.optimizer_state[0])]
            # momenta of up to ~2 sum every step's gradient: measured 1.5e-5 apart at most (fp32 sums in another order;
            # 1e-5 failed once in CI), the prompts themselves 2e-6
            torch.testing.assert_close(*momentum, rtol=1e-4, atol=1e-4)
    placement = json.loads((tmp_path / "three" / "placement.json").read_text())
    assert placement["ranks"][0]["clients"] == [0, 1, 2, 3]
