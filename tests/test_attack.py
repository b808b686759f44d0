"""fedur-attack (docs/privacy-attacks.md): the metrics and scores on hand-written numbers, the histogram attack on
hand-written records, and one finished tiny run attacked through the entry point."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedur.app.attack import main as attack_main
from fedur.privacy.histogram_attack import histogram_attack, server_estimate, shares, total_variation
from fedur.privacy.membership_attack import attack_scores, balanced, mean_rows, roc_auc, tpr_at_fpr


def test_auc_counts_each_member_above_a_non_member_and_a_tie_half():
    # 0.9 and 0.8 beat all three non-members (6); 0.4 loses to 0.7, ties 0.4 (1/2), beats 0.1 (1): 7.5 of 9 pairs
    assert roc_auc([0.9, 0.8, 0.4], [0.7, 0.4, 0.1]) == pytest.approx(7.5 / 9, abs=1e-15)
    assert roc_auc([1.0, 2.0], [1.0, 2.0, 1.0, 2.0]) == 0.5  # the same scores: every pair a tie or its mirror
    assert roc_auc([3.0, 3.0], [3.0]) == 0.5
    assert roc_auc([5.0, 6.0], [1.0, 2.0]) == 1.0 and roc_auc([1.0, 2.0], [5.0, 6.0]) == 0.0


def test_auc_is_the_pairwise_count_on_scores_with_many_ties():
    rng = np.random.default_rng(3)
    members, non_members = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 31).astype(float)
    pairs = sum(1.0 if m > n else 0.5 if m == n else 0.0 for m in members for n in non_members)
    assert roc_auc(members, non_members) == pytest.approx(pairs / (40 * 31), abs=1e-12)


def test_tpr_at_low_fpr_takes_the_threshold_that_lets_at_most_the_allowed_non_members_through():
    # 3 non-members at 1%: none may pass; the best threshold lies just above 0.7: 0.9 and 0.8 pass
    assert tpr_at_fpr([0.9, 0.8, 0.4], [0.7, 0.4, 0.1]) == pytest.approx(2 / 3)
    assert tpr_at_fpr([0.9, 0.8, 0.4], [0.7, 0.4, 0.1], max_fpr=1 / 3) == pytest.approx(2 / 3)  # above 0.4: 0.4 fails
    assert tpr_at_fpr([0.9, 0.8, 0.4], [0.7, 0.4, 0.1], max_fpr=2 / 3) == 1.0  # above 0.1
    assert tpr_at_fpr([0.9], [0.7], max_fpr=1.0) == 1.0
    # 200 non-members 0..199 at 1%: 2 may pass (198, 199), so the threshold is just above 197
    assert tpr_at_fpr([199.5, 198.0, 197.5, 197.0, 10.0], np.arange(200.0)) == pytest.approx(3 / 5)
    # 300 non-members: 0.01 x 300 is 3 (not 2.999...): 297, 298, 299 may pass, threshold just above 296
    assert tpr_at_fpr([296.5, 296.0], np.arange(300.0)) == 0.5
    assert tpr_at_fpr([1.0, 1.0], [1.0, 1.0]) == 0.0  # ties with every non-member: no threshold separates them


def test_the_scores_are_minus_the_loss_and_the_loss_less_the_references():
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)  # softmax (1/4, 3/4)
    reference = torch.tensor([[0.0, 0.0]])  # (1/2, 1/2)
    scores = attack_scores(logits, reference, torch.tensor([1]))
    assert scores["loss"] == pytest.approx([math.log(0.75)], abs=1e-12)
    assert scores["calibrated"] == pytest.approx([math.log(0.75) - math.log(0.5)], abs=1e-12)  # ln 1.5
    scores = attack_scores(logits, reference, torch.tensor([0]))
    assert scores["loss"] == pytest.approx([math.log(0.25)], abs=1e-12)
    assert scores["calibrated"] == pytest.approx([math.log(0.5)], abs=1e-12)
    blind = attack_scores(logits, reference, None)  # no labels: the confidence, and the prediction (class 1) as label
    assert blind["loss"] == pytest.approx([0.75], abs=1e-12)
    assert blind["calibrated"] == pytest.approx([math.log(1.5)], abs=1e-12)
    same = attack_scores(logits, logits, torch.tensor([0]))
    assert same["calibrated"].tolist() == [0.0]  # the reference against itself: nothing left


def test_a_model_that_fits_its_members_better_is_found_by_the_loss_attack():
    labels = torch.tensor([0, 1, 0, 1])
    fitted, unfit = torch.tensor([[4.0, 0.0], [0.0, 4.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    members = attack_scores(torch.cat([fitted, fitted]), torch.zeros(4, 2), labels)
    non_members = attack_scores(torch.cat([unfit, unfit]), torch.zeros(4, 2), labels)
    assert roc_auc(members["loss"], non_members["loss"]) == 1.0
    assert roc_auc(members["calibrated"], non_members["calibrated"]) == 1.0


def test_balancing_keeps_the_smaller_set_and_draws_the_larger_from_the_seed_and_client():
    members, non_members = balanced(100, 7, seed=0, client_id=2)
    assert non_members.tolist() == list(range(7)) and len(members) == 7
    assert len(set(members.tolist())) == 7 and members.tolist() == sorted(members.tolist()) and members.max() < 100
    assert balanced(100, 7, 0, 2)[0].tolist() == members.tolist()  # the same draw again
    assert balanced(100, 7, 0, 3)[0].tolist() != members.tolist() and balanced(100, 7, 1, 2)[0].tolist() != members.tolist()
    members, non_members = balanced(5, 40, 0, 0)
    assert members.tolist() == [0, 1, 2, 3, 4] and len(non_members) == 5
    assert [len(x) for x in balanced(0, 4, 0, 0)] == [0, 0]


def test_the_mean_over_personal_models_of_each_attack():
    rows = [{"model": f"client_{k}", "attack": a, "score": "loss", "auc": auc, "tpr_at_1pct_fpr": tpr, "members": 10,
             "non_members": 10} for k, (a, auc, tpr) in enumerate([("loss", 0.6, 0.1), ("loss", 0.4, 0.0), ("calibrated", 0.5, 0.2)])]
    loss, calibrated = mean_rows(rows, "personal_mean")
    assert (loss["attack"], loss["auc"], loss["tpr_at_1pct_fpr"], loss["models"], loss["members"]) == ("loss", 0.5, 0.05, 2, 20)
    assert (calibrated["auc"], calibrated["models"]) == (0.5, 1)


def test_shares_read_noise_below_zero_as_none_and_an_empty_row_as_uniform():
    assert shares([[3, 1], [-2, 4], [0, 0]]).tolist() == [[0.75, 0.25], [0.0, 1.0], [0.5, 0.5]]
    assert total_variation([0.5, 0.5, 0.0], [0.0, 0.5, 0.5]) == 0.5
    assert total_variation([1.0, 0.0], [0.0, 1.0]) == 1.0 and total_variation([0.2, 0.8], [0.2, 0.8]) == 0.0


def test_the_server_estimate_is_what_the_privacy_mode_releases():
    line = {"round": 3, "selection": [[2, 2], [0, 4]], "released_histograms": [[3, 1], [-1, 3]], "released_totals": [1, 3]}
    estimate, source = server_estimate(line, "none", 2)
    assert estimate.tolist() == [[0.75, 0.25], [0.0, 1.0]] and source.startswith("released_histograms")
    assert server_estimate(line, "local", 2)[0].tolist() == [[0.75, 0.25], [0.0, 1.0]]
    estimate, source = server_estimate(line, "central", 2)
    assert estimate.tolist() == [[0.25, 0.75], [0.25, 0.75]] and source.startswith("released_totals")
    old = {"round": 1, "selection": [[2, 2], [0, 4]]}  # a run that records only the selected counts
    assert server_estimate(old, "none", 2)[0].tolist() == [[0.5, 0.5], [0.0, 1.0]]
    assert server_estimate(old, "central", 2)[0].tolist() == [[0.25, 0.75], [0.25, 0.75]]  # 2 + 0, 2 + 4
    estimate, missing = server_estimate(old, "local", 2)
    assert estimate is None and "no released_histograms" in missing
    silent = {"round": 1, "selection": [[2, 2], [0, 4]], "released_histograms": None, "released_totals": None}
    for mode in ("central", "local"):  # privacy on, nothing released at the refresh: the server learnt nothing
        estimate, source = server_estimate(silent, mode, 2)
        assert estimate.tolist() == [[0.5, 0.5], [0.5, 0.5]] and source.startswith("nothing released")


def test_the_histogram_attack_against_the_true_shares_and_the_guesses_without_a_release():
    rounds = [{"round": 1, "selection": [[1, 1], [2, 2]], "refreshed": True}, {"round": 2, "selection": None},
              {"round": 3, "selection": [[1, 1], [0, 2]], "released_histograms": [[1, 1], [0, 2]]}]
    result = histogram_attack([[3, 1], [0, 4]], rounds, "none", [0, 1])  # true shares (3/4, 1/4) and (0, 1)
    assert [r["round"] for r in result["per_refresh"]] == [1, 3] and result["round"] == 3
    assert result["per_refresh"][0]["tv"] == [0.25, 0.5]
    assert [c["tv"] for c in result["clients"]] == [0.25, 0.0] and result["mean_tv"] == 0.125
    assert [c["tv_uniform"] for c in result["clients"]] == [0.25, 0.5]
    assert [c["tv_global"] for c in result["clients"]] == [0.375, 0.375]  # the global shares (3/8, 5/8)
    local = histogram_attack([[3, 1], [0, 4]], rounds[:1], "local", [0, 1])
    assert local["mean_tv"] is None and local["missing"][0]["round"] == 1


# -- one finished run, through the entry point ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    run_dir = tmp_path_factory.mktemp("attack") / "run"
    run(parse_config(["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--run.progress", "false",
                      "--run.output_dir", str(run_dir)]))
    return run_dir


def test_a_finished_run_is_attacked_and_the_reference_scores_as_chance(finished, capsys):
    assert attack_main([str(finished), "--batch-size", "16"]) == 0
    out = capsys.readouterr()
    assert "AUC" in out.out and "histogram attack (privacy none" in out.out and "client 3 scored (4/4)" in out.err
    members = json.loads((finished / "attack" / "membership.json").read_text())
    rows = {(r["model"], r["attack"]): r for r in members["results"]}
    partition = json.loads((finished / "partition.json").read_text())
    sizes = [min(a, b) for a, b in zip(partition["train_sizes"], partition["test_sizes"])]
    assert set(rows) == {(m, a) for m in ["server", "zero_shot", *(f"client_{k:03d}" for k in range(4))]
                         for a in ("loss", "calibrated")}
    for (model, _), row in rows.items():
        assert 0.0 <= row["auc"] <= 1.0 and 0.0 <= row["tpr_at_1pct_fpr"] <= 1.0 and row["score"] == "loss"
        assert row["members"] == row["non_members"] == (sum(sizes) if model in ("server", "zero_shot") else sizes[int(model[-3:])])
    # The reference against itself scores every image 0: a tie everywhere, exactly chance, and no threshold below 1% FPR.
    assert rows["zero_shot", "calibrated"]["auc"] == 0.5 and rows["zero_shot", "calibrated"]["tpr_at_1pct_fpr"] == 0.0
    # Its loss attack: an AUC of a model that saw neither set, within 5 standard deviations of the Mann-Whitney null
    # (n_m + n_n + 1) / (12 n_m n_n) of these counts.
    n = sum(sizes)
    assert abs(rows["zero_shot", "loss"]["auc"] - 0.5) < 5 * math.sqrt((2 * n + 1) / (12 * n * n))
    assert {r["attack"] for r in members["personal_mean"]} == {"loss", "calibrated"}
    assert members["personal_mean"][0]["models"] == 4 and "LiRA" in members["attacks"]["calibrated"]

    leak = json.loads((finished / "attack" / "histograms.json").read_text())
    assert leak["privacy"] == "none" and leak["available"] and leak["round"] == 1
    assert leak["source"].startswith(("released_histograms", "selection"))
    assert [c["client"] for c in leak["clients"]] == [0, 1, 2, 3]
    assert all(0.0 <= c["tv"] <= 1.0 and 0.0 <= c["tv_uniform"] <= 1.0 for c in leak["clients"])


def test_a_method_without_a_server_model_has_its_clients_attacked_only(finished, monkeypatch, capsys):
    from fedur.methods import FedUR

    monkeypatch.setattr(FedUR, "global_model", lambda self, model, view: None)
    assert attack_main([str(finished)]) == 0
    members = json.loads((finished / "attack" / "membership.json").read_text())
    assert [r["model"] for r in members["results"]][::2] == ["client_000", "client_001", "client_002", "client_003", "zero_shot"]
    assert any("has no server model" in note for note in members["notes"]) and "has no server model" in capsys.readouterr().out


def test_a_directory_that_is_not_a_finished_run_gets_one_line(tmp_path, finished, capsys):
    assert attack_main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().endswith("is not a directory: give a finished fedur run's directory (its run.output_dir)")
    assert attack_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedur-attack: error: ") and "holds no config.yaml" in err
    (tmp_path / "config.yaml").write_text((finished / "config.yaml").read_text())
    assert attack_main([str(tmp_path)]) == 2
    assert "has not finished (no summary.json): finish or resume it first" in capsys.readouterr().err
