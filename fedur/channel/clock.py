"""The clock stage: who of the asked clients answers, and when (the `clock:` settings; docs/system.md). Uploads and
histograms lost on the way, each client's speed and bandwidth on a virtual clock, a deadline that leaves the late out
or takes their partial work, over-selection, and a minimum of uploads below which a round keeps the global state.

The arithmetic is fedur/federated/clock.py's; the draws are fedur/federated/streams.py's, each a pure function of
(run.seed, client, round), the same on every rank.

Under privacy the clock may read public quantities only (`public`): who is lost (run.seed's draws), the speeds and
bandwidths, a deadline in virtual seconds and the upload's size. Then every asked client that is not lost is
accepted, and a deadline only caps each client's local steps at what it can finish in time: a client's own number of
steps (its pseudo-label count, private data) never decides whether it counts (fedur/channel/__init__.py refuses what
would need it).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.channel.stage import Building, Stage, Stages
from fedur.errors import ConfigError
from fedur.federated import clock, streams
from fedur.federated.clock import Arrivals
from fedur.ranges import LossRate

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method

GROUP = "clock"


@dataclass
class ClockConfig:
    """How clients answer in time (docs/system.md): uploads lost on the way, each client's speed and bandwidth on a
    virtual clock, a deadline, over-selection, a minimum of uploads. All off by default."""

    drop_rate: LossRate = 0.0
    """Each taking-part client trains, and its upload is lost with this probability (per client and round, from the
    run's streams); at a refresh a client's pseudo-label histograms are lost likewise. 0: none is lost."""
    speeds: str = "equal"
    """Each client's compute speed in local steps per virtual second: 'equal' (1 for every client), 'lognormal'
    (exp(clock.speed_spread * z), z ~ N(0, 1) drawn once per client from run.seed), or a JSON or CSV file giving each
    client's speed (and bandwidth): docs/system.md."""
    speed_spread: NonNegativeFloat = 1.0
    """speeds=lognormal: the sigma of log-speed (and of log-bandwidth, drawn separately)."""
    bandwidth: PositiveFloat | None = None
    """Upload bandwidth in bytes per virtual second (speeds=lognormal: each client's times its own lognormal factor; a
    speeds file may give each client's); null: sending takes no virtual time."""
    deadline: PositiveFloat | None = None
    """The round's deadline: uploads that would arrive later are late (clock.late). In units of the round's median
    asked-client time (0.8 leaves the slower ones out) or in virtual seconds (clock.deadline_unit); null: the server
    waits for every upload."""
    deadline_unit: Literal["median", "seconds"] = "median"
    """clock.deadline in units of the round's median asked-client time, or in virtual seconds."""
    late: Literal["drop", "partial"] = "drop"
    """A late upload is left out ('drop'), or the client's partial work is taken: the local steps it finishes before
    the deadline leaves it time to send ('partial'; FedProx's partial work)."""
    over_select: NonNegativeFloat = 0.0
    """Ask ceil((1 + over_select) * m) clients, m those federation.join_rate draws, and take the first m uploads that
    arrive (Bonawitz et al. 2019; at most every client). 0: ask m."""
    min_uploads: PositiveInt = 1
    """A round with fewer uploads taken keeps the global state (no aggregation; said on the console)."""

    def check(self, num_clients: int, join_rate: float) -> None:
        """The refusals of these settings alone (with the federation's `num_clients` training clients and its join
        rate), each a ConfigError in one line."""
        if self.min_uploads > num_clients:
            raise ConfigError(f"clock.min_uploads={self.min_uploads} is more than the {num_clients} training clients: no "
                              "round could aggregate")
        if self.over_select and join_rate == 1:
            raise ConfigError("clock.over_select asks more clients than federation.join_rate draws, and join_rate 1 draws "
                              "every client already; lower join_rate")

    @property
    def reads_steps(self) -> bool:
        """Whether who counts depends on each client's own number of local steps (its pseudo-label count): a deadline
        in units of the round's median, late uploads dropped, or the first arrivals taken (over-selection)."""
        return self.deadline is not None and (self.deadline_unit == "median" or self.late == "drop") or self.over_select > 0


CONFIG = ClockConfig


def refusals(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """Under privacy the clock reads public quantities only: no deadline in units of the median time, no late upload
    dropped, no over-selection (each would let a client's own number of steps decide who counts)."""
    clock, mode = stages.clock, stages.privacy_mode
    if mode == "none" or not clock.reads_steps:
        return []
    return [f"privacy.mode={mode} with {reading(clock)}: who counts would follow a client's own number of local steps (its "
            "pseudo-label count: private data); under privacy a deadline is in virtual seconds with clock.late=partial (it "
            "caps each client's steps from public speeds), and no over-selection"]


def reading(clock: ClockConfig) -> str:
    """The clock settings that read each client's own steps, as the refusal names them."""
    parts = []
    if clock.deadline is not None and clock.deadline_unit == "median":
        parts.append("clock.deadline_unit=median")
    if clock.deadline is not None and clock.late == "drop":
        parts.append("clock.late=drop")
    if clock.over_select:
        parts.append("clock.over_select")
    return ", ".join(parts)


@dataclass(frozen=True)
class Clock(Stage):
    """The run's clock (plain values, fixed for the run; every rank the same)."""

    seed: int  # run.seed: the losses, the speeds
    drop_rate: float = 0.0
    speeds: Tensor | None = None  # (K,) float64 local steps per virtual second (None: 1 for every client)
    bandwidths: Tensor | None = None  # (K,) float64 bytes per virtual second (None: sending takes no time)
    deadline: float | None = None
    deadline_unit: str = "median"
    late: str = "drop"
    over_select: float = 0.0
    min_uploads: int = 1
    batch_size: int = 32  # a client's local steps: its epochs over its selected pseudo-labels in batches of this
    local_epochs: int = 1
    public: bool = False  # privacy on: who counts is decided from public quantities only (the module's docstring)

    @property
    def active(self) -> bool:
        """Anything beside every asked client answering at once."""
        return (self.drop_rate > 0 or self.speeds is not None or self.bandwidths is not None or self.deadline is not None
                or self.over_select > 0 or self.min_uploads > 1)

    def describe(self) -> list[str]:
        """What the console's "clients:" line says of the clock."""
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
        if self.min_uploads > 1:
            parts.append(f"min uploads {self.min_uploads}")
        return parts

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
        the round takes (over-selection). A public clock (privacy) takes every asked client that is not lost, each
        for at most the steps its speed finishes by the deadline (`Arrivals.budget`)."""
        num_clients = len(asked)
        steps = torch.zeros(num_clients, dtype=torch.long, device="cpu") if selected is None else \
            clock.planned_steps(selected, self.batch_size, self.local_epochs)
        speeds = torch.ones(num_clients, dtype=torch.float64, device="cpu") if self.speeds is None else self.speeds
        lost = torch.from_numpy(streams.lost(num_clients, self.drop_rate, self.seed, round_idx))
        deadline = None if self.deadline is None else clock.Deadline(self.deadline, self.deadline_unit, self.late)
        found = clock.arrivals(asked, steps, speeds, upload_bytes, self.bandwidths, lost, deadline,
                               wanted if self.over_select else None)
        return clock.publicly(found, steps, speeds, upload_bytes, self.bandwidths, self.deadline) if self.public else found

    def budgets(self, arrivals: Arrivals) -> Tensor | None:
        """(K,) int64 the local steps each asked client may take (-1: all of them), or None where no deadline cuts
        any: under late partial a late client's finished steps, under a public clock every client's cap."""
        if self.public and self.deadline is not None:
            return torch.where(arrivals.asked, arrivals.budget, -1)
        if self.late != "partial":
            return None
        return torch.where(arrivals.late, arrivals.budget, -1)

    def kept_global(self, accepted: Tensor) -> bool:
        """Whether the round keeps the global state: fewer uploads taken than clock.min_uploads."""
        return int(accepted.sum()) < self.min_uploads

    def histograms_lost(self, refresh_round: int, num_clients: int) -> Tensor | None:
        """(K,) bool: whose pseudo-label histograms are lost at the refresh that begins round `refresh_round` (each with
        clock.drop_rate; None: none)."""
        if self.drop_rate == 0:
            return None
        return torch.from_numpy(streams.lost(num_clients, self.drop_rate, self.seed, refresh_round, streams.LOST_HISTOGRAM))

    def check_deadline(self, upload_bytes: int) -> None:
        """A deadline in virtual seconds that no client could meet, even sending alone: a ConfigError before round 1."""
        if self.deadline is None or self.deadline_unit != "seconds" or self.bandwidths is None:
            return
        fastest = upload_bytes / float(self.bandwidths.max())
        if fastest >= self.deadline:
            raise ConfigError(f"clock.deadline={self.deadline:g} virtual seconds: the fastest client needs {fastest:.4g} "
                              f"to send its {upload_bytes} bytes alone, so no upload could arrive in time; a later "
                              "deadline, a larger clock.bandwidth, or deadline_unit median")


def build(cfg: ClockConfig, building: Building) -> Clock:
    """The run's Clock from its settings (a ConfigError for a speeds file that cannot be read or does not fit); a
    public clock where privacy is on (the module's docstring)."""
    seed = building.seed
    speeds, bandwidths = client_speeds(cfg.speeds, building.num_clients, cfg.speed_spread, seed, cfg.bandwidth)
    return Clock(seed=seed, drop_rate=cfg.drop_rate, speeds=speeds, bandwidths=bandwidths, deadline=cfg.deadline,
                 deadline_unit=cfg.deadline_unit, late=cfg.late, over_select=cfg.over_select, min_uploads=cfg.min_uploads,
                 batch_size=building.batch_size, local_epochs=building.local_epochs, public=building.privacy is not None)


def client_speeds(spec: str, num_clients: int, spread: float, seed: int, bandwidth: float | None) -> tuple[Tensor | None, Tensor | None]:
    """(speeds, bandwidths) of clock.speeds: 'equal' (None: 1 each; the bandwidth as given for every client),
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
    what = f"clock.speeds={path}"
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
