"""The adversary stage: clients that misbehave (the `adversary:` settings; docs/system.md). An attacker replaces its
update of the shared pieces before it leaves its rank (model poisoning: sign-flipped, scaled, Gaussian garbage, a
constant), or trains on flipped pseudo-labels (data poisoning: it then reports counts of the flipped labels too).

The attackers are drawn once per run from run.seed, an attacker's garbage from its own per-round stream
(fedur/federated/streams.py); the attacks' arithmetic is fedur/federated/attacks.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import Tensor

from fedur.channel.stage import Building, Stage, Stages
from fedur.errors import ConfigError
from fedur.federated import streams
from fedur.federated.attacks import DEFAULT_SCALE, MODEL_ATTACKS, flipped_labels, poisoned_update
from fedur.labels.base import PseudoLabels
from fedur.methods.base import shared_names

if TYPE_CHECKING:
    from fedur.labels import Labeller
    from fedur.methods import Method

GROUP = "adversary"


@dataclass
class AdversaryConfig:
    """Clients that misbehave (docs/system.md): how many, and what they do. None by default."""

    attackers: NonNegativeFloat = 0
    """Clients that misbehave (adversary.attack): a count (a whole number >= 1) or a fraction of the training clients
    (below 1, rounded half up), drawn once per run from run.seed. 0: none."""
    attack: Literal["none", "sign_flip", "scale", "gaussian", "constant", "label_flip"] = "none"
    """What an attacker does: its update sign-flipped (-s x update) or scaled (s x update), Gaussian garbage N(0, s^2),
    a constant s in every coordinate, or its pseudo-labels flipped (c -> C-1-c) before it trains; s = adversary.scale."""
    scale: PositiveFloat | None = None
    """s of adversary.attack; null: the attack's default (sign_flip 1, scale 10, gaussian 1, constant 1)."""

    def count(self, num_clients: int) -> int:
        """How many of `num_clients` training clients adversary.attackers makes: a count as given, a fraction (< 1)
        rounded half up. A ConfigError when it is not a whole count, exceeds the clients, or comes without an attack
        (or an attack without attackers)."""
        if self.attackers >= 1:
            if self.attackers != int(self.attackers):
                raise ConfigError(f"adversary.attackers={self.attackers:g}: a count must be a whole number (a fraction is "
                                  "below 1)")
            count = int(self.attackers)
        else:
            count = int(self.attackers * num_clients + 0.5)
        if count > num_clients:
            raise ConfigError(f"adversary.attackers={self.attackers:g} makes {count} attackers of {num_clients} training "
                              "clients; at most every client can attack")
        if (self.attack == "none") != (count == 0):
            raise ConfigError(f"adversary.attack={self.attack} with adversary.attackers={self.attackers:g}: set both (an "
                              "attack and at least one attacker) or neither")
        return count

    @property
    def poisons_updates(self) -> bool:
        return self.attack in MODEL_ATTACKS


CONFIG = AdversaryConfig


def refusals(stages: Stages, method: Method, labeller: Labeller | None) -> list[str]:
    """A model attack needs shared pieces to replace, a label flip pseudo-labels to flip."""
    attack, name, out = stages.adversary.attack, type(method).__name__, []
    if attack in MODEL_ATTACKS and not shared_names(method):
        out.append(f"adversary.attack={attack} replaces a client's update of the shared pieces, and {name} shares none; "
                   "label_flip poisons its pseudo-labels instead")
    if attack == "label_flip" and labeller is None:
        out.append(f"adversary.attack=label_flip flips pseudo-labels, and {name} has none")
    return out


@dataclass(frozen=True)
class Adversary(Stage):
    """The run's attackers and their attack (plain values, fixed for the run; every rank the same)."""

    seed: int  # run.seed: the attackers, an attacker's garbage
    attackers: tuple[int, ...] = ()
    attack: str = "none"
    scale: float = 1.0

    @property
    def active(self) -> bool:
        return bool(self.attackers)

    def describe(self) -> list[str]:
        """What the console's "clients:" line says of the attackers."""
        return [f"attackers {list(self.attackers)} ({self.attack}, scale {self.scale:g})"] if self.attackers else []

    def leave(self, client_id: int, round_idx: int, upload: dict[str, Tensor], current: dict[str, Tensor]) -> dict[str, Tensor]:
        """What client `client_id` sends in round `round_idx` (from 0) in place of `upload`: an attacker's shared pieces
        the downloaded value (`current`) plus the attack's update (its messages as they are); anyone else's as it is."""
        if self.attack not in MODEL_ATTACKS or client_id not in self.attackers:
            return upload
        generator = streams.attack_generator(self.seed, client_id, round_idx)
        out = dict(upload)
        for name, value in current.items():  # in declaration order: the garbage's draws in a fixed order
            update = upload[name] - value
            out[name] = value + poisoned_update(update, self.attack, self.scale, generator).to(value.dtype)
        return out

    def labels(self, client_id: int, chosen: PseudoLabels, num_classes: int) -> PseudoLabels:
        """The pseudo-labels client `client_id` trains on and reports: an attacker's flipped (adversary.attack
        label_flip: c -> C-1-c, its class mask mirrored), anyone else's as it chose them."""
        if self.attack != "label_flip" or client_id not in self.attackers:
            return chosen
        labels, mask = flipped_labels(chosen.labels, chosen.mask, num_classes)
        return replace(chosen, labels=labels, mask=mask)

    def accepted(self, accepted: Tensor) -> list[int]:
        """The attackers among the clients whose upload the server took ((K,) bool)."""
        return [k for k in self.attackers if bool(accepted[k])]


def build(cfg: AdversaryConfig, building: Building) -> Adversary:
    """The run's Adversary from its settings (a ConfigError where they cannot hold: AdversaryConfig.count)."""
    num_clients, seed = building.num_clients, building.seed
    count = cfg.count(num_clients)
    return Adversary(seed=seed, attackers=tuple(streams.chosen(num_clients, count, seed)) if count else (),
                     attack=cfg.attack, scale=cfg.scale if cfg.scale is not None else DEFAULT_SCALE.get(cfg.attack, 1.0))

