"""What a run with privacy on releases, on hand-written uploads: the central mean every taking-part row becomes, each
client's own noise in local mode, adaptive clipping's step, the histograms; and every setting refused in one line."""

import math

import pytest
import torch

from fedur.config import PrivacyConfig
from fedur.errors import ConfigError
from fedur.federated import streams
from fedur.labels import FPL, CoDPL, CoPL
from fedur.methods import GDAU, SCAFFOLD, FedUR, PromptFL, ZeroShot
from fedur.privacy import Federation, build, mechanism

SIZES = torch.tensor([50, 80, 30, 40])


def private(**settings):
    cfg = PrivacyConfig(**{"mode": "central", "noise_multiplier": 1.0, "clip": 1.0, **settings})
    return build(cfg, Federation(4, 1.0, 7, train_sizes=SIZES), CoDPL(), FedUR())


def uploads_of(deltas: list[list[float]], downloaded: torch.Tensor):
    """What each client uploads: what it downloaded plus its update."""
    return [{"visual": downloaded + torch.tensor(d, dtype=torch.float32)} for d in deltas]


def test_central_rows_are_the_one_noised_mean_of_the_clipped_updates():
    privacy = private(noise_multiplier=0.5, clip=1.0)
    downloaded = {"visual": torch.tensor([1.0, 2.0])}
    sent = uploads_of([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [0.0, -2.0]], downloaded["visual"])
    updates = [privacy.client_update(u, downloaded, k, 0)[0]["visual"] for k, u in enumerate(sent)]
    assert updates[0].tolist() == pytest.approx([0.6, 0.8])  # clipped to 1
    assert updates[1].tolist() == pytest.approx([0.3, 0.4])  # within: as it is
    took_part = torch.tensor([True, True, False, True])  # client 2 drawn, with nothing to upload
    gathered = {"visual": torch.stack([u if took_part[k] else torch.zeros(2, dtype=torch.float64) for k, u in enumerate(updates)])}
    rows = privacy.server_uploads(gathered, downloaded, {"visual": downloaded["visual"]}, took_part, 4, None, 0)["visual"]
    noise = mechanism.gaussian((2,), 0.5 * 1.0, streams.noise_generator(7, streams.NOISE_PIECES, 0))
    expected = downloaded["visual"].double() + (torch.tensor([0.6 + 0.3 + 0.0, 0.8 + 0.4 - 1.0], dtype=torch.float64) + noise) / 4
    for k in (0, 1, 3):
        assert rows[k].tolist() == pytest.approx(expected.float().tolist())
    assert rows[2].tolist() == [0.0, 0.0] and rows.dtype == torch.float32


def test_local_rows_carry_each_clients_own_noise_from_its_own_stream():
    privacy = private(mode="local", noise_multiplier=2.0, clip=1.0)
    downloaded = {"visual": torch.zeros(3)}
    update, within = privacy.client_update({"visual": torch.tensor([0.0, 3.0, 4.0])}, downloaded, 2, 5)
    noise = mechanism.gaussian((3,), 2.0, streams.noise_generator(7, streams.NOISE_PIECES, 5, 2))
    assert not within
    assert update["visual"].tolist() == pytest.approx((torch.tensor([0.0, 0.6, 0.8], dtype=torch.float64) + noise).tolist())
    other, _ = privacy.client_update({"visual": torch.tensor([0.0, 3.0, 4.0])}, downloaded, 1, 5)
    assert not torch.equal(other["visual"], update["visual"])  # another client: another stream


def test_messages_are_clipped_with_the_pieces_in_one_vector():
    privacy = private(clip=1.0, noise_multiplier=0.0)
    update, _ = privacy.client_update({"visual": torch.tensor([3.0]), "dc_visual": torch.tensor([4.0])},
                                      {"visual": torch.tensor([0.0])}, 0, 0)
    assert update["visual"].item() == pytest.approx(0.6) and update["dc_visual"].item() == pytest.approx(0.8)


def test_adaptive_clipping_shrinks_c_when_every_update_fits_and_the_round_costs_z():
    privacy = private(adaptive_clip=True, clip=1.0, clipped_count_stddev=1.0, noise_multiplier=1.0)
    downloaded = {"visual": torch.zeros(2)}
    gathered = {"visual": torch.full((4, 2), 0.01, dtype=torch.float64)}
    within = torch.ones(4, dtype=torch.bool)
    privacy.server_uploads(gathered, downloaded, downloaded, within, 4, within, 3)
    count_noise = float(mechanism.gaussian((1,), 1.0, streams.noise_generator(7, streams.NOISE_CLIP_COUNT, 3))[0])
    # the count centred (4 x (1 - 1/2) = 2) and noised, back to a fraction: (2 + noise) / 4 + 1/2
    assert privacy.clip_norm == pytest.approx(math.exp(-0.2 * ((2 + count_noise) / 4 + 0.5 - 0.5)))
    assert privacy.update_multiplier() == pytest.approx(1 / math.sqrt(1 - 0.25))


def test_histograms_central_the_sum_is_noised_once_local_each_row_is():
    central, local = private(noise_multiplier=1.0), private(mode="local", noise_multiplier=1.0)
    counts = torch.tensor([[10, 0, 5], [0, 20, 5], [1, 1, 1], [0, 0, 0]])
    members = torch.tensor([True, True, True, False])
    rows = torch.stack([central.histogram(c, k, 0, streams.NOISE_ESTIMATES) for k, c in enumerate(counts)])
    assert torch.equal(rows, counts.double())  # within the bound (the largest client's 80 images): unclipped, unnoised
    noise = mechanism.gaussian((3,), 1.0 * 80, streams.noise_generator(7, streams.NOISE_ESTIMATES, 0))
    assert central.totals(rows, members, 0, streams.NOISE_ESTIMATES).tolist() == \
        mechanism.released_counts(torch.tensor([11.0, 21.0, 11.0], dtype=torch.float64) + noise).tolist()
    noised = local.histogram(counts[0], 0, 0, streams.NOISE_ESTIMATES)
    own = mechanism.gaussian((3,), 80.0, streams.noise_generator(7, streams.NOISE_ESTIMATES, 0, 0))
    assert noised.tolist() == pytest.approx((counts[0].double() + own).tolist())


def test_the_ledger_counts_releases_and_epsilon_grows_round_by_round():
    privacy = private(noise_multiplier=2.0)
    values = []
    for round_idx in range(4):
        before = privacy.epsilon_after(refreshes=round_idx % 2 == 0)
        privacy.record(torch.ones(4, dtype=torch.bool), refreshed=round_idx % 2 == 0)
        values.append(privacy.epsilon())
        assert values[-1] == pytest.approx(before)
    assert privacy.ledger.rounds == [4] and privacy.ledger.refreshes == [2]
    assert all(b > a for a, b in zip(values, values[1:]))


def refused(**settings):
    method = settings.pop("method", FedUR())
    labeller = settings.pop("labeller", CoDPL())
    with pytest.raises(ConfigError) as err:
        build(PrivacyConfig(**settings), Federation(4, 1.0, 1), labeller, method)
    return str(err.value)


def test_settings_that_cannot_hold_are_refused_in_one_line():
    assert "shares nothing" in refused(mode="local", method=ZeroShot(), labeller=None)
    assert "sufficient statistics" in refused(mode="central", method=GDAU(), labeller=None)
    assert "central privacy's" in refused(mode="local", adaptive_clip=True)
    assert "passed by the first round" in refused(mode="central", noise_multiplier=0.3, target_epsilon=1.0)
    assert "clipped_count_stddev" in refused(mode="central", adaptive_clip=True, clipped_count_stddev=0.1)
    for message in (refused(mode="local", method=ZeroShot(), labeller=None), refused(mode="central", method=GDAU(), labeller=None)):
        assert "\n" not in message


def test_calibrate_picks_the_smallest_z_whose_rounds_meet_the_target():
    cfg = PrivacyConfig(mode="central", noise_multiplier="calibrate", target_epsilon=4.0)
    privacy = build(cfg, Federation(4, 1.0, 1, rounds=5, refresh_every=2, train_sizes=SIZES), CoDPL(), FedUR())
    for round_idx in range(5):  # refreshes at rounds 1, 3 and 5
        privacy.record(torch.ones(4, dtype=torch.bool), refreshed=round_idx % 2 == 0)
    assert 3.99 < privacy.epsilon() <= 4.0
    assert "target_epsilon" in refused(mode="central", noise_multiplier="calibrate")


def test_what_a_method_shares_and_labels_sets_what_is_accounted():
    plain = build(PrivacyConfig(mode="central"), Federation(4, 0.5, 1, train_sizes=SIZES), FPL(), PromptFL())
    assert plain.releases.histograms_per_refresh == 0 and plain.releases.sampled == 2  # FPL reads no counts
    weighted = build(PrivacyConfig(mode="central"), Federation(4, 0.5, 1, train_sizes=SIZES), FPL(class_weights="inv"),
                     PromptFL())
    assert weighted.releases.histograms_per_refresh == 1 and weighted.releases_selected  # its class weights do
    copl = build(PrivacyConfig(mode="central"), Federation(4, 1.0, 1, train_sizes=SIZES), CoPL(), PromptFL())
    assert copl.releases.histograms_per_refresh == 1 and not copl.releases_selected  # its estimates only
    cooperative = build(PrivacyConfig(mode="local"), Federation(4, 1.0, 1, train_sizes=SIZES), CoDPL(), SCAFFOLD())
    assert cooperative.releases.histograms_per_refresh == 2 and cooperative.histogram_bound == 80.0
    assert build(PrivacyConfig(mode="none"), Federation(4, 1.0, 1), CoDPL(), FedUR()) is None
