"""Runs the test files share: every one of fedur's methods on the tiny model, run once for the session (in one process,
`tests/run_many.py`) and compared with, bitwise, by several files: its run on 2 ranks (tests/test_methods.py), its
run crashed and resumed (tests/test_resume.py), its run with the train labels scrambled (tests/test_label_blind.py).

The cases come from fedur's classes (fedur/plugins.py): a method added to fedur is in every one of those tests with
nothing listed here. Beside them, the cases that exercise one mechanism each (SPECIAL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Two rounds with a refresh each (the second from trained prompts: state carried over), each client keeping its SGD
# momentum, every checkpoint kept: what a resume must restore exactly, and what a scramble of the labels must not touch.
SHARED = ["--config", "configs/tiny.yaml", "--federation.rounds", "2", "--federation.refresh_every", "1",
          "--optim.optimizer_state", "client", "--run.keep_checkpoints", "5", "--run.progress", "false"]

# Smaller than a method's defaults where a test checks a bound the tiny data would not reach.
SMALLER = {"pfedprompt": ["--method.cache_shots", "4"], "fedpgp": ["--method.rank", "2"]}
# Beside a method's defaults where its case should exercise more: DP-FPL's local noise, drawn per client and step from
# the run's secret seed (fixed here: runs of the same settings are compared).
SMALLER["dpfpl"] = ["--method.local_noise", "1.0", "--privacy.noise_seed", "7"]

# One mechanism each, beside the methods' own cases.
SPECIAL = {
    # FedUR with clients trained together in fixed groups {0, 1, 2} and {3}: placed whole, so 2 ranks equal 1
    "fedur-grouped": ["--run.clients_per_step", "3"],
    # pFedPrompt's logits read each client's cache: grouped, its own forward runs once per client
    "pfedprompt-grouped": ["--method", "PFedPrompt", "--run.clients_per_step", "2"],
    # training-free, no labeller: the server sums the clients' statistics; half the clients take part each round
    "gdau-join": ["--method", "GDAU", "--federation.join_rate", "0.5"],
    # control variates in every client's extra and the server's state; their deltas sent as messages
    "scaffold-join": ["--method", "SCAFFOLD", "--federation.join_rate", "0.75"],
    # CPL's GRIP pools grow from one refresh to the next (the caps read the last fill)
    "promptprox-grip": ["--method", "PromptProx", "--labeller", "CPL", "--labeller.per_class", "grip"],
    # a piece of a plugin's own (an adapter on the image features), personal
    "adapter": ["--method", "examples.feature_adapter.FeatureAdapter"],
    # client 3 held out of every round, then adapting alone; the server's model with the clients' mean context
    "fedur-new-clients": ["--evaluation.new_clients", "1", "--method.global_text", "mean"],
    # base-to-novel: the tiny data's first 3 classes trained, the other 2 tested with their names (a generator
    # conditioned on the names; FedUR's server model with the clients' mean context)
    "fedtpg-base-to-novel": ["--method", "FedTPG", "--evaluation.base_to_novel", "true"],
    "fedur-base-to-novel": ["--evaluation.base_to_novel", "true", "--method.global_text", "mean"],
    # leave-one-domain-out: photo and sketch over 2 clients each, mosaic's test images for the server's model only
    "promptfl-held-out-domain": ["--method", "PromptFL", "--dataset", "SyntheticDomains", "--dataset.classes", "5",
                                 "--dataset.train_per_class", "12", "--dataset.test_per_class", "4",
                                 "--dataset.domains", "[photo, sketch, mosaic]", "--federation.partition", "domain_dirichlet",
                                 "--federation.clients_per_domain", "2", "--evaluation.held_out_domain", "mosaic"],
    # central privacy: the noised mean of the clipped updates, adaptive clipping, 3 of 4 clients drawn without
    # replacement, the cooperative histograms noised; every draw from the run's per-round streams
    # (a fixed privacy.noise_seed: two runs of the same settings are compared; the default draws a secret one)
    "fedur-private-central": ["--privacy.mode", "central", "--privacy.noise_multiplier", "0.5", "--privacy.clip", "0.05",
                              "--privacy.adaptive_clip", "true", "--federation.join_rate", "0.75", "--privacy.noise_seed", "5"],
    # local privacy: each upload (SCAFFOLD's control-variate deltas too) noised on its client's rank, Poisson sampling
    # (the histograms' bound given: under Poisson sampling the clients' sizes are private; 111 is the largest client's)
    "scaffold-private-local": ["--method", "SCAFFOLD", "--privacy.mode", "local", "--privacy.noise_multiplier", "1.0",
                               "--privacy.clip", "0.05", "--privacy.sampling", "poisson", "--federation.join_rate", "0.75",
                               "--privacy.noise_seed", "6", "--privacy.histogram_bound", "111"],
    # clients that drop and lag: uploads and histograms lost, lognormal speeds and bandwidths, a deadline at 0.9 x the
    # median time taking the late ones' partial work, 3 of 4 wanted and all 4 asked (over-selection), at least 2 taken
    "fedur-stragglers": ["--clock.drop_rate", "0.3", "--clock.speeds", "lognormal", "--clock.bandwidth",
                         "2000", "--clock.deadline", "0.9", "--clock.late", "partial", "--federation.join_rate",
                         "0.75", "--clock.over_select", "0.34", "--clock.min_uploads", "2"],
    # an attacker sending Gaussian garbage from its own per-round stream, the trimmed mean's rows
    "fedcopl-attacked": ["--method", "FedCoPL", "--adversary.attackers", "1", "--adversary.attack", "gaussian",
                         "--aggregator.rule", "trimmed_mean", "--aggregator.trim", "0.25"],
    # attackers (0 and 1) training on flipped pseudo-labels, multi-Krum's choice of rows, late uploads dropped at
    # 1.2 x the median time (client 1, the slowest, is late; client 0 is taken)
    "promptfl-flipped-krum": ["--method", "PromptFL", "--adversary.attackers", "2", "--adversary.attack", "label_flip",
                              "--aggregator.rule", "multi_krum", "--clock.speeds", "lognormal",
                              "--clock.deadline", "1.2", "--clock.late", "drop", "--clock.min_uploads", "1"],
    # a boosted update clipped to the round's median update norm
    "fedur-scaled-clipped": ["--adversary.attackers", "1", "--adversary.attack", "scale", "--aggregator.rule",
                             "norm_clip"],
    # an asynchronous server, FedBuff: clients of speeds 1, 2, 4 and 0.5 steps per second (0 and 1 on one rank, 2 and 3
    # on the other under 2 ranks), one local step a job, a server step every 2 arrivals, a refresh at each client's own
    # start: the hand-worked event sequence of docs/asynchronous.md (tests/train/test_asynchronous.py), with jobs in
    # flight from older versions at every commit
    "fedur-fedbuff": ["--server.mode", "fedbuff", "--server.buffer", "2", "--clock.speeds", "tests/speeds_hand_worked.json",
                      "--optim.batch_size", "256", "--federation.local_epochs", "1"],
    # FedAsync: three of the four clients training at once (who starts drawn from the idle), lognormal speeds and
    # bandwidths, the hinge staleness function, a sign-flipping attacker, an evaluation every second step
    "promptfl-fedasync": ["--method", "PromptFL", "--server.mode", "fedasync", "--server.concurrency", "3",
                          "--server.staleness", "hinge", "--server.hinge_b", "1", "--server.evaluate_every", "2",
                          "--clock.speeds", "lognormal", "--clock.bandwidth", "2000", "--adversary.attackers", "1",
                          "--adversary.attack", "sign_flip"],
    # clients 2 and 3 held out, grouped {2, 3}: pFedPrompt's cache built at the adaptation from zero-shot labels
    "pfedprompt-new-clients": ["--method", "PFedPrompt", "--evaluation.new_clients", "0.5", "--run.clients_per_step", "2",
                               "--evaluation.new_client_labels", "zero_shot", "--evaluation.new_client_epochs", "1"],
}


# Evaluation without labels (docs/label-free.md): a validation split set aside from each client's train images, every
# estimate per round, each client keeping the model its estimate rates highest. FedUR grouped {0, 1} {2, 3}: its server
# model shares the personal pass on the test images and has a pass of its own on the validation images; FedOTP's
# server model has its own passes everywhere (its per-client accuracy too). Also label-blind (tests/test_label_blind.py).
LABEL_FREE = {
    "fedur-label-free": ["--data.validation_fraction", "0.2", "--evaluation.select", "label_free", "--run.clients_per_step", "2"],
    "fedotp-label-free": ["--method", "FedOTP", "--data.validation_fraction", "0.25", "--evaluation.select", "label_free",
                          "--evaluation.estimator", "confidence"],
}
SPECIAL.update(LABEL_FREE)


def method_cases() -> dict[str, list[str]]:
    """Every one of fedur's methods with its own labeller (by its key), then each labeller once more beside a method
    that trains with another by default (`<method>+<labeller>`), the methods taken in turn."""
    from fedur import plugins

    methods = plugins.builtin("method")
    cases = {cls.key: ["--method", cls.__name__, *SMALLER.get(cls.key, [])] for cls in methods}
    trainable = [cls for cls in methods if cls.trains]
    for i, labeller in enumerate(plugins.builtin("labeller")):
        others = [m for m in trainable if type(m().default_labeller()) is not labeller]
        method = others[i % len(others)]
        cases[f"{method.key}+{labeller.key}"] = ["--method", method.__name__, "--labeller", labeller.__name__,
                                                  *SMALLER.get(method.key, [])]
    return cases


def method_of(flags: list[str]) -> type:
    """The method class a case's flags run (FedUR without --method; a user's by its import path)."""
    from fedur import plugins

    name = flags[flags.index("--method") + 1] if "--method" in flags else "FedUR"
    return next((cls for cls in plugins.builtin("method") if cls.__name__ == name), None) or plugins.by_path("method", name)


def runs_rounds(flags: list[str]) -> bool:
    """Whether the case's method runs rounds (zero-shot CLIP has none: no metrics.jsonl, no checkpoints)."""
    return method_of(flags)().rounds(1) > 0


def every_case() -> dict[str, list[str]]:
    return {**method_cases(), **SPECIAL}


def run_all(cases: dict[str, list[str]], root: Path, ranks: int = 1, timeout: int = 900) -> None:
    """Each case into root/<name>, in one process (`ranks` 2: one `fabric run` of 2 CPU ranks)."""
    from .conftest import run_ok, run_ok_on_a_free_port

    argv = [json.dumps([*SHARED, *flags, "--run.output_dir", str(root / name)]) for name, flags in cases.items()]
    if ranks == 1:
        run_ok([sys.executable, "tests/run_many.py", *argv], timeout=timeout)
        return
    fabric = str(Path(sys.executable).parent / "fabric")
    run_ok_on_a_free_port(lambda port: [fabric, "run", "--accelerator", "cpu", "--devices", str(ranks), "--main-port", str(port),
                                         "tests/run_many.py", *argv], timeout=timeout)


def ran(root: Path, name: str) -> Path:
    run_dir = root / name
    assert (run_dir / "summary.json").is_file(), f"{name}: no finished run in {run_dir}"
    return run_dir

