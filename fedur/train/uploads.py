"""Where a round's uploads are decided, in one place: who is asked, whose upload is lost or late, what an attacker
sends in place of its own, and what the aggregator keeps of the rows (federation.drop_rate ... clip_norm;
docs/system.md). Privacy's clipping and noise act on what is accepted here (fedur/train/server.py).

Everything is a pure function of the run's seed, the round and the client, the same on every rank: the speeds,
bandwidths and attackers are drawn once per run, the losses per client and round (fedur/federated/streams.py).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedur.errors import ConfigError
from fedur.federated import clock, robust, streams
from fedur.federated.attacks import DEFAULT_SCALE, MODEL_ATTACKS, poisoned_update
from fedur.federated.clock import Arrivals
from fedur.train.refresh import Answering


@dataclass(frozen=True)
class UploadRules:
    """How a run's clients answer and how the server combines them (plain values, fixed for the run)."""

    seed: int  # run.seed: the losses, the speeds, the attackers
    drop_rate: float = 0.0
    speeds: Tensor | None = None  # (K,) float64 local steps per virtual second (None: 1 for every client)
    bandwidths: Tensor | None = None  # (K,) float64 bytes per virtual second (None: sending takes no time)
    deadline: float | None = None
    deadline_unit: str = "median"
    late: str = "drop"
    over_select: float = 0.0
    min_uploads: int = 1
    attackers: tuple[int, ...] = ()
    attack: str = "none"
    attack_scale: float = 1.0
    aggregator: str = "mean"
    trim: float = 0.2
    krum_malicious: int = 0
    krum_keep: int | None = None
    clip_norm: float | None = None
    batch_size: int = 32  # a client's local steps: its epochs over its selected pseudo-labels in batches of this
    local_epochs: int = 1

    @property
    def active(self) -> bool:
        """Anything beside every asked client answering on time, honestly, averaged."""
        return (self.drop_rate > 0 or self.speeds is not None or self.bandwidths is not None or self.deadline is not None
                or self.over_select > 0 or self.min_uploads > 1 or bool(self.attackers) or self.aggregator != "mean")

    def summary(self, rounds: list[dict]) -> dict:
        """summary.json's "system": the attackers, and over the run's rounds (metrics.jsonl lines) how many uploads were
        asked for, lost, late and taken, the rounds that kept the global state, and the virtual clock."""
        total = lambda key: sum(len(r.get(key) or []) for r in rounds)  # noqa: E731
        return {"attackers": list(self.attackers), "attack": self.attack, "aggregator": self.aggregator,
                **{f"{key}_uploads": total(key) for key in ("asked", "answered", "dropped", "late", "surplus", "accepted")},
                "kept_global_rounds": [r["round"] for r in rounds if r.get("kept_global")],
                "virtual_seconds": rounds[-1].get("virtual_clock") if rounds else 0.0}

    def describe(self) -> str:
        """One line for the console when anything is on."""
        parts = []
        if self.drop_rate:
            parts.append(f"uploads lost with p={self.drop_rate:g}")
        if self.speeds is not None:
            parts.append(f"speeds {self.speeds.min():.3g}..{self.speeds.max():.3g} steps/s")
        if self.bandwidths is not None:
            parts.append(f"bandwidth {self.bandwidths.min():.3g}..{self.bandwidths.max():.3g} B/s")
        if self.deadline is not None:
            parts.append(f"deadline {self.deadline:g} {'x the median time' if self.deadline_unit == 'median' else 's'} "
                         f"(late: {self.late})")
        if self.over_select:
            parts.append(f"over-selection {self.over_select:g}")
        if self.attackers:
            parts.append(f"attackers {list(self.attackers)} ({self.attack}, scale {self.attack_scale:g})")
        if self.aggregator != "mean":
            parts.append(f"aggregator {self.aggregator}")
        if self.min_uploads > 1:
            parts.append(f"min uploads {self.min_uploads}")
        return "clients: " + "; ".join(parts)

    def asked(self, drawn: int, num_clients: int) -> int:
        """How many clients to ask when `drawn` are wanted (over-selection asks more), at most `num_clients`."""
        return min(num_clients, math.ceil((1 + self.over_select) * drawn - 1e-9)) if self.over_select else drawn

    def join_rate(self, join_rate: float, num_clients: int) -> float:
        """The rate whose ceil(rate * N) is the number asked (the method's draw of participants takes a rate)."""
        asked = self.asked(math.ceil(join_rate * num_clients - 1e-12) if join_rate < 1 else num_clients, num_clients)
        rate = asked / num_clients
        while math.ceil(rate * num_clients) > asked:  # float rounding of asked / N * N above `asked`
            rate = float(np.nextafter(rate, 0))
        return rate

    def arrivals(self, round_idx: int, asked: Tensor, selected: Tensor | None, upload_bytes: int, wanted: int) -> Arrivals:
        """The round's arrivals (fedur/federated/clock.py): `asked` (K,) bool, the clients that upload; `selected`: (K,)
        each one's selected pseudo-labels (None: a method that trains nothing: no local steps); `wanted`: how many
        the round takes (over-selection)."""
        num_clients = len(asked)
        steps = torch.zeros(num_clients, dtype=torch.long, device="cpu") if selected is None else \
            clock.planned_steps(selected, self.batch_size, self.local_epochs)
        speeds = torch.ones(num_clients, dtype=torch.float64, device="cpu") if self.speeds is None else self.speeds
        lost = torch.from_numpy(streams.lost(num_clients, self.drop_rate, self.seed, round_idx))
        deadline = None if self.deadline is None else clock.Deadline(self.deadline, self.deadline_unit, self.late)
        return clock.arrivals(asked, steps, speeds, upload_bytes, self.bandwidths, lost, deadline,
                              wanted if self.over_select else None)

    def at_refresh(self, refresh_round: int, num_clients: int) -> Answering:
        """Who answers the refresh that begins round `refresh_round`: whose pseudo-label histograms are lost (each with
        federation.drop_rate), whose labels an attacker flips (federation.attack label_flip)."""
        lost = None if self.drop_rate == 0 else \
            torch.from_numpy(streams.lost(num_clients, self.drop_rate, self.seed, refresh_round, streams.LOST_HISTOGRAM))
        return Answering(lost=lost, flipped=self.attackers if self.attack == "label_flip" else ())

    @property
    def poisons_uploads(self) -> bool:
        return self.attack in MODEL_ATTACKS and bool(self.attackers)

    def poison(self, client_id: int, round_idx: int, upload: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
        """An attacker's upload: each shared piece the downloaded value plus the attack's update (its messages as they
        are); anyone else's as it is."""
        if not self.poisons_uploads or client_id not in self.attackers:
            return upload
        generator = streams.attack_generator(self.seed, client_id, round_idx)
        out = dict(upload)
        for name, value in current.items():  # in declaration order: the garbage's draws in a fixed order
            update = upload[name] - value
            out[name] = value + poisoned_update(update, self.attack, self.attack_scale, generator).to(value.dtype)
        return out

    def robust(self, uploads: dict[str, Tensor], weights: Tensor, current: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor, dict]:
        """The rows the method aggregates under federation.aggregator, with its weights and what it did (metrics):
        median and trimmed_mean give every taken row of each shared piece the robust value (so that any average of
        them is it); krum and multi_krum zero the weight of the uploads they do not keep; norm_clip clips each taken
        row's update (all shared pieces together) to the bound. Messages pass as they are."""
        if self.aggregator == "mean" or not bool((weights > 0).any()):
            return uploads, weights, {}
        taken = torch.nonzero(weights > 0).flatten()
        names = list(current)
        rows = torch.cat([uploads[n][taken].reshape(len(taken), -1).double() for n in names], dim=1)  # (n, d)
        base = torch.cat([current[n].reshape(-1).double() for n in names])
        metrics: dict = {}
        if self.aggregator in ("krum", "multi_krum"):
            keep = 0 if self.aggregator == "krum" else (self.krum_keep or max(1, len(taken) - self.krum_malicious))
            kept = taken[robust.krum_select(rows, self.krum_malicious, keep)]
            weights = torch.where(torch.isin(torch.arange(len(weights), device="cpu"), kept), weights, torch.zeros_like(weights))
            return uploads, weights, {"kept": len(kept)}
        if self.aggregator == "median":
            value = robust.coordinate_median(rows)[None].expand_as(rows)
        elif self.aggregator == "trimmed_mean":
            value = robust.trimmed_mean(rows, self.trim)[None].expand_as(rows)
        else:  # norm_clip
            updates = rows - base
            bound = self.clip_norm if self.clip_norm is not None else robust.median_norm(updates)
            value = base + robust.clip_to_norm(updates, bound)
            metrics = {"clip_norm": bound, "clipped": int((updates.norm(dim=1) > bound).sum())}
        out, start = dict(uploads), 0
        for name in names:
            size = current[name].numel()
            piece = out[name].clone()
            piece[taken] = value[:, start:start + size].reshape(len(taken), *current[name].shape).to(piece.dtype)
            out[name], start = piece, start + size
        return out, weights, metrics


def attacker_count(attackers: float, num_clients: int) -> int:
    """How many of `num_clients` training clients federation.attackers makes: a count as given, a fraction (< 1)
    rounded half up. A ConfigError when it is not a whole count or exceeds the clients."""
    if attackers >= 1:
        if attackers != int(attackers):
            raise ConfigError(f"federation.attackers={attackers:g}: a count must be a whole number (a fraction is below 1)")
        count = int(attackers)
    else:
        count = int(attackers * num_clients + 0.5)
    if count > num_clients:
        raise ConfigError(f"federation.attackers={attackers:g} makes {count} attackers of {num_clients} training clients; "
                         "at most every client can attack")
    return count


def client_speeds(spec: str, num_clients: int, spread: float, seed: int, bandwidth: float | None) -> tuple[Tensor | None, Tensor | None]:
    """(speeds, bandwidths) of federation.speeds: 'equal' (None: 1 each; the bandwidth as given for every client),
    'lognormal' (each client's own factor, drawn once from `seed`, times 1 step per second and `bandwidth`), or a
    file (docs/system.md). A ConfigError for a file that cannot be read or does not fit."""
    if spec == "equal":
        return None, None if bandwidth is None else torch.full((num_clients,), float(bandwidth), dtype=torch.float64, device="cpu")
    if spec == "lognormal":
        speeds = torch.from_numpy(streams.client_factors(num_clients, spread, seed, streams.SPEED))
        bandwidths = None if bandwidth is None else \
            float(bandwidth) * torch.from_numpy(streams.client_factors(num_clients, spread, seed, streams.BANDWIDTH))
        return speeds, bandwidths
    speeds, bandwidths = read_speeds(Path(spec).expanduser(), num_clients)
    if bandwidths is None and bandwidth is not None:
        bandwidths = torch.full((num_clients,), float(bandwidth), dtype=torch.float64, device="cpu")
    return speeds, bandwidths


def read_speeds(path: Path, num_clients: int) -> tuple[Tensor, Tensor | None]:
    """A speeds file: JSON {"speeds": [...], "bandwidths": [...]} (bandwidths optional; lists indexed by client id), or
    CSV with a header `client,speed[,bandwidth]` and one row per client."""
    what = f"federation.speeds={path}"
    if not path.is_file():
        raise ConfigError(f"{what}: no such file; give 'equal', 'lognormal', or a JSON or CSV file of each client's "
                          "speed (docs/system.md)")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text())
            speeds, bandwidths = data["speeds"], data.get("bandwidths")
        else:
            with path.open(newline="") as f:
                rows = sorted(csv.DictReader(f), key=lambda r: int(r["client"]))
            if [int(r["client"]) for r in rows] != list(range(len(rows))):
                raise ValueError("the clients must be 0 .. K-1, each once")  # internal: a ConfigError just below
            speeds = [float(r["speed"]) for r in rows]
            bandwidths = [float(r["bandwidth"]) for r in rows] if rows and rows[0].get("bandwidth") not in (None, "") else None
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{what}: cannot be read ({type(e).__name__}: {e}); docs/system.md gives the format") from None
    out = []
    for name, values in (("speeds", speeds), ("bandwidths", bandwidths)):
        if values is None:
            out.append(None)
            continue
        if len(values) != num_clients or not all(isinstance(v, (int, float)) and v > 0 for v in values):
            raise ConfigError(f"{what}: {name} must be {num_clients} positive numbers, one per client (it has "
                              f"{len(values)})")
        out.append(torch.tensor([float(v) for v in values], dtype=torch.float64, device="cpu"))
    return out[0], out[1]


def build(fed, num_clients: int, seed: int, batch_size: int, local_epochs: int) -> UploadRules:
    """The run's UploadRules from its federation settings (`fed`: fedur.config.FederationConfig) for `num_clients`
    training clients. Raises a ConfigError for settings that cannot run (before anything is computed)."""
    count = attacker_count(fed.attackers, num_clients)
    if (fed.attack == "none") != (count == 0):
        raise ConfigError(f"federation.attack={fed.attack} with federation.attackers={fed.attackers:g}: set both (an attack "
                          "and at least one attacker) or neither")
    if fed.min_uploads > num_clients:
        raise ConfigError(f"federation.min_uploads={fed.min_uploads} is more than the {num_clients} training clients: no "
                          "round could aggregate")
    speeds, bandwidths = client_speeds(fed.speeds, num_clients, fed.speed_spread, seed, fed.bandwidth)
    return UploadRules(
        seed=seed, drop_rate=fed.drop_rate, speeds=speeds, bandwidths=bandwidths, deadline=fed.deadline,
        deadline_unit=fed.deadline_unit, late=fed.late, over_select=fed.over_select, min_uploads=fed.min_uploads,
        attackers=tuple(streams.chosen(num_clients, count, seed)) if count else (), attack=fed.attack,
        attack_scale=fed.attack_scale if fed.attack_scale is not None else DEFAULT_SCALE.get(fed.attack, 1.0),
        aggregator=fed.aggregator, trim=fed.trim, krum_malicious=fed.krum_malicious if fed.krum_malicious is not None else count,
        krum_keep=fed.krum_keep, clip_norm=fed.clip_norm, batch_size=batch_size, local_epochs=local_epochs,
    )


def check_deadline(rules: UploadRules, upload_bytes: int) -> None:
    """A deadline in virtual seconds that no client could meet, even sending alone: a ConfigError before round 1."""
    if rules.deadline is None or rules.deadline_unit != "seconds" or rules.bandwidths is None:
        return
    fastest = upload_bytes / float(rules.bandwidths.max())
    if fastest >= rules.deadline:
        raise ConfigError(f"federation.deadline={rules.deadline:g} virtual seconds: the fastest client needs {fastest:.4g} "
                          f"to send its {upload_bytes} bytes alone, so no upload could arrive in time; a later deadline, "
                          "a larger federation.bandwidth, or deadline_unit median")
