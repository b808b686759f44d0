"""The accountant against the library's own composition built by hand, and against closed forms of the Gaussian
mechanism; the calibration of z to a target; the ledger a resume reads back."""

import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp
from scipy.stats import norm

from fedur.privacy import accountant
from fedur.privacy.accountant import Ledger, Releases

DELTA = 1e-5


def releases(**changes) -> Releases:
    base = dict(pieces=1.0, histograms=2.0, histograms_per_refresh=2, clients=10, sampled=3, rate=0.3, sampling="fixed",
                local=False)
    return Releases(**{**base, **changes})


def library_epsilon(relation, composed, kind=rdp.RdpAccountant) -> float:
    acc = kind(neighboring_relation=relation)
    for event, count in composed:
        acc.compose(event, count)
    return acc.get_epsilon(DELTA)


def test_fixed_sampling_is_the_librarys_sampling_without_replacement_at_half_the_multiplier():
    # 3 of 10 clients per round, 5 rounds, 2 refreshes of two histograms; replace-one: the sum's sensitivity is 2C,
    # a histogram sum's sqrt(2) B
    expected = library_epsilon(dp_accounting.NeighboringRelation.REPLACE_ONE, [
        (dp_accounting.SampledWithoutReplacementDpEvent(10, 3, dp_accounting.GaussianDpEvent(0.5)), 5),
        (dp_accounting.GaussianDpEvent(2.0 / math.sqrt(2)), 4)])
    assert accountant.epsilon(releases(), 5, 2, DELTA) == pytest.approx(expected, rel=1e-12)


def test_poisson_sampling_is_the_librarys_poisson_event_under_add_or_remove():
    expected = library_epsilon(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, [
        (dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(1.0)), 20),
        (dp_accounting.GaussianDpEvent(2.0), 2 * 4)])
    assert accountant.epsilon(releases(sampling="poisson"), 20, 4, DELTA) == pytest.approx(expected, rel=1e-12)


def test_a_local_client_is_accounted_for_its_own_rounds_without_amplification():
    expected = library_epsilon(dp_accounting.NeighboringRelation.REPLACE_ONE, [
        (dp_accounting.GaussianDpEvent(0.5), 7), (dp_accounting.GaussianDpEvent(2.0 / math.sqrt(2)), 2 * 3)])
    assert accountant.epsilon(releases(local=True), 7, 3, DELTA) == pytest.approx(expected, rel=1e-12)
    ledger = Ledger([7, 2, 0], [3, 3, 0])
    values = accountant.epsilons(releases(local=True, clients=3), ledger, DELTA)
    assert values[0] == pytest.approx(expected) and values[0] > values[1] > 0 and values[2] == 0.0


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact epsilon of one Gaussian mechanism of multiplier sigma at delta (Balle & Wang 2018, Theorem 8):
    delta(eps) = Phi(-eps sigma + 1/(2 sigma)) - e^eps Phi(-eps sigma - 1/(2 sigma)), solved by bisection."""
    def delta_of(eps):
        return norm.cdf(-eps * sigma + 1 / (2 * sigma)) - math.exp(eps) * norm.cdf(-eps * sigma - 1 / (2 * sigma))

    low, high = 0.0, 100.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize("z, rounds", [(1.0, 10), (2.0, 50), (4.0, 100)])
def test_every_client_each_round_lies_between_the_exact_gaussian_and_the_zcdp_bound(z, rounds):
    # all N take part and no histograms: T Gaussian releases of multiplier z / 2 compose to one of (z / 2) / sqrt(T)
    spent = accountant.epsilon(releases(pieces=z, histograms_per_refresh=0, sampled=10), rounds, 0, DELTA)
    sigma = z / 2 / math.sqrt(rounds)
    rho = 1 / (2 * sigma ** 2)  # zCDP of the composition
    assert analytic_gaussian_epsilon(sigma, DELTA) <= spent <= rho + 2 * math.sqrt(rho * math.log(1 / DELTA))
    assert spent == pytest.approx(analytic_gaussian_epsilon(sigma, DELTA), rel=0.15)  # RDP is tight to ~10% here


def test_epsilon_grows_with_every_release_and_is_zero_before_any_and_infinite_without_noise():
    r = releases()
    assert accountant.epsilon(r, 0, 0, DELTA) == 0.0
    values = [accountant.epsilon(r, t, (t + 1) // 2, DELTA) for t in range(1, 6)]
    assert all(b > a for a, b in zip(values, values[1:]))
    assert math.isinf(accountant.epsilon(releases(pieces=0.0), 1, 0, DELTA))


@pytest.mark.slow
def test_the_calibrated_noise_meets_the_target_and_a_little_less_would_not():
    r = releases()
    z = accountant.noise_for_epsilon(4.0, DELTA, r, 10, 2)
    at = lambda m: accountant.epsilon(releases(pieces=m, histograms=m), 10, 2, DELTA)  # noqa: E731
    assert at(z) <= 4.0 < at(z * 0.99)


def test_the_ledger_is_the_accountants_whole_state():
    ledger = Ledger([3], [1])
    back = Ledger.from_state(ledger.state_dict())
    assert accountant.epsilons(releases(), back, DELTA) == accountant.epsilons(releases(), ledger, DELTA)


def test_the_librarys_rdp_reads_z_against_the_relations_own_sensitivity():
    """fedur passes z / 2 under REPLACE_ONE because the library's RDP Gaussian event costs the same under either
    relation (google/differential-privacy issue 378): if a release changes that, fedur's halving would count twice."""
    costs = [library_epsilon(relation, [(dp_accounting.GaussianDpEvent(2.0), 1)])
             for relation in (dp_accounting.NeighboringRelation.REPLACE_ONE, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)]
    assert costs[0] == pytest.approx(costs[1]) == pytest.approx(2.165715659029443)


def test_a_histogram_sum_moves_by_at_most_sqrt_2_b_when_one_non_negative_histogram_is_replaced():
    torch = pytest.importorskip("torch")
    from fedur.privacy.mechanism import clip

    generator = torch.Generator().manual_seed(3)
    worst = 0.0
    for _ in range(2000):  # any two non-negative histograms, each clipped to B = 5
        h, other = (clip(torch.rand(6, generator=generator, dtype=torch.float64) ** 4 * 40, 5.0)[0] for _ in range(2))
        worst = max(worst, float((h - other).norm()))
    assert worst <= 5.0 * math.sqrt(2) + 1e-12
    one_hot = torch.eye(6, dtype=torch.float64) * 5.0  # disjoint classes reach it
    assert float((one_hot[0] - one_hot[1]).norm()) == pytest.approx(5.0 * math.sqrt(2))
    assert accountant.HISTOGRAM_SENSITIVITY == pytest.approx(math.sqrt(2))


@pytest.mark.slow
def test_the_pld_accountant_is_the_librarys_pld_with_its_own_reading_of_replace_one():
    # every client each round: the library's PLD doubles the sensitivity itself under replace-one, so an update's event
    # is Gaussian(z) and a histogram's Gaussian(2 z_h / sqrt(2))
    expected = library_epsilon(dp_accounting.NeighboringRelation.REPLACE_ONE, [
        (dp_accounting.GaussianDpEvent(1.0), 5), (dp_accounting.GaussianDpEvent(2.0 * 2 / math.sqrt(2)), 4)], pld.PLDAccountant)
    assert accountant.epsilon(releases(accountant="pld", sampled=10), 5, 2, DELTA) == pytest.approx(expected, rel=1e-12)
    poisson = library_epsilon(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, [
        (dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(1.0)), 20),
        (dp_accounting.GaussianDpEvent(2.0), 2 * 4)], pld.PLDAccountant)
    assert accountant.epsilon(releases(accountant="pld", sampling="poisson"), 20, 4, DELTA) == pytest.approx(poisson, rel=1e-12)
    # the same mechanism priced both ways: PLD tighter than RDP, and the library's RDP at z / 2 under replace-one
    both = [accountant.epsilon(releases(accountant=kind, sampled=10), 10, 3, DELTA) for kind in ("pld", "rdp")]
    assert both[0] < both[1]
    rdp_by_hand = library_epsilon(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, [
        (dp_accounting.GaussianDpEvent(0.5), 10), (dp_accounting.GaussianDpEvent(2.0 / math.sqrt(2)), 6)])
    assert both[1] == pytest.approx(rdp_by_hand, rel=1e-12)


def test_the_librarys_pld_doubles_the_sensitivity_itself_under_replace_one():
    """fedur passes z, not z / 2, to the PLD accountant under REPLACE_ONE (google/differential-privacy issue 378): if a
    release changes that, fedur's PLD epsilon would be wrong by the factor."""
    replace, add = (library_epsilon(relation, [(dp_accounting.GaussianDpEvent(2.0 if relation.name == "REPLACE_ONE" else 1.0), 1)],
                                    pld.PLDAccountant)
                    for relation in (dp_accounting.NeighboringRelation.REPLACE_ONE, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE))
    assert replace == pytest.approx(add, rel=1e-9)
