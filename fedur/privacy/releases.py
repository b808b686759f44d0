"""What a run with privacy on releases, and at what cost: the one object the round loop asks (fedur/train/round.py,
server.py, refresh.py). Built once from the privacy settings; its state between rounds (the ledger of releases and
the adaptive clip) is checkpointed with the run.

Where the noise is drawn: every draw comes from fedur's per-client, per-round streams (fedur/federated/streams.py),
a client's own for local privacy and the server's for central privacy, so the same bits whichever rank hosts a
client, and again after a resume.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

import fedur.privacy.accountant as accountant
import fedur.privacy.mechanism as mechanism
from fedur.errors import ConfigError
from fedur.federated import streams
from fedur.labels.base import weighs_classes
from fedur.methods.base import shared_names
from fedur.privacy.accountant import Ledger, Releases

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method


@dataclass
class Privacy:
    """privacy.mode central or local, for one run (every rank the same)."""

    mode: str  # "central" | "local"
    noise_multiplier: float
    clip_norm: float  # C now (adaptive clipping moves it; checkpointed)
    delta: float
    seed: int  # the noise's and the draw's secret seed (privacy.noise_seed, else drawn at the run's start; checkpointed)
    releases: Releases
    histogram_bound: float
    target_epsilon: float | None = None
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    count_std: float = 1.0
    cooperative: bool = False  # the labeller releases its estimates at each refresh
    bound_given: bool = True  # privacy.histogram_bound given (else read from the clients' sizes)
    ledger: Ledger = field(init=False)
    stopped_before: int | None = None  # the round (from 1) the run stopped before, at privacy.target_epsilon

    def __post_init__(self) -> None:
        self.ledger = Ledger.start(self.releases)

    @property
    def local(self) -> bool:
        return self.mode == "local"

    @property
    def releases_selected(self) -> bool:
        """Whether a refresh releases the selected counts (the class weights read their sum): the histograms beyond
        a cooperative labeller's estimates."""
        return self.releases.histograms_per_refresh > int(self.cooperative)

    # -- who takes part, and the uploads ------------------------------------------------------------------------

    def participants(self, round_idx: int, num_clients: int) -> Tensor:
        """(K,) bool: who takes part, drawn from the secret seed (amplification by sampling needs a draw the adversary
        cannot replay): ceil(join_rate K) without replacement, or each client with probability join_rate (Poisson)."""
        if self.releases.sampling == "poisson":
            return torch.from_numpy(streams.poisson_participants(num_clients, self.releases.rate, self.seed, round_idx))
        return torch.from_numpy(streams.participants(num_clients, self.releases.rate, self.seed, round_idx))

    def client_update(self, upload: dict[str, Tensor], downloaded: dict[str, Tensor], client_id: int,
                      round_idx: int) -> tuple[dict[str, Tensor], bool]:
        """What leaves a client's rank: its update (each shared piece minus what it downloaded, each message as it
        is) clipped together to C, with its own noise N(0, (z C)^2) in local mode; and whether its norm was within C
        (adaptive clipping's count). Every value float64, in the upload's shapes."""
        delta = {name: t.detach().cpu().double() - downloaded[name].double() if name in downloaded else t.detach().cpu().double()
                 for name, t in upload.items()}
        vector, norm = mechanism.clip(mechanism.flatten(delta), self.clip_norm)
        if self.local:
            vector = self.release_client_update(vector, client_id, round_idx)
        return mechanism.unflatten(vector, {name: t.double() for name, t in delta.items()}), norm <= self.clip_norm

    def server_uploads(self, updates: dict[str, Tensor], downloaded: dict[str, Tensor], like: dict[str, Tensor],
                       took_part: Tensor, drawn: int, within: Tensor | None, round_idx: int) -> dict[str, Tensor]:
        """The rows the method aggregates, from the gathered updates ({name: (K, *shape)} float64, zeros for the
        clients that did not upload): in local mode each taking-part client's own noised update added to what it
        downloaded; in central mode every taking-part row is the one private release, what was downloaded plus
        (sum of the clipped updates + N(0, (z C)^2)) / m (m: `drawn`, the clients drawn, or the expected number
        under Poisson sampling), so that whatever the method computes from the rows is post-processing of it.
        Adaptive clipping then moves C (`within`: (K,) bool, each taking-part client's norm within C)."""
        rows = {}
        if self.local:
            for name, update in updates.items():
                base = downloaded[name].double() if name in downloaded else torch.zeros_like(update[0])
                rows[name] = torch.where(_rows(took_part, update), base + update, torch.zeros_like(update)).to(like[name].dtype)
            return rows
        denominator = self.releases.rate * self.releases.clients if self.releases.sampling == "poisson" else drawn
        total = mechanism.flatten({name: u[took_part].sum(dim=0) for name, u in updates.items()})
        noised = self.release_update(total, round_idx) / max(denominator, 1e-12)
        mean = mechanism.unflatten(noised, {name: u[0] for name, u in updates.items()})
        for name, update in updates.items():
            value = (downloaded[name].double() + mean[name]) if name in downloaded else mean[name]
            rows[name] = torch.where(_rows(took_part, update), value.expand_as(update), torch.zeros_like(update)).to(like[name].dtype)
        if self.adaptive:
            self.clip_norm = self.next_clip(within[took_part], denominator, round_idx)
        return rows

    def update_multiplier(self) -> float:
        """The multiplier of the update's noise: z, or with adaptive clipping the share z_D the count leaves."""
        return mechanism.update_noise(self.noise_multiplier, self.count_std) if self.adaptive else self.noise_multiplier

    def next_clip(self, within: Tensor, denominator: float, round_idx: int) -> float:
        # centred (each client's b - 1/2: sensitivity 1/2 under add/remove, as Andrew et al.'s split assumes)
        count = self.release_count(float((within.double() - 0.5).sum()), round_idx)
        return mechanism.next_clip(self.clip_norm, count / max(denominator, 1e-12) + 0.5, self.target_quantile, self.clip_lr)

    # -- the histograms of a refresh -----------------------------------------------------------------------------

    def histogram(self, counts: Tensor, client_id: int, refresh_idx: int, what: int) -> Tensor:
        """(C,) float64: what leaves a client's rank of its histogram `counts` (what: streams.NOISE_ESTIMATES or
        NOISE_SELECTED): clipped to the bound, with its own noise in local mode."""
        clipped, _ = mechanism.clip(counts.to(torch.float64), self.histogram_bound)
        return self.release_client_histogram(clipped, client_id, refresh_idx, what) if self.local else clipped

    def totals(self, released: Tensor, members: Tensor, refresh_idx: int, what: int) -> Tensor:
        """(C,) int64: the released sum over the `members` of their gathered histograms ((K, C) float64): their sum
        (local: each already noised) or the sum plus the server's N(0, (z_h B)^2) (central)."""
        total = released[members].sum(dim=0)
        return mechanism.released_counts(total if self.local else self.release_histogram(total, refresh_idx, what))

    # -- the mechanism: every draw of noise on what a client's data gives, and nothing else ----------------------

    def release_update(self, total: Tensor, round_idx: int) -> Tensor:
        """Central: the sum of the clipped updates (D,) plus the server's N(0, (z C)^2) (z: the update's share under
        adaptive clipping)."""
        generator = streams.noise_generator(self.seed, streams.NOISE_PIECES, round_idx)
        return total + mechanism.gaussian(total.shape, self.update_multiplier() * self.clip_norm, generator)

    def release_client_update(self, vector: Tensor, client_id: int, round_idx: int) -> Tensor:
        """Local: a client's clipped update (D,) plus its own N(0, (z C)^2)."""
        generator = streams.noise_generator(self.seed, streams.NOISE_PIECES, round_idx, client_id)
        return vector + mechanism.gaussian(vector.shape, self.noise_multiplier * self.clip_norm, generator)

    def release_count(self, count: float, round_idx: int) -> float:
        """Adaptive clipping: the centred count of updates within C plus N(0, count_std^2)."""
        generator = streams.noise_generator(self.seed, streams.NOISE_CLIP_COUNT, round_idx)
        return count + float(mechanism.gaussian((1,), self.count_std, generator)[0])

    def release_histogram(self, total: Tensor, refresh_idx: int, what: int) -> Tensor:
        """Central: the sum (C,) of the clipped histograms plus the server's N(0, (z_h B)^2)."""
        generator = streams.noise_generator(self.seed, what, refresh_idx)
        return total + mechanism.gaussian(total.shape, self.releases.histograms * self.histogram_bound, generator)

    def release_client_histogram(self, clipped: Tensor, client_id: int, refresh_idx: int, what: int) -> Tensor:
        """Local: a client's clipped histogram (C,) plus its own N(0, (z_h B)^2)."""
        generator = streams.noise_generator(self.seed, what, refresh_idx, client_id)
        return clipped + mechanism.gaussian(clipped.shape, self.releases.histograms * self.histogram_bound, generator)

    # -- the accountant ------------------------------------------------------------------------------------------

    def record(self, took_part: Tensor, refreshed: bool) -> None:
        """A round's releases into the ledger: the update of every client that took part, the histograms of a
        refresh."""
        if self.local:
            for k in range(self.releases.clients):
                self.ledger.rounds[k] += int(bool(took_part[k])) if self.releases.pieces is not None else 0
                self.ledger.refreshes[k] += int(refreshed)
        else:
            self.ledger.rounds[0] += int(self.releases.pieces is not None)
            self.ledger.refreshes[0] += int(refreshed)

    def stop_before(self, round_idx: int, rounds: int, refreshes: bool) -> str | None:
        """The line that stops the run before round `round_idx` (from 0) whose releases (`refreshes`: a refresh's too)
        would take epsilon past the target (the checkpoint stays the last round's; summary.json says so); None: none."""
        if self.target_epsilon is None:
            return None
        after = self.epsilon_after(refreshes=refreshes)
        if after <= self.target_epsilon:
            return None
        self.stopped_before = round_idx + 1
        return (f"stopped before round {round_idx + 1} of {rounds}: its releases would take epsilon from "
                f"{self.epsilon():.3f} to {after:.3f}, past privacy.target_epsilon={self.target_epsilon:g} (delta {self.delta:g})")

    def epsilons(self) -> list[float]:
        """epsilon at delta so far: [the federation's] (central) or each client's (local)."""
        return accountant.epsilons(self.releases, self.ledger, self.delta)

    def epsilon(self) -> float:
        return max(self.epsilons())

    def epsilon_after(self, refreshes: bool) -> float:
        """epsilon once a further round has released (every client taking part, for local privacy: the bound
        before a round's draw); `refreshes`: the round refreshes the pseudo-labels."""
        return max(accountant.epsilon(self.releases, rounds + (self.releases.pieces is not None), refreshed + refreshes,
                                      self.delta) for rounds, refreshed in zip(self.ledger.rounds, self.ledger.refreshes))

    def round_record(self) -> dict:
        """What metrics.jsonl says of privacy after a round."""
        values = self.epsilons()
        return {"epsilon": _finite(max(values)), "delta": self.delta, "clip": self.clip_norm,
                **({"epsilon_per_client": [_finite(v) for v in values]} if self.local else {})}

    def summary(self) -> dict:
        """summary.json's "privacy": the mode, epsilon at delta spent (and each client's, local), the clip, the
        noise, and where the run stopped at its target."""
        values = self.epsilons()
        return {"mode": self.mode, "epsilon": _finite(max(values)), "delta": self.delta,
                **({"epsilon_per_client": [_finite(v) for v in values]} if self.local else {}),
                "noise_multiplier": self.noise_multiplier, "histogram_noise": self.releases.histograms,
                "clip": self.clip_norm, "target_epsilon": self.target_epsilon,
                "stopped_at_target": self.stopped_before is not None, "stopped_before_round": self.stopped_before,
                "accountant": f"{self.releases.accountant.upper()} (dp-accounting)", "sampling": self.releases.sampling}

    def describe(self) -> str:
        """The line a run with privacy starts with: the trust model, what is released, and what is not covered."""
        r = self.releases
        who = ("central: the ranks are trusted; each round the noised mean of the clipped updates is released"
               if not self.local else "local: each client's upload carries its own noise before it leaves its rank; "
               "each client is accounted alone (its quotas from its own estimate and the others' noised ones)")
        sampling = (f"{r.sampled} of {r.clients} clients drawn without replacement" if r.sampling == "fixed"
                    else f"Poisson sampling at rate {r.rate:g}")
        hidden = "" if self.local or r.sampled >= r.clients and r.sampling == "fixed" else \
            " from the secret seed (what the clients receive does not show who took part; the sampling discount)"
        clip = f"C {self.clip_norm:g}" + (f" adaptive (quantile {self.target_quantile:g})" if self.adaptive else "")
        bound = f"bound {self.histogram_bound:g}" + ("" if self.bound_given else " (the largest client's images: sizes taken as public)")
        hist = (f"; {r.histograms_per_refresh} histogram(s) per refresh, {bound}, z_h {r.histograms:g}"
                if r.histograms_per_refresh else "")
        target = "" if self.target_epsilon is None else f"; stops before epsilon would pass {self.target_epsilon:g}"
        return (f"privacy {who}; z {self.noise_multiplier:g}, {clip}, {sampling}{hidden}{hist}; epsilon at delta "
                f"{self.delta:g} ({r.accountant.upper()} accountant, dp-accounting){target}; not covered: the run's own "
                "record (metrics.jsonl, TensorBoard, the console: true counts, who took part, the virtual clock)")

    def state_dict(self) -> dict:
        """global.pt's "privacy": the ledger with the releases it was priced at, the clip, the secret seed."""
        return {"ledger": self.ledger.state_dict(), "clip": self.clip_norm, "seed": self.seed,
                "releases": asdict(self.releases)}

    def load_state_dict(self, state: dict) -> None:
        """A resume: the ledger, the clip and the seed as committed. Refused where the releases are priced otherwise
        now (a changed z, z_h, sampling or federation): the ledger counts releases, so it would re-price the past."""
        priced = Releases(**state["releases"])
        if priced != self.releases:
            changed = {k: (v, getattr(self.releases, k)) for k, v in asdict(priced).items() if getattr(self.releases, k) != v}
            raise ConfigError(f"the checkpoint's privacy ledger was priced at {changed} (checkpoint, now): a resume cannot "
                              "change what past releases cost, not even with run.force_resume; start a new run")
        self.ledger = Ledger.from_state(state["ledger"])
        self.clip_norm, self.seed = float(state["clip"]), int(state["seed"])


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


@dataclass(frozen=True)
class Federation:
    """What privacy's settings are read against: the federation's N clients (new clients held out not counted), the
    join rate, the noise's secret seed, its rounds and refresh period (what privacy.noise_multiplier calibrate calibrates for),
    and the clients' train images (None: before the data is read, fedur/app/settle.py's check: a histogram bound of 1)."""

    clients: int
    join_rate: float
    seed: int
    rounds: int = 1
    refresh_every: int = 1
    train_sizes: Tensor | None = None


def build(cfg, federation: Federation, labeller: Labeller | None, method: Method,
          uploads: dict[str, Tensor] | None = None) -> Privacy | None:
    """The run's Privacy from its settings (`cfg`: fedur.config.PrivacyConfig; None for privacy.mode none), or a
    ConfigError in one line for a setting that cannot hold. `method`: the run's fedur.methods.Method; `uploads`: what
    a client uploads (its shared pieces and messages, ServerState; None: from the method's declarations)."""
    if cfg.mode == "none":
        return None
    releases_update = bool(uploads) if uploads is not None else bool(shared_names(method)) or declares_messages(method)
    if method.summed:
        raise ConfigError(f"{type(method).__name__} sends sufficient statistics ({', '.join(method.summed)}) that no "
                          "per-client bound limits: it cannot run with privacy on; set privacy.mode none")
    if cfg.mode == "local" and not releases_update:
        raise ConfigError("privacy.mode=local protects what a client uploads, and this method shares nothing: use "
                          "privacy.mode central (for the histograms) or none")
    if cfg.adaptive_clip and cfg.mode == "local":
        raise ConfigError("privacy.adaptive_clip follows the noised fraction of clipped updates at the server: it is "
                          "central privacy's (privacy.mode central); local mode clips at a fixed privacy.clip")
    num_clients, join_rate, train_sizes = federation.clients, federation.join_rate, federation.train_sizes
    sampled = math.ceil(join_rate * num_clients)
    # the cooperative estimates (the quotas), and the selected counts where the loss's class weights read them
    per_refresh = 0 if labeller is None else int(labeller.cooperative) + int(weighs_classes(labeller))
    z = 1.0 if cfg.noise_multiplier == "calibrate" else float(cfg.noise_multiplier)
    z_h = z if cfg.histogram_noise is None else float(cfg.histogram_noise)
    if cfg.accountant == "pld" and cfg.mode == "central" and cfg.sampling == "fixed" and sampled < num_clients:
        raise ConfigError(f"privacy.accountant=pld prices no sampling without replacement ({sampled} of {num_clients} "
                          "clients drawn; dp-accounting's PLD has no such event): use privacy.accountant rdp, or "
                          "privacy.sampling poisson")
    if cfg.sampling == "poisson" and per_refresh and cfg.histogram_bound is None:
        raise ConfigError("privacy.sampling=poisson needs privacy.histogram_bound: the default, the largest client's train "
                          "images, would change when a client is added or removed (its size is private); give a bound "
                          "that does not depend on the data")
    releases = Releases(pieces=z if releases_update else None, histograms=z_h, histograms_per_refresh=per_refresh,
                        clients=num_clients, sampled=sampled, rate=join_rate, sampling=cfg.sampling, local=cfg.mode == "local",
                        accountant=cfg.accountant)
    if cfg.noise_multiplier == "calibrate":
        if cfg.target_epsilon is None:
            raise ConfigError("privacy.noise_multiplier=calibrate calibrates z to privacy.target_epsilon: set it")
        refreshes = 0 if labeller is None else -(-federation.rounds // federation.refresh_every)
        z = accountant.noise_for_epsilon(cfg.target_epsilon, cfg.delta, releases, federation.rounds, refreshes,
                                         histograms_follow=cfg.histogram_noise is None)
        releases = replace(releases, pieces=z if releases_update else None, histograms=z if cfg.histogram_noise is None else z_h)
    bound = float(cfg.histogram_bound) if cfg.histogram_bound is not None else (
        1.0 if train_sizes is None else float(train_sizes.max()))
    # Andrew et al.'s m / 20, or with few clients enough that the count takes a tenth of the budget: z_D = z / sqrt(0.9)
    count_std = cfg.clipped_count_stddev if cfg.clipped_count_stddev is not None else max(sampled / 20, math.sqrt(10) * z / 2)
    privacy = Privacy(mode=cfg.mode, noise_multiplier=z, clip_norm=float(cfg.clip), delta=float(cfg.delta),
                      seed=federation.seed, releases=releases, histogram_bound=bound, target_epsilon=cfg.target_epsilon,
                      adaptive=cfg.adaptive_clip, target_quantile=float(cfg.target_quantile), clip_lr=float(cfg.clip_lr),
                      count_std=float(count_std), cooperative=labeller is not None and labeller.cooperative,
                      bound_given=cfg.histogram_bound is not None)
    if cfg.adaptive_clip:
        privacy.update_multiplier()  # a ConfigError where the count's noise takes the whole budget
    if cfg.target_epsilon is not None:
        first = privacy.epsilon_after(refreshes=labeller is not None)
        if first > cfg.target_epsilon:
            raise ConfigError(f"privacy.target_epsilon={cfg.target_epsilon:g} is passed by the first round already "
                              f"(epsilon {first:.3g} at delta {cfg.delta:g}): raise privacy.noise_multiplier or the target")
    return privacy



def declares_messages(method) -> bool:
    """Whether the method's class overrides `messages` (what it sends beside its pieces), read without a model."""
    from fedur.methods.base import ClientSide

    return type(method).messages is not ClientSide.messages




def secret_seed() -> int:
    """A seed for the noise and the draw that nobody can replay: from the operating system's randomness."""
    return secrets.randbits(62)
