"""The channel's stages on hand-written uploads (fedur/channel/): what an attacker sends, the reducer's rows and
weights, over-selection's rate, the streams of losses and speeds, and each stage's refusals."""

import json

import numpy as np
import pytest
import torch

from fedur.channel import adversary, clock, defaults, reducer
from fedur.channel.adversary import Adversary, AdversaryConfig
from fedur.channel.clock import Clock, ClockConfig, client_speeds, read_speeds
from fedur.channel.reducer import Reducer
from fedur.channel.stage import Building
from fedur.errors import ConfigError
from fedur.federated import streams
from fedur.federated.robust import coordinate_median
from fedur.labels.base import PseudoLabels

CURRENT = {"visual": torch.tensor([1.0, 1.0]), "deep": torch.tensor([[0.0]])}


def uploads(*rows):
    """{piece: (K, *shape)} from rows [v0, v1, d]: the visual piece's two values and the deep piece's one."""
    rows = torch.tensor(rows, dtype=torch.float32)
    return {"visual": rows[:, :2].clone(), "deep": rows[:, 2:].reshape(-1, 1, 1).clone(), "message": rows[:, :1] * 0 + 7}


def test_mean_changes_nothing():
    rules = Reducer()
    got, weights, metrics = rules.reduce(uploads([1, 2, 3], [4, 5, 6]), torch.tensor([1.0, 2.0]), CURRENT)
    assert not rules.active and metrics == {} and weights.tolist() == [1.0, 2.0]
    assert torch.equal(got["visual"], uploads([1, 2, 3], [4, 5, 6])["visual"])


def test_the_median_gives_every_taken_row_the_coordinate_median_and_leaves_the_others():
    rules = Reducer("median")
    rows = uploads([1, 10, 0], [2, 20, 5], [100, -50, 9], [7, 7, 7])
    weights = torch.tensor([3.0, 1.0, 1.0, 0.0])  # client 3 sent nothing
    got, same, _ = rules.reduce(rows, weights, CURRENT)
    assert torch.equal(same, weights)
    assert got["visual"][:3].tolist() == [[2.0, 10.0]] * 3 and got["deep"][:3].flatten().tolist() == [5.0] * 3
    assert got["visual"][3].tolist() == [7.0, 7.0]  # not taken: as it was
    assert torch.equal(got["message"], rows["message"])  # messages pass as they are
    # any weighted average of the rows is the median: the method's own aggregate gives it
    average = (got["visual"][:3] * (weights[:3, None] / weights[:3].sum())).sum(0)
    assert torch.allclose(average, torch.tensor([2.0, 10.0]))


def test_the_trimmed_mean_cuts_the_extremes_of_each_coordinate():
    rules = Reducer("trimmed_mean", trim=0.25)
    got, _, _ = rules.reduce(uploads([1, 0, 0], [2, 0, 0], [3, 0, 0], [100, 0, 0]), torch.ones(4), CURRENT)
    assert got["visual"][:, 0].tolist() == [2.5] * 4


def test_krum_keeps_the_honest_upload_and_multi_krum_the_honest_ones():
    rows = uploads([1, 1, 0], [1.1, 1, 0], [0.9, 1, 0], [50, -50, 9], [1, 1.2, 0])
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    krum = Reducer("krum", krum_malicious=1)
    got, kept, metrics = krum.reduce(rows, weights, CURRENT)
    assert int((kept > 0).sum()) == 1 and kept[3] == 0 and metrics == {"krum/kept": 1}
    assert torch.equal(got["visual"], rows["visual"])  # Krum chooses; the rows stay
    multi = Reducer("multi_krum", krum_malicious=1)
    _, kept, metrics = multi.reduce(rows, weights, CURRENT)
    assert kept.tolist() == [1.0, 2.0, 3.0, 0.0, 5.0] and metrics == {"multi_krum/kept": 4}  # n - f, with their own weights


def test_norm_clipping_bounds_each_update_of_all_shared_pieces_together():
    rules = Reducer("norm_clip", norm_bound=1.0)
    got, _, metrics = rules.reduce(uploads([4, 1, 0], [1.5, 1, 0]), torch.ones(2), CURRENT)
    assert got["visual"].tolist() == [[2.0, 1.0], [1.5, 1.0]]  # (3, 0, 0) clipped to (1, 0, 0); 0.5 within
    assert metrics == {"norm_clip/clip_norm": 1.0, "norm_clip/clipped": 1}
    median_bound = Reducer("norm_clip")  # null: the round's median update norm
    _, _, metrics = median_bound.reduce(uploads([4, 1, 0], [1.5, 1, 0], [1, 1, 2]), torch.ones(3), CURRENT)
    assert metrics["norm_clip/clip_norm"] == 2.0


def test_an_attacker_poisons_its_shared_pieces_and_nobody_elses():
    rules = Adversary(seed=3, attackers=(1,), attack="sign_flip", scale=2.0)
    honest = {"visual": torch.tensor([1.5, 0.0]), "deep": torch.tensor([[1.0]]), "message": torch.tensor([9.0])}
    assert rules.leave(0, 0, honest, CURRENT) is honest
    got = rules.leave(1, 0, honest, CURRENT)
    assert got["visual"].tolist() == [0.0, 3.0] and got["deep"].tolist() == [[-2.0]]  # 1 - 2 x (0.5, -1); 0 - 2 x 1
    assert got["message"] is honest["message"]
    garbage = Adversary(seed=3, attackers=(1,), attack="gaussian", scale=1.0)
    first, again = garbage.leave(1, 4, honest, CURRENT), garbage.leave(1, 4, honest, CURRENT)
    assert torch.equal(first["visual"], again["visual"])  # its own stream: the same on any rank, on a resume
    assert not torch.equal(first["visual"], garbage.leave(1, 5, honest, CURRENT)["visual"])
    flipped = Adversary(seed=3, attackers=(1,), attack="label_flip")
    assert flipped.leave(1, 0, honest, CURRENT) is honest  # its attack is on its pseudo-labels
    chosen = PseudoLabels(torch.tensor([0, 2]), torch.tensor([0, 1]), torch.tensor([[True, False, False], [False, False, True]]))
    assert flipped.labels(1, chosen, 3).labels.tolist() == [2, 1] and flipped.labels(0, chosen, 3) is chosen
    assert flipped.labels(1, chosen, 3).mask.tolist() == [[False, False, True], [True, False, False]]
    assert garbage.labels(1, chosen, 3) is chosen


@pytest.mark.parametrize(("join_rate", "clients", "over", "asked"), [(0.5, 4, 0.5, 3), (0.3, 10, 1.0, 6), (0.75, 4, 0.34, 4),
                                                                    (0.1, 7, 0.0, 1), (1 / 3, 9, 0.5, 5)])
def test_over_selection_asks_more_and_the_rate_draws_exactly_that_many(join_rate, clients, over, asked):
    rules = Clock(seed=0, over_select=over)
    rate = rules.join_rate(join_rate, clients)
    assert int(np.ceil(rate * clients)) == asked
    assert int(streams.participants(clients, rate, 5, 0).sum()) == asked


def test_losses_are_per_client_streams_with_the_asked_rate():
    lost = streams.lost(4000, 0.3, 11, 2)
    assert abs(lost.mean() - 0.3) < 0.03
    assert np.array_equal(streams.lost(10, 0.3, 11, 2), lost[:10])  # client k's draw whatever the number of clients
    assert not np.array_equal(streams.lost(4000, 0.3, 11, 3), lost)  # a new draw each round
    assert not np.array_equal(streams.lost(4000, 0.3, 11, 2, streams.LOST_HISTOGRAM), lost)
    assert not streams.lost(50, 0.0, 11, 2).any()


def test_speeds_equal_lognormal_or_from_a_file(tmp_path):
    assert client_speeds("equal", 3, 1.0, 0, None) == (None, None)
    assert client_speeds("equal", 3, 1.0, 0, 500.0)[1].tolist() == [500.0] * 3
    speeds, bandwidths = client_speeds("lognormal", 2000, 0.5, 4, 100.0)
    assert abs(float(speeds.log().std()) - 0.5) < 0.03 and abs(float(speeds.log().mean())) < 0.03
    assert not torch.equal(bandwidths / 100.0, speeds)  # drawn apart
    assert torch.equal(client_speeds("lognormal", 3, 0.5, 4, None)[0], speeds[:3])  # per client, fixed for the run
    (tmp_path / "s.json").write_text(json.dumps({"speeds": [1, 2.5, 0.5]}))
    assert client_speeds(str(tmp_path / "s.json"), 3, 1.0, 0, 10.0)[0].tolist() == [1.0, 2.5, 0.5]
    (tmp_path / "s.csv").write_text("client,speed,bandwidth\n1,2,20\n0,1,10\n")
    speeds, bandwidths = read_speeds(tmp_path / "s.csv", 2)
    assert speeds.tolist() == [1.0, 2.0] and bandwidths.tolist() == [10.0, 20.0]


@pytest.mark.parametrize(("content", "name", "says"), [
    ('{"speeds": [1, 2]}', "s.json", "must be 3 positive numbers"),
    ('{"speeds": [1, 0, 2]}', "s.json", "must be 3 positive numbers"),
    ('{"speed": [1, 1, 2]}', "s.json", "cannot be read"),
    ("client,speed\n0,1\n2,1\n1,x\n", "s.csv", "cannot be read"),
    ("client,speed\n0,1\n0,1\n1,1\n", "s.csv", "cannot be read"),
])
def test_a_speeds_file_that_does_not_fit_is_one_line(tmp_path, content, name, says):
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=says):
        client_speeds(str(tmp_path / name), 3, 1.0, 0, None)
    with pytest.raises(ConfigError, match="no such file"):
        client_speeds(str(tmp_path / "none.json"), 3, 1.0, 0, None)


def test_attackers_are_a_count_or_a_fraction_drawn_once_per_run():
    count = lambda attackers: AdversaryConfig(attackers=attackers, attack="scale" if attackers else "none").count(10)  # noqa: E731
    assert count(2) == 2 and count(0.25) == 3 and count(0) == 0
    with pytest.raises(ConfigError, match="at most every client"):
        count(11)
    with pytest.raises(ConfigError, match="whole number"):
        count(1.5)
    stages = defaults(adversary=AdversaryConfig(attackers=3, attack="scale"), aggregator=reducer.AggregatorConfig(rule="krum"))
    building = Building(stages, 10, 7, 32, 1, None)
    rules = adversary.build(stages.adversary, building)
    assert rules.attackers == tuple(streams.chosen(10, 3, 7)) and len(set(rules.attackers)) == 3
    assert rules.scale == 10.0  # the attack's default
    assert reducer.build(stages.aggregator, building).krum_malicious == 3  # Krum assumes them


@pytest.mark.parametrize(("check", "says"), [
    (lambda: AdversaryConfig(attack="sign_flip").count(4), "set both"),
    (lambda: AdversaryConfig(attackers=2).count(4), "set both"),
    (lambda: ClockConfig(min_uploads=5).check(4, 1.0), "no round could aggregate"),
    (lambda: ClockConfig(over_select=0.5).check(4, 1.0), "join_rate 1 draws every client"),
])
def test_settings_that_cannot_run_are_refused_before_anything(check, says):
    with pytest.raises(ConfigError, match=says):
        check()


def test_a_deadline_in_seconds_no_upload_can_meet_is_refused():
    rules = clock.build(ClockConfig(bandwidth=100.0, deadline=2.0, deadline_unit="seconds"), Building(defaults(), 4, 0, 32, 1, None))
    rules.check_deadline(150)  # 1.5 s to send: some may arrive
    with pytest.raises(ConfigError, match="no upload could arrive in time"):
        rules.check_deadline(300)


def test_the_median_of_the_helper_is_numpys():
    assert coordinate_median(torch.tensor([[1.0], [4.0], [2.0], [10.0]], dtype=torch.float64)).tolist() == [3.0]
