"""The one door, as a property of the structure: with privacy's mechanism replaced by a stub that releases fixed values
whatever it is given (fedur/privacy/releases.py's five release_* functions: the updates, a client's own update, the
adaptive clip's count, the histograms, a client's own histogram), two federations whose clients hold different images
end with bitwise the same server state, downloads, server model and every quantity a client receives. A value of the
clients' data that left them by any other way than the mechanism would make them differ.

The cases come from fedur's classes: every method (those privacy refuses, with the line that refuses them), each in
turn under central and local privacy, with each protocol and each stage privacy allows (lost uploads and histograms,
a deadline in virtual seconds taking partial work, a minimum of uploads, every attack, every robust rule under local
privacy), so that every method, protocol and stage is in at least one case."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from fedur.app.cli import build_parser, parse_config
from fedur.app.settle import settle
from fedur.channel import AdversaryConfig, AggregatorConfig, ClockConfig, composition, defaults
from fedur.config import PrivacyConfig
from fedur.errors import ConfigError
from fedur.launch_env import LaunchEnv
from fedur.methods.base import GlobalView
from fedur.plugins import builtin
from fedur.privacy import Federation, build
from fedur.privacy.releases import Privacy

pytestmark = pytest.mark.slow  # whole runs, two per case

# The demo's CLIP on a small demo (its predictions vary with the images, so that a leak shows in quotas, class weights
# and the server's pieces), two rounds with a refresh each, every checkpoint kept.
BASE = ["--config", "configs/smoke.yaml", "--dataset.train_per_class", "12", "--dataset.test_per_class", "3",
        "--federation.min_train_per_client", "5", "--federation.rounds", "2", "--federation.local_epochs", "1",
        "--run.keep_checkpoints", "5", "--run.progress", "false", "--run.figures", "false", "--privacy.noise_seed", "3",
        "--privacy.histogram_bound", "50", "--privacy.noise_multiplier", "1"]
MODES = {"central": ["--privacy.mode", "central", "--federation.join_rate", "0.75"], "local": ["--privacy.mode", "local"]}
PROTOCOLS = {
    "personal": [],
    "new-clients": ["--evaluation.new_clients", "1"],
    "base-to-novel": ["--evaluation.base_to_novel", "true"],
    "held-out-domain": ["--dataset", "SyntheticDomains", "--dataset.classes", "5", "--dataset.train_per_class", "12",
                        "--dataset.test_per_class", "4", "--dataset.domains", "[photo, sketch, mosaic]", "--federation.partition",
                        "domain_dirichlet", "--federation.clients_per_domain", "2", "--evaluation.held_out_domain", "mosaic"],
}
STAGES = {  # each stage privacy allows, as its settings
    "none": {},
    "drops": {"clock": ClockConfig(drop_rate=0.3, min_uploads=2)},
    "deadline": {"clock": ClockConfig(speeds="lognormal", deadline=3.0, deadline_unit="seconds", late="partial", min_uploads=3)},
    **{f"attack-{attack}": {"adversary": AdversaryConfig(attackers=1, attack=attack)}
       for attack in ("sign_flip", "scale", "gaussian", "constant", "label_flip")},
    **{f"aggregator-{rule}": {"aggregator": AggregatorConfig(rule=rule)}
       for rule in ("median", "trimmed_mean", "krum", "multi_krum", "norm_clip")},
}
FEDERATIONS = (["--federation.partition_seed", "1"], ["--federation.partition_seed", "2"])  # the clients' images differ
METHODS = {cls.__name__: cls for cls in builtin("method")}


def flags(stage: str) -> list[str]:
    """The command line of a stage's settings: every field that differs from its group's default."""
    out = []
    for group, settings in STAGES[stage].items():
        default = type(settings)()
        out += [item for key, value in vars(settings).items() if value != getattr(default, key)
                for item in (f"--{group}.{key}", str(value))]
    return out


def args(name: str, stage: str, protocol: str, mode: str) -> list[str]:
    return [*BASE, "--method", name, *MODES[mode], *PROTOCOLS[protocol], *flags(stage)]


def privacy_refuses(name: str, stage: str, mode: str) -> bool:
    """What the channel's stages and privacy refuse of a method, a stage and a mode (without parsing a command line)."""
    method = METHODS[name]()
    labeller = method.default_labeller()
    if composition(defaults(mode, **STAGES[stage]), method, labeller):
        return True
    try:
        build(PrivacyConfig(mode=mode, histogram_bound=50.0), Federation(4, 0.75 if mode == "central" else 1.0, 3, 2, 1),
              labeller, method)
    except ConfigError:
        return True
    return False


PARSER = None


def refusal(argv: list[str]) -> str | None:
    """The one line that refuses `argv` (settled as the entry point settles it), or None."""
    global PARSER
    PARSER = PARSER or build_parser(docs=False)
    try:
        settle(parse_config(argv, PARSER), LaunchEnv.read())
    except ConfigError as err:
        return str(err)
    return None


def cases() -> dict[str, list[str]]:
    """Every method once, method i with stage i, protocol i and the mode after every fourth (the next combination where
    privacy refuses one), then the stages, protocols and modes no method took, on the first method that runs them."""
    methods, stages, protocols, modes = list(METHODS), list(STAGES), list(PROTOCOLS), list(MODES)
    out = {}
    for i, name in enumerate(methods):
        for a, b, c in itertools.product(range(len(stages)), range(len(protocols)), range(len(modes))):
            stage, protocol = stages[(i + a) % len(stages)], protocols[(i + b) % len(protocols)]
            mode = modes[(i + i // len(protocols) + c) % len(modes)]
            if not privacy_refuses(name, stage, mode) and refusal(args(name, stage, protocol, mode)) is None:
                out[f"{name}-{mode}-{protocol}-{stage}"] = args(name, stage, protocol, mode)
                break
    for option in (*stages, *protocols, *modes):
        if not any(f"-{option}" in case for case in out):
            for name, stage, protocol, mode in itertools.product(methods, stages, protocols, modes):
                if option in (stage, protocol, mode) and not privacy_refuses(name, stage, mode) \
                        and refusal(args(name, stage, protocol, mode)) is None:
                    out[f"{name}-{mode}-{protocol}-{stage}"] = args(name, stage, protocol, mode)
                    break
    return out


CASES = cases()


def test_every_method_protocol_and_stage_is_a_case_or_refused_with_its_reason():
    names = " ".join(CASES)
    assert all(f"-{option}" in names for option in (*STAGES, *PROTOCOLS, *MODES)), names
    for cls in builtin("method"):
        if not any(case.startswith(f"{cls.__name__}-") for case in CASES):  # refused in every mode: say why
            said = [refusal([*BASE, "--method", cls.__name__, *MODES[mode]]) for mode in MODES]
            assert all(said), (cls.__name__, said)


class Stub:
    """Privacy's mechanism replaced: every release a fixed value of the shape it is given, whatever it is given (not
    uniform, so that quotas and class weights computed from it are not uniform either)."""

    @staticmethod
    def fixed(like: torch.Tensor, scale: float) -> torch.Tensor:
        return (scale * torch.linspace(0.5, 1.5, like.numel(), dtype=like.dtype, device=like.device)).reshape(like.shape)

    @staticmethod
    def install(monkeypatch) -> None:
        fixed = Stub.fixed
        monkeypatch.setattr(Privacy, "release_update", lambda self, total, round_idx: fixed(total, 0.01))
        monkeypatch.setattr(Privacy, "release_client_update", lambda self, vector, client_id, round_idx: fixed(vector, 0.01))
        monkeypatch.setattr(Privacy, "release_count", lambda self, count, round_idx: 0.25)
        monkeypatch.setattr(Privacy, "release_histogram", lambda self, total, refresh_idx, what: fixed(total, 20.0))
        monkeypatch.setattr(Privacy, "release_client_histogram",
                            lambda self, clipped, client_id, refresh_idx, what: fixed(clipped, 5.0))


RECEIVED_REFRESH = ("class_weights", "released_totals", "lost")  # what clients learn of a refresh (the rest: monitoring)


def received(run_dir: Path, result) -> dict:
    """Every quantity a client receives, and the server's: each committed round's server state (its shared pieces,
    the method's state, privacy's clip and ledger, what the refresh released), each client's shared pieces as it
    downloaded them, and the server's model."""
    out = {}
    for folder in sorted((run_dir / "checkpoints").glob("round_*")):
        state = torch.load(folder / "global.pt", weights_only=True)
        refresh = state["refresh"] or {}
        out[folder.name] = {"shared": state["shared"], "method": state["method"],
                            "privacy": {k: state["privacy"][k] for k in ("clip", "ledger")},
                            "refresh": {k: refresh.get(k) for k in RECEIVED_REFRESH}}
        for path in sorted(folder.glob("client_*.pt")):
            client = torch.load(path, weights_only=True)
            out[folder.name][path.stem] = {k: v for k, v in client["prompts"].items() if k in state["shared"]}
    host = result.host
    rounds = sorted((run_dir / "checkpoints").glob("round_*"))  # (none: a method of no rounds)
    last = torch.load(rounds[-1] / "global.pt", weights_only=True) if rounds else {"method": {}}

    def unreleased(name: str):
        raise AssertionError(f"the server's model asked for the clients' mean of {name}")

    model = host.method.global_model(host.model, GlobalView(dict(result.global_pieces), dict(last["method"]), host.start,
                                                            unreleased))
    out["server model"] = None if model is None else {"pieces": model.pieces, "extra": model.extra}
    return out


def equal(a, b, where: str = "") -> list[str]:
    """Where two nested structures of tensors, numbers, lists and dicts differ (bitwise for tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        return [w for k in sorted(set(a) | set(b)) for w in equal(a.get(k), b.get(k), f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [w for i, (x, y) in enumerate(zip(a, b)) for w in equal(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]


@pytest.mark.parametrize("case", list(CASES))
def test_what_clients_receive_is_what_the_mechanism_released_whatever_their_images(case, tmp_path, monkeypatch):
    from fedur.app.run import run

    Stub.install(monkeypatch)
    seen = []
    for i, federation in enumerate(FEDERATIONS):
        run_dir = tmp_path / f"federation{i}"
        result = run(parse_config([*CASES[case], *federation, "--run.output_dir", str(run_dir)]))
        seen.append(received(run_dir, result))
        train = [sorted(c.train_indices.tolist()) for c in result.host.clients]
        seen[-1]["images"] = train
    assert seen[0].pop("images") != seen[1].pop("images")  # the clients hold different images
    assert equal(seen[0], seen[1]) == []
