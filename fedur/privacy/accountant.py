"""The privacy accountant: every release of a run as a dp-accounting event, composed by its RDP accountant (Mironov
2017) or its PLD accountant (privacy loss distributions; privacy.accountant), and epsilon at a delta read from it.

What a round releases (fedur/channel/noise.py, fedur/privacy/releases.py):
- the shared pieces (with the messages): a Gaussian mechanism of multiplier z on the sum of updates clipped to C.
  privacy.sampling fixed draws m of the federation's N clients without replacement: a
  SampledWithoutReplacementDpEvent(N, m, .) under the REPLACE_ONE relation (neighbouring federations differ in one
  client's data), where the sum's L2 sensitivity is 2C; all N taking part is the plain Gaussian event.
  privacy.sampling poisson: a PoissonSampledDpEvent(q, Gaussian) under ADD_OR_REMOVE_ONE (sensitivity C).
- each refresh's histograms (every member releases; no sampling): one Gaussian event per histogram, one or two of them
  (the cooperative estimates, and the selected counts). A histogram is non-negative, so replacing one clipped to L2
  norm B by another moves the sum by at most sqrt(2) B (|h - h'|^2 = |h|^2 + |h'|^2 - 2 <h, h'> with <h, h'> >= 0),
  not 2B; adding or removing one moves it by B.
Local privacy accounts each client alone: its own releases, the Gaussian mechanism on its update each round it takes
part (any two datasets of the client: sensitivity 2C) and on its histograms at each refresh (sqrt(2) B), with no
amplification (the server knows who took part).

How the library reads a Gaussian event's multiplier (`scaled`): its RDP accountant against sensitivity 1 under either
relation, so fedur passes z divided by the sensitivity in units of C (2, or sqrt(2) for a histogram); its PLD
accountant doubles the sensitivity itself under REPLACE_ONE (google/differential-privacy issue 378), so fedur passes z
times 2 over it. dp-accounting's PLD has no event for sampling without replacement: a PLD run samples all clients, or
Poissonly.

Every event of a run is the same at each round, so the accountant's state is a few counts (`Ledger`): a resume
composes the same events again and reads the same epsilon.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from fedur.errors import ConfigError

REPLACE_ONE_SENSITIVITY = 2.0  # a sum of vectors clipped to C moves by up to 2C when one of them is replaced
HISTOGRAM_SENSITIVITY = math.sqrt(2.0)  # a sum of non-negative histograms clipped to B: by up to sqrt(2) B


@dataclass(frozen=True)
class Releases:
    """The Gaussian releases of a run, each with what it costs once (fixed for the run)."""

    pieces: float | None  # z, the multiplier of a round's update (None: the method releases no update)
    histograms: float  # z_h of one histogram
    histograms_per_refresh: int  # 0 without pseudo-labels, 1 (selected counts) or 2 (and the cooperative estimates)
    clients: int  # N: the federation's clients
    sampled: int  # m: how many take part in a round (fixed sampling)
    rate: float  # q: the join rate (Poisson sampling)
    sampling: str  # "fixed" | "poisson"
    local: bool  # each client accounted alone (privacy.mode local)
    accountant: str = "rdp"  # privacy.accountant: "rdp" | "pld" (dp-accounting's)


@dataclass
class Ledger:
    """How many times each release happened: the accountant's whole state (checkpointed). Central: `rounds` (updates
    released) and `refreshes` (histogram releases). Local: per client, rounds taken part and refreshes."""

    rounds: list[int]  # central: one entry; local: one per client
    refreshes: list[int]

    @classmethod
    def start(cls, releases: Releases) -> Ledger:
        width = releases.clients if releases.local else 1
        return cls([0] * width, [0] * width)

    def state_dict(self) -> dict:
        return {"rounds": list(self.rounds), "refreshes": list(self.refreshes)}

    @classmethod
    def from_state(cls, state: dict) -> Ledger:
        return cls(list(state["rounds"]), list(state["refreshes"]))


def epsilons(releases: Releases, ledger: Ledger, delta: float) -> list[float]:
    """epsilon at `delta` after the ledger's releases: one value (central) or one per client (local)."""
    return [epsilon(releases, rounds, refreshes, delta) for rounds, refreshes in zip(ledger.rounds, ledger.refreshes)]


def epsilon(releases: Releases, rounds: int, refreshes: int, delta: float) -> float:
    """epsilon at `delta` of `rounds` update releases and `refreshes` histogram releases (0.0 before any)."""
    updates = rounds > 0 and releases.pieces is not None
    histograms = refreshes > 0 and releases.histograms_per_refresh > 0
    if not updates and not histograms:
        return 0.0
    if (updates and releases.pieces == 0) or (histograms and releases.histograms == 0):
        return math.inf  # a release without noise: no finite guarantee
    return _epsilon(releases, rounds, refreshes, delta)


@lru_cache(maxsize=4096)
def _epsilon(releases: Releases, rounds: int, refreshes: int, delta: float) -> float:
    from dp_accounting import pld, rdp

    logging.getLogger("absl").setLevel(logging.ERROR)  # its RDP series warns of orders it leaves out, at low orders
    kind = pld.PLDAccountant if releases.accountant == "pld" else rdp.RdpAccountant
    accountant = kind(neighboring_relation=relation(releases))
    for event, count in events(releases, rounds, refreshes):
        accountant.compose(event, count)
    value = accountant.get_epsilon(delta)
    return math.inf if value is None else float(value)


def relation(releases: Releases):
    """The neighbouring relation of the run's guarantee: add/remove one client with Poisson sampling (central), else
    replace one client's data."""
    from dp_accounting import NeighboringRelation

    if releases.sampling == "poisson" and not releases.local:
        return NeighboringRelation.ADD_OR_REMOVE_ONE
    return NeighboringRelation.REPLACE_ONE


def scaled(z: float, sensitivity: float, releases: Releases) -> float:
    """The multiplier to hand the library's Gaussian event for noise z (in units of the clip) on a sum whose sensitivity
    under the run's relation is `sensitivity` clips (the module's docstring)."""
    if releases.accountant == "pld" and (releases.local or releases.sampling != "poisson"):  # REPLACE_ONE: it doubles
        return z * REPLACE_ONE_SENSITIVITY / sensitivity
    return z / sensitivity


def events(releases: Releases, rounds: int, refreshes: int) -> list[tuple[object, int]]:
    """[(dp-accounting event, count)] of `rounds` update releases and `refreshes` histogram releases."""
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SampledWithoutReplacementDpEvent

    poisson = releases.sampling == "poisson" and not releases.local
    out = []
    if rounds and releases.pieces is not None:
        gaussian = GaussianDpEvent(scaled(releases.pieces, 1.0 if poisson else REPLACE_ONE_SENSITIVITY, releases))
        if releases.local or (not poisson and releases.sampled >= releases.clients) or (poisson and releases.rate >= 1):
            out.append((gaussian, rounds))
        elif poisson:
            out.append((PoissonSampledDpEvent(releases.rate, gaussian), rounds))
        else:
            out.append((SampledWithoutReplacementDpEvent(releases.clients, releases.sampled, gaussian), rounds))
    if refreshes and releases.histograms_per_refresh:
        histogram = GaussianDpEvent(scaled(releases.histograms, 1.0 if poisson else HISTOGRAM_SENSITIVITY, releases))
        out.append((histogram, refreshes * releases.histograms_per_refresh))
    return out


def noise_for_epsilon(target: float, delta: float, releases: Releases, rounds: int, refreshes: int,
                      histograms_follow: bool = True, tolerance: float = 1e-3) -> float:
    """The smallest noise multiplier z (to `tolerance`, relative) whose `rounds` update releases and `refreshes` histogram
    releases stay within epsilon `target` at `delta`, by bisection on the accountant; the histograms' z_h the same z
    (`histograms_follow`) or the one `releases` has."""
    from dataclasses import replace

    def spent(z: float) -> float:
        return epsilon(replace(releases, pieces=None if releases.pieces is None else z,
                               histograms=z if histograms_follow else releases.histograms), rounds, refreshes, delta)

    low, high = 0.0, 1.0
    while spent(high) > target:
        low, high = high, high * 2
        if high > 1e6:
            raise ConfigError(f"no noise multiplier up to 1e6 keeps epsilon within {target:g} at delta {delta:g}")
    while high - low > tolerance * high:
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > target else (low, middle)
    return high
