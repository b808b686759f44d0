"""The privacy stage: what leaves a client's rank under privacy, and what the server releases of it (the `privacy:`
settings; docs/privacy.md). Off (privacy.mode none) it passes everything as it is.

On a client's rank (`leave`, `histogram`): its update (each shared piece minus what it downloaded, and each message)
clipped together to privacy.clip, with its own Gaussian noise in local mode; its pseudo-label histograms clipped to
privacy.histogram_bound, with its own noise in local mode. At the server (`rows`, `histogram_total`): in central mode
the one release of a round is the noised mean of the clipped updates (it stands in every accepted row: the reducer of
a private run), and of a refresh the noised sum of each histogram; in local mode each client's noised update is its
row. Every release goes through the five functions of fedur/privacy/releases.py::Privacy that draw noise
(`release_update`, `release_client_update`, `release_count`, `release_histogram`, `release_client_histogram`): the mechanism, which a
test replaces by a stub to show that nothing else of the clients' data reaches what they receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedur.channel.stage import Building, Exchange, Stage, Stages
from fedur.privacy import Privacy
from fedur.privacy.mechanism import released_counts

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method

GROUP, CONFIG = "privacy", None  # its settings: fedur/config.py::PrivacyConfig, built by fedur/privacy/releases.py::build
WITHIN = "privacy/within_clip"  # a wire entry under adaptive clipping: whether a client's update norm was within C


def refusals(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """Under privacy nothing but the mechanism's releases leaves the clients: no server model of the clients' personal
    pieces, no class weights from quotas nobody releases; under central privacy one noised mean stands for every row,
    which a method that keeps each client's own row cannot take."""
    mode, name, out = stages.privacy_mode, type(method).__name__, []
    if mode == "none":
        return out
    if mode == "central" and method.reads_rows == "own":
        out.append(f"{name} keeps each client's own upload (its aggregate reads ServerRound.rows), and privacy.mode=central "
                   "releases one value for all of them; use privacy.mode local or none")
    if method.personal_means():
        out.append(f"{name}'s server model averages the clients' personal {', '.join(method.personal_means())} "
                   f"({name}.personal_means), which privacy.mode={mode} does not release; share them (method.share), or keep "
                   "the template (method.global_text template)")
    if labeller is not None and getattr(labeller, "weight_source", "realized") == "requested":
        out.append(f"labeller.weight_source=requested weighs classes by the clients' summed quotas, which privacy.mode={mode} "
                   "does not release (only the noised selected counts); use labeller.weight_source=realized")
    return out


@dataclass
class Noise(Stage):
    """The privacy stage of a run (None: privacy off)."""

    privacy: Privacy | None = None

    @property
    def active(self) -> bool:
        return self.privacy is not None

    @property
    def central(self) -> bool:
        """Whether the server releases one noised mean (the run's reducer), not each client's row."""
        return self.privacy is not None and not self.privacy.local

    def wire(self, expected: dict[str, Tensor]) -> dict[str, Tensor]:
        """What one client's send looks like on its way to the server ({name: like}): the upload as it is, or under
        privacy its clipped update in float64 (with whether it was within the clip, adaptive clipping)."""
        if self.privacy is None:
            return expected
        out = {name: like.double() for name, like in expected.items()}
        return {**out, WITHIN: torch.tensor(0, device="cpu")} if self.privacy.adaptive else out

    def leave(self, client_id: int, round_idx: int, upload: dict[str, Tensor], downloaded: dict[str, Tensor]) -> dict[str, Tensor]:
        """What leaves client `client_id`'s rank of its `upload` in round `round_idx` (from 0)."""
        if self.privacy is None:
            return upload
        update, inside = self.privacy.client_update(upload, downloaded, client_id, round_idx)
        return {**update, WITHIN: torch.tensor(int(inside), device="cpu")} if self.privacy.adaptive else update

    def release(self, rows: dict[str, Tensor], weights: Tensor, exchange: Exchange) -> tuple[dict[str, Tensor], Tensor, dict]:
        """The rows the reducer and the method see, {name: (K, *shape)} in the upload's dtypes, from the gathered
        sends: as they are (privacy off), each accepted client's noised update added to what it downloaded (local),
        or the one release in every accepted row (central; its denominator the clients drawn, m)."""
        if self.privacy is None:
            return rows, weights, {}
        within = rows.pop(WITHIN).bool() if WITHIN in rows else None
        return self.privacy.server_uploads(rows, exchange.current, exchange.expected, weights > 0, exchange.drawn, within,
                                           exchange.round_idx), weights, {}

    def histogram(self, counts: Tensor, client_id: int, refresh_idx: int, what: int) -> Tensor:
        """What leaves client `client_id`'s rank of its (C,) int64 histogram `counts` (`what`: streams.NOISE_ESTIMATES
        or NOISE_SELECTED): the counts as they are (privacy off), or clipped and, local, noised (float64)."""
        if self.privacy is None:
            return counts
        return self.privacy.histogram(counts, client_id, refresh_idx, what)

    def histogram_like(self, num_classes: int) -> Tensor:
        dtype = torch.long if self.privacy is None else torch.float64
        return torch.zeros(num_classes, dtype=dtype, device="cpu")

    def histogram_total(self, rows: Tensor, members: Tensor, refresh_idx: int, what: int) -> Tensor:
        """(C,) int64: what the federation learns of the `members`' histograms ((K, C) gathered rows): their sum
        (privacy off, or local with each row noised already: as counts) or the noised sum (central)."""
        if self.privacy is None:
            return rows[members].sum(dim=0)
        return self.privacy.totals(rows, members, refresh_idx, what)

    def shown_rows(self, rows: Tensor) -> Tensor:
        """(K, C) what each client's histogram row showed the others: itself (privacy off; local: its noised row), or
        nothing under central privacy (zeros: only the noised sum is released)."""
        if self.privacy is None or self.privacy.local:
            return rows
        return torch.zeros_like(rows)

    def record(self, rows: Tensor, total: Tensor) -> tuple[Tensor, Tensor] | None:
        """What a refresh's record says was released of one histogram (privacy on: each row as the others saw it,
        and the released sum; None: privacy off, everything went in the clear)."""
        return None if self.privacy is None else (self.shown_rows(rows), total)

    def counted(self, rows: Tensor) -> Tensor:
        """(K, C) int64 the gathered histogram rows as counts (privacy: clipped, local noised; rounded, at least 0)."""
        return rows if self.privacy is None else released_counts(rows)


def build(cfg: None, building: Building) -> Noise:
    """The run's privacy stage: the mechanism fedur/privacy/releases.py::build made of the `privacy:` settings."""
    return Noise(building.privacy)
