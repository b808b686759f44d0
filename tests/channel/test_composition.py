"""What the channel's stages cannot do together (fedur/channel/__init__.py::composition), each refused in one line
with its reason before anything is loaded; and the reproductions of the privacy leaks the one door closes, each a
refusal now (they ran before, reporting an epsilon their releases did not have)."""

import pytest

from fedur.app.cli import parse_config
from fedur.app.settle import settle
from fedur.channel import composition, defaults
from fedur.channel.adversary import AdversaryConfig
from fedur.channel.clock import ClockConfig
from fedur.channel.reducer import AggregatorConfig
from fedur.errors import ConfigError
from fedur.launch_env import LaunchEnv
from fedur.methods import FedUR, PromptFL
from fedur.plugins import builtin

TINY = ["--config", "configs/tiny.yaml", "--run.progress", "false"]
CENTRAL = ["--privacy.mode", "central", "--privacy.noise_multiplier", "2", "--privacy.clip", "0.03"]


def refused(*flags: str) -> str:
    """The one line that refuses the tiny run with `flags` (settled as the entry point settles it)."""
    with pytest.raises(ConfigError) as caught:
        settle(parse_config([*TINY, *flags]), LaunchEnv.read())
    return str(caught.value)


def test_the_issues_deadline_reproduction_is_refused_where_it_ran_with_an_epsilon_it_did_not_have():
    # clients 1 and 3 (the most pseudo-labels) were late in both rounds and the global state kept: an event only the
    # data could cause, in a run that reported epsilon 9.01 / 13.78
    says = refused(*CENTRAL, "--federation.rounds", "2", "--clock.deadline", "0.9", "--clock.min_uploads", "4")
    assert "who counts would follow a client's own number of local steps" in says and "clock.deadline_unit=median" in says
    says = refused(*CENTRAL, "--clock.deadline", "5", "--clock.deadline_unit", "seconds")  # late uploads dropped
    assert "clock.late=drop" in says
    assert "clock.over_select" in refused(*CENTRAL, "--federation.join_rate", "0.5", "--clock.over_select", "0.5")


@pytest.mark.parametrize("flags", [["--method.share", "none"], ["--method.share", "text"], ["--method.global_text", "mean"]],
                         ids=["share none", "share text", "global text mean"])
def test_a_server_model_of_the_clients_personal_prompts_is_refused_under_privacy(flags):
    # the issue's second reproduction: the server model went from 56.25% to 60.25% on the clients' plain mean, while the
    # reported epsilon (10.73) was the histograms' alone
    says = refused(*CENTRAL, "--method", "FedUR", *flags)
    assert "server model averages the clients' personal" in says and "does not release" in says


def test_a_method_that_keeps_each_clients_own_upload_is_refused_where_one_value_is_released():
    # pFedMoAP's bank held the noised mean as every expert: identical experts, silently
    assert "keeps each client's own upload" in refused(*CENTRAL, "--method", "PFedMoAP")
    assert "keeps each client's own upload" in refused("--method", "PFedMoAP", "--aggregator.rule", "median")
    settle(parse_config([*TINY, "--method", "PFedMoAP", "--aggregator.rule", "multi_krum"]), LaunchEnv.read())  # its rows


def test_central_privacy_is_a_reducer_of_its_own_and_local_privacy_composes_with_a_robust_rule():
    assert "a reducer of its own" in refused(*CENTRAL, "--aggregator.rule", "trimmed_mean")
    settle(parse_config([*TINY, "--privacy.mode", "local", "--aggregator.rule", "median", "--clock.drop_rate", "0.2"]),
           LaunchEnv.read())  # a rule over rows noised on their ranks, and lost uploads: data-independent


def test_a_deadline_in_virtual_seconds_taking_partial_work_and_lost_uploads_run_under_privacy():
    settle(parse_config([*TINY, *CENTRAL, "--clock.drop_rate", "0.3", "--clock.min_uploads", "2", "--clock.speeds",
                         "lognormal", "--clock.deadline", "40", "--clock.deadline_unit", "seconds", "--clock.late", "partial"]),
           LaunchEnv.read())


def test_privacy_refuses_class_weights_from_the_quotas_nobody_releases():
    says = refused(*CENTRAL, "--labeller", "CoDPL", "--labeller.weight_source", "requested")
    assert "labeller.weight_source=requested" in says


def test_privacy_under_poisson_sampling_needs_a_histogram_bound_and_pld_needs_a_sampling_it_prices():
    says = refused("--privacy.mode", "central", "--privacy.sampling", "poisson", "--federation.join_rate", "0.5")
    assert "privacy.histogram_bound" in says
    says = refused("--privacy.mode", "central", "--privacy.accountant", "pld", "--federation.join_rate", "0.5")
    assert "prices no sampling without replacement" in says
    settle(parse_config([*TINY, "--privacy.mode", "central", "--privacy.accountant", "pld"]), LaunchEnv.read())


def test_every_refusal_names_the_settings_it_refuses():
    """Each line the composition can give names the settings that make it (so a user knows what to change)."""
    cases = [
        (defaults(aggregator=AggregatorConfig(rule="median")), "GDAU", "aggregator.rule"),
        (defaults(adversary=AdversaryConfig(attackers=1, attack="sign_flip")), "ZeroShot", "adversary.attack"),
        (defaults("local", clock=ClockConfig(over_select=0.5)), "FedUR", "clock.over_select"),
        (defaults("central", aggregator=AggregatorConfig(rule="krum")), "FedUR", "privacy.mode=central"),
    ]
    methods = {cls.__name__: cls for cls in builtin("method")}
    for stages, name, says in cases:
        method = methods[name]()
        lines = composition(stages, method, method.default_labeller())
        assert lines and says in lines[0], (name, lines)
    assert composition(defaults(), FedUR(), FedUR().default_labeller()) == []  # everything off: nothing refused
    assert composition(defaults("central"), PromptFL(), PromptFL().default_labeller()) == []
