"""The arithmetic of client-level DP on hand-written tensors: the clip, the noise, adaptive clipping's update and
its split of the noise, the histograms' release."""

import math

import pytest
import torch

from fedur.errors import ConfigError
from fedur.privacy import mechanism


def test_a_clipped_update_is_never_longer_than_the_clip_and_a_short_one_is_untouched():
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-3, 0.1, 1.0, 100.0):
        for _ in range(50):
            v = torch.randn(37, generator=generator, dtype=torch.float64) * scale
            clipped, norm = mechanism.clip(v, 0.5)
            assert float(torch.linalg.vector_norm(clipped)) <= 0.5 * (1 + 1e-12)
            assert norm == pytest.approx(float(torch.linalg.vector_norm(v)))
            if norm <= 0.5:
                assert torch.equal(clipped, v)
            else:  # the same direction
                assert torch.allclose(clipped / 0.5, v / norm)
    assert mechanism.clip(torch.tensor([3.0, 4.0], dtype=torch.float64), 1.0)[0].tolist() == pytest.approx([0.6, 0.8])


def test_flatten_and_unflatten_round_trip_in_the_uploads_order_and_dtypes():
    parts = {"visual": torch.arange(6, dtype=torch.float32).view(2, 3), "dc": torch.tensor([7.0, 8.0], dtype=torch.float32)}
    flat = mechanism.flatten(parts)
    assert flat.dtype == torch.float64 and flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 8]
    back = mechanism.unflatten(flat, parts)
    assert list(back) == ["visual", "dc"] and all(torch.equal(back[k], parts[k]) for k in parts)


def test_the_noise_has_the_std_it_is_asked_for_and_none_at_zero():
    sample = mechanism.gaussian((400_000,), 0.3, torch.Generator().manual_seed(1))
    # the sample std's relative error is ~ 1 / sqrt(2n) = 0.11%: 1% is ~9 of them
    assert float(sample.std()) == pytest.approx(0.3, rel=0.01)
    assert abs(float(sample.mean())) < 0.3 * 5 / math.sqrt(400_000)
    assert torch.equal(mechanism.gaussian((5,), 0.0, torch.Generator()), torch.zeros(5, dtype=torch.float64))


def test_adaptive_clippings_noise_split_and_geometric_update_by_hand():
    # z = 1, count std 1: z_D = (1 - 1/4)^(-1/2)
    assert mechanism.update_noise(1.0, 1.0) == pytest.approx(1 / math.sqrt(0.75))
    # the two together cost z: z_D^-2 + (2 sigma_b)^-2 = z^-2
    z_d = mechanism.update_noise(2.0, 3.0)
    assert z_d ** -2 + 6.0 ** -2 == pytest.approx(2.0 ** -2)
    with pytest.raises(ConfigError, match="clipped_count_stddev"):
        mechanism.update_noise(1.0, 0.4)  # (2 x 0.4)^-2 > 1
    # all within C at target 0.5: C shrinks by exp(-0.2 x 0.5); none within: it grows by exp(0.2 x 0.5)
    assert mechanism.next_clip(1.0, 1.0, 0.5, 0.2) == pytest.approx(math.exp(-0.1))
    assert mechanism.next_clip(1.0, 0.0, 0.5, 0.2) == pytest.approx(math.exp(0.1))


def test_a_histogram_is_clipped_to_its_bound_and_released_as_counts():
    counts = torch.tensor([30, 40, 0])
    noiseless = mechanism.noised_counts(counts, 10.0, 0.0, torch.Generator())
    assert noiseless.tolist() == pytest.approx([6.0, 8.0, 0.0])
    assert mechanism.released_counts(torch.tensor([-2.4, 3.5, 7.49], dtype=torch.float64)).tolist() == [0, 4, 7]
