"""The label-free choice, the oracle, the regret and each estimator's error, on hand-written rows of metrics.jsonl."""

import pytest

from fedur.evaluation.choice import candidates, choose, estimator_errors, label_free_choice, spearman

ZERO_SHOT = {"zero_shot_client_accuracy": [80.0, 40.0], "zero_shot_estimated_accuracy": {"mano": [70.0, 30.0]}}


def row(r: int, personal: list, server: list, true_personal: list, true_server: list) -> dict:
    return {"round": r, "client_accuracy": true_personal, "server_client_accuracy": true_server,
            "estimated_accuracy": {"estimator": "mano", "personal": {"mano": personal}, "server": {"mano": server}}}


ROWS = [row(1, [60.0, 45.0], [65.0, 50.0], [75.0, 50.0], [70.0, 55.0]),
        row(2, [72.0, 50.0], [68.0, 49.0], [70.0, 60.0], [72.0, 58.0]),
        row(3, [71.0, 52.0], [69.0, 52.0], [74.0, 62.0], [71.0, 65.0])]


def test_the_candidates_are_zero_shot_then_personal_and_server_per_round():
    found = candidates(ROWS, ZERO_SHOT, 0, "mano")
    assert [(c.model, c.round) for c in found] == [("zero_shot", 0), ("personal", 1), ("server", 1), ("personal", 2),
                                                     ("server", 2), ("personal", 3), ("server", 3)]


def test_the_choice_is_the_first_highest_estimate_and_the_oracle_the_first_highest_accuracy():
    choice = label_free_choice(ROWS, ZERO_SHOT, "mano")
    zero, one = choice["clients"]
    assert (zero["model"], zero["round"], zero["accuracy"]) == ("personal", 2, 70.0)  # 72 is the highest estimate
    assert (zero["oracle_model"], zero["oracle_round"], zero["oracle_accuracy"]) == ("zero_shot", 0, 80.0)
    assert (one["model"], one["round"]) == ("personal", 3)  # 52 first reached by its personal model in round 3
    assert (one["oracle_model"], one["oracle_round"]) == ("server", 3)
    assert choice["chosen_mean"] == pytest.approx((70 + 62) / 2) and choice["chosen_worst"] == 62.0
    assert choice["oracle_mean"] == pytest.approx((80 + 65) / 2) and choice["final_mean"] == pytest.approx((74 + 62) / 2)
    assert choice["zero_shot_worst"] == 40.0 and choice["regret"] == pytest.approx(72.5 - 66.0)
    assert choice["below_zero_shot"] == [0]  # 70 < 80: the choice lost what zero-shot had


def test_a_candidate_without_an_estimate_is_passed_over():
    assert choose([]) is None
    rows = [row(1, [None, 45.0], [None, 40.0], [75.0, 50.0], [70.0, 55.0])]
    choice = label_free_choice(rows, {"zero_shot_client_accuracy": [80.0, 40.0]}, "mano")
    assert choice["clients"][0]["model"] is None and choice["clients"][1]["model"] == "personal"


def test_spearman_on_hand_ranked_lists():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)  # d^2 = 0 + 1 + 1: 1 - 6 * 2 / (3 * 8)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1, 2], [1, 2]) is None


def test_estimator_errors_are_the_mean_absolute_error_and_the_rank_correlation():
    errors = estimator_errors(ROWS, ZERO_SHOT, ["mano"])["mano"]
    per_round = [(abs(60 - 75) + abs(45 - 50)) / 2, (abs(72 - 70) + abs(50 - 60)) / 2, (abs(71 - 74) + abs(52 - 62)) / 2]
    assert errors["mae"]["personal"] == pytest.approx(sum(per_round) / 3)
    assert errors["final_mae"]["personal"] == pytest.approx(per_round[-1])
    assert errors["mae"]["zero_shot"] == pytest.approx((10 + 10) / 2)
    # client 0: estimates 60, 72, 71 against 75, 70, 74 (ranks 1 3 2 vs 3 1 2: d^2 = 8, 1 - 6 * 8 / 24 = -1);
    # client 1: 45 50 52 against 50 60 62 (the same order: 1)
    assert errors["rank_correlation"]["personal"] == pytest.approx((-1.0 + 1.0) / 2)
    assert errors["rank_correlation"]["server"] == pytest.approx((spearman([65, 68, 69], [70, 72, 71])
                                                                  + spearman([50, 49, 52], [55, 58, 65])) / 2)
