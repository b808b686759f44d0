"""Every method and every pseudo-labeller on the one round loop: each runs two rounds on 2 ranks under
`fabric run` with the same results as on 1 rank (the session's shared runs, tests/shared_runs.py), and does what
makes it that method. The cases are every one of fedur's methods (found from the classes) and one mechanism each.
(Each method on the demo, on 2 ranks against 1 too: tests/test_learning.py.)"""

import json
from pathlib import Path

import pytest
import torch

from .conftest import assert_same_results, read_rounds
from .shared_runs import every_case, run_all, runs_rounds

pytestmark = pytest.mark.slow  # whole fedur runs: not in the fast lane

CASES = every_case()


@pytest.fixture(scope="module")
def runs(tiny_runs, tmp_path_factory):
    """root/<case>-1: the shared 1-rank run; root/<case>-2: the same on 2 ranks, all in one `fabric run`."""
    root = tmp_path_factory.mktemp("methods")
    for name in CASES:
        (root / f"{name}-1").symlink_to(tiny_runs / name)
    run_all({f"{name}-2": flags for name, flags in CASES.items()}, root, ranks=2)
    return root


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one(runs, name):
    one, two = runs / f"{name}-1", runs / f"{name}-2"
    assert json.loads((two / "summary.json").read_text())["world_size"] == 2
    if not runs_rounds(CASES[name]):  # zero-shot CLIP
        for key in ("zero_shot_client_accuracy", "zero_shot_global", "final_client_accuracy"):
            assert json.loads((one / "summary.json").read_text())[key] == json.loads((two / "summary.json").read_text())[key]
    else:
        assert_same_results(one, two, num_clients=4)
    if name == "fedur-grouped":  # the group {0, 1, 2} is not split across the ranks
        ranks = json.loads((two / "placement.json").read_text())["ranks"]
        assert [r["clients"] for r in ranks] == [[0, 1, 2], [3]]


def test_the_cases_cover_every_method_and_labeller():
    from fedur import plugins

    flags = [" ".join(f) for f in CASES.values()]
    for cls in plugins.builtin("method"):
        assert any(f"--method {cls.__name__}" in f for f in flags), cls
    for cls in plugins.builtin("labeller"):
        assert any(f"--labeller {cls.__name__}" in f for f in flags), cls


def client_prompts(run_dir: Path) -> list[dict]:
    return [torch.load(run_dir / "prompts" / f"client_{k:03d}.pt", weights_only=True) for k in range(4)]


def test_promptfl_shares_one_text_prompt_and_no_visual_prompt(runs):
    clients = client_prompts(runs / "promptfl-2")
    assert all(set(c) == {"client_id", "text_ctx"} for c in clients)
    assert all(torch.equal(c["text_ctx"], clients[0]["text_ctx"]) for c in clients)
    row = read_rounds(runs / "promptfl-2")[0]
    assert set(row["prompt_divergence"]) == {"text_ctx"}
    per_class = [n for client in row["selection"] for n in client]  # (K, C) selected at the refresh
    assert max(per_class) == 16  # FPL: the 16 most confident per class and client, fewer where fewer are predicted


def test_cpl_trains_on_candidate_sets(runs):
    summary = json.loads((runs / "promptprox-grip-2" / "summary.json").read_text())
    assert summary["method"] == "promptprox" and summary["labeller"] == "cpl"
    last = sorted((runs / "promptprox-grip-2" / "checkpoints").glob("round_*"))[-1]
    state = torch.load(last / "client_000.pt", weights_only=True)
    mask, labels = state["pseudo_labels"]["mask"], state["pseudo_labels"]["labels"]
    assert bool(mask[torch.arange(len(labels)), labels].all())  # the label is in its candidate set
    # GRIP's pools at the second refresh (t = 1): K = max(1, int(2 * int(n_k / 10) / C)) per class (C = 5)
    pools, n_k = state["pseudo_labels"]["pools"], len(state["train_indices"])
    assert len(pools) == len(labels) and torch.bincount(pools).max() <= max(1, 2 * (n_k // 10) // 5) < 16
    first, second = (sum(row["selected"]) for row in read_rounds(runs / "promptprox-grip-2"))
    assert second > first  # the pools grew from the first refresh to the second


def test_pfedprompt_keeps_a_bounded_cache_of_its_most_confident_pseudo_labels(runs):
    state = torch.load(next((runs / "pfedprompt-2" / "checkpoints").glob("round_*/client_001.pt")), weights_only=True)
    keys, labels = state["extra"]["cache_keys"], state["extra"]["cache_labels"]
    selected, confidence = state["pseudo_labels"]["labels"], state["pseudo_labels"]["confidence"]
    assert len(keys) == len(labels) > 0 and torch.allclose(keys.norm(dim=-1), torch.ones(len(keys)), atol=1e-5)
    for c in torch.unique(selected).tolist():  # the cache_shots (4 here) most confident of each class
        top = torch.sort(confidence[selected == c], descending=True).values[:4]
        assert int((labels == c).sum()) == len(top)
    assert torch.bincount(labels).max() <= 4


def global_and_local_prompt() -> list[str]:
    """The methods whose pieces are a shared global text prompt and a personal local one (FedOTP, PromptFolio, ...)."""
    from fedur import plugins

    return [cls.key for cls in plugins.builtin("method")
            if {name: piece.shared for name, piece in cls().pieces().items()} == {"text_ctx": True, "text_local": False}]


@pytest.mark.parametrize("name", global_and_local_prompt())
def test_a_global_prompt_is_shared_and_the_local_one_kept(runs, name):
    clients = client_prompts(runs / f"{name}-2")
    assert all(torch.equal(c["text_ctx"], clients[0]["text_ctx"]) for c in clients)
    assert not torch.equal(clients[0]["text_local"], clients[1]["text_local"])
    global_prompts = torch.load(runs / f"{name}-2" / "prompts" / "global.pt", weights_only=True)
    assert set(global_prompts) == {"text_ctx"}


def test_zero_shot_reports_the_frozen_model(runs):
    summary = json.loads((runs / "zeroshot-2" / "summary.json").read_text())
    assert summary["final_client_accuracy"] == summary["zero_shot_client_accuracy"]
    assert summary["rounds_completed"] == 0 and not (runs / "zeroshot-2" / "metrics.jsonl").exists()


@pytest.mark.parametrize("name, new", [("fedur-new-clients", [3]), ("pfedprompt-new-clients", [2, 3])])
def test_new_clients_never_take_part_and_are_tested_as_they_arrive_and_after_adapting(runs, name, new):
    rows, summary = read_rounds(runs / f"{name}-1"), json.loads((runs / f"{name}-1" / "summary.json").read_text())
    training = [k for k in range(4) if k not in new]
    for row in rows:
        assert row["new_clients"] == new and set(row["participants"]) == set(training)
        assert all(row["bytes_sent"][k] == 0 and row["selected"][k] == 0 and row["loss"][k] is None for k in new)
        assert row["mean_accuracy"] == pytest.approx(sum(row["client_accuracy"][k] for k in training) / len(training))
        assert row["new_client_accuracy"] == pytest.approx(sum(row["client_accuracy"][k] for k in new) / len(new))
    assert summary["new_clients"] == new and set(summary["new_client_adapted_client_accuracy"]) == {str(k) for k in new}
    assert summary["final_new_client_accuracy"] == rows[-1]["new_client_accuracy"]
    assert isinstance(summary["new_client_adapted_accuracy"], float) and isinstance(summary["final_global_accuracy"], float)
    start = torch.load(runs / f"{name}-1" / "checkpoints" / sorted(p.name for p in (runs / f"{name}-1" / "checkpoints").iterdir()
                                                                 if p.name.startswith("round"))[-1] / "client_003.pt",
                       weights_only=True)["prompts"]
    final = torch.load(runs / f"{name}-1" / "prompts" / "client_003.pt", weights_only=True)
    assert any(not torch.equal(final[k], start[k]) for k in start), "the adaptation trained the new client's pieces"


def test_where_every_piece_is_shared_the_server_model_is_every_clients_so_global_pools_their_tests(runs):
    """PromptFL's clients all hold the global prompt, and the tiny config's client test sets partition the test set:
    the global accuracy is the personal one pooled over the test images, exactly (one pass scores both)."""
    for row in read_rounds(runs / "promptfl-1"):
        assert row["global_accuracy"] == row["weighted_accuracy"]  # the same model, the same pass over the images
        assert row["dual_accuracy"] == pytest.approx(2 * row["mean_accuracy"] * row["global_accuracy"]
                                                     / (row["mean_accuracy"] + row["global_accuracy"]))


def test_a_held_out_domain_is_no_clients_and_is_tested_with_the_server_model(runs):
    run_dir = runs / "promptfl-held-out-domain-1"
    partition, summary = (json.loads((run_dir / name).read_text()) for name in ("partition.json", "summary.json"))
    assert sum(partition["train_sizes"]) == 2 * 5 * 12 and sum(partition["test_sizes"]) == 2 * 5 * 4  # photo, sketch
    assert set(summary["final_domain_accuracy"]) == {"photo", "sketch"}
    assert all(set(r["held_out_accuracy"]) == {"domain:mosaic"} for r in read_rounds(run_dir))
    assert summary["final_held_out_domain_accuracy"] == summary["final_held_out_accuracy"]["domain:mosaic"]
    assert isinstance(summary["zero_shot_held_out"]["domain:mosaic"], float)


def test_base_to_novel_trains_on_base_classes_and_tests_the_novel_ones_with_their_names(runs):
    for name in ("fedtpg-base-to-novel", "fedur-base-to-novel"):
        partition = json.loads((runs / f"{name}-1" / "partition.json").read_text())
        assert partition["classnames"] == ["circle", "square", "triangle"]  # tiny's 5 shapes: 3 base, 2 novel
        assert all(len(row) == 3 for row in partition["train"]) and sum(partition["train_sizes"]) == 3 * 60
        rows = read_rounds(runs / f"{name}-1")
        novel = [r["held_out_accuracy"]["novel"] for r in rows]
        assert all(isinstance(v, float) for v in novel)
        assert rows[-1]["base_novel_harmonic"] == pytest.approx(2 * rows[-1]["mean_accuracy"] * novel[-1]
                                                               / (rows[-1]["mean_accuracy"] + novel[-1]))
