"""The server stage (fedur/channel/server.py): what an asynchronous server refuses in one line before anything is
loaded, which methods run under it (every one of fedur's, from the classes), and the arithmetic of a FedBuff and a
FedAsync step on hand-written rows."""

import pytest
import torch

from fedur.app.cli import parse_config
from fedur.app.settle import settle
from fedur.channel import ORDER, composition, defaults, server
from fedur.channel.server import Server, ServerConfig, method_refusal
from fedur.channel.stage import Building, Exchange
from fedur.errors import CommandLineError, ConfigError
from fedur.federated.aggregation import weighted_average
from fedur.launch_env import LaunchEnv
from fedur.methods import FedUR
from fedur.methods.base import Aggregated, ServerRound
from fedur.plugins import builtin

TINY = ["--config", "configs/tiny.yaml", "--run.progress", "false"]


def refused(*flags: str) -> str:
    with pytest.raises(ConfigError) as caught:
        settle(parse_config([*TINY, *flags]), LaunchEnv.read())
    return str(caught.value)


def test_the_server_is_a_stage_before_the_reducer():
    assert [stage.GROUP for stage in ORDER][-2:] == ["server", "aggregator"]


@pytest.mark.parametrize("mode", ["fedbuff", "fedasync"])
def test_every_method_runs_asynchronously_or_is_refused_with_its_reason(mode):
    """Every one of fedur's methods: those whose aggregate is the mean (or that say what they do with stale arrivals:
    Method.stale_inputs) compose; the others are refused, each with the reason its refusal gives."""
    stages = defaults(server=ServerConfig(mode=mode))
    refused_ones = {}
    for cls in builtin("method"):
        method = cls()
        lines = composition(stages, method, method.default_labeller())
        if method_refusal(method) is None:
            assert lines == [], (cls.__name__, lines)
        else:
            assert lines and lines[0].startswith(f"server.mode={mode}: {cls.__name__} "), lines
            refused_ones[cls.__name__] = lines[0]
    assert set(refused_ones) == {"ZeroShot", "GDAU", "SCAFFOLD", "PFedMoAP"}, sorted(refused_ones)
    assert "trains nothing" in refused_ones["GDAU"] and "control variate" in refused_ones["SCAFFOLD"]
    assert "own upload" in refused_ones["PFedMoAP"]


def test_a_method_with_an_aggregate_of_its_own_must_say_what_it_does_with_stale_arrivals():
    from examples.server_momentum import ServerMomentum

    assert "does not say what it does with an asynchronous step's stale arrivals" in method_refusal(ServerMomentum())

    class Said(ServerMomentum):
        stale_inputs = "its momentum runs over the server's steps"

    assert method_refusal(Said()) is None


@pytest.mark.parametrize("flags, says", [
    (["--privacy.mode", "central"], "privacy's accounting prices a round's sample"),
    (["--aggregator.rule", "median"], "aggregator.rule=median with server.mode=fedbuff"),
    (["--clock.deadline", "0.8"], "clock.deadline with server.mode=fedbuff"),
    (["--clock.drop_rate", "0.2", "--clock.min_uploads", "2"], "clock.drop_rate, clock.min_uploads with server.mode"),
    (["--server.concurrency", "5"], "server.concurrency=5 is more than the 4 training clients"),
    (["--server.concurrency", "2", "--server.buffer", "3"], "server.buffer=3 is more than server.concurrency=2"),
    (["--server.buffer", "5"], "server.buffer=5 is more than server.concurrency=4"),  # a buffer larger than the clients
    (["--server.mixing", "0.5"], "server.mixing is FedAsync's"),
    (["--server.evaluate_every", "1.5"], "a whole number of steps"),
])
def test_settings_an_asynchronous_server_cannot_hold_are_one_line(flags, says):
    assert says in refused("--server.mode", "fedbuff", *flags)


def test_fedasync_and_sync_refuse_the_settings_they_do_not_read():
    assert "server.buffer is FedBuff's" in refused("--server.mode", "fedasync", "--server.buffer", "2")
    assert "server.server_lr is FedBuff's" in refused("--server.mode", "fedasync", "--server.server_lr", "0.5")
    says = refused("--server.buffer", "2", "--server.staleness", "hinge")  # server.mode sync
    assert "server.buffer, server.staleness: an asynchronous server's settings" in says
    settle(parse_config([*TINY, "--server.mode", "fedasync", "--server.concurrency", "2", "--clock.speeds", "lognormal"]),
           LaunchEnv.read())


@pytest.mark.parametrize("flags", [["--server.concurrency", "0"], ["--server.staleness", "exponential"],
                                   ["--server.mode", "async"]])
def test_a_concurrency_of_0_or_an_unknown_function_is_refused_when_parsed(flags):
    with pytest.raises(CommandLineError) as caught:
        parse_config([*TINY, "--server.mode", "fedbuff", *flags] if flags[0] != "--server.mode" else [*TINY, *flags])
    assert flags[0].removeprefix("--") in str(caught.value)


def test_the_concurrency_and_buffer_default_to_a_rounds_clients_and_half_of_them():
    assert ServerConfig(mode="fedbuff").concurrency_of(10, 0.35) == 4  # ceil(0.35 x 10)
    assert ServerConfig(mode="fedbuff").buffer_of(5) == 3 and ServerConfig(mode="fedasync").buffer_of(5) == 1
    assert ServerConfig(mode="fedbuff").run_steps(5, 4, 1.0) == 10  # as many updates as 5 rounds of 4
    assert ServerConfig().run_steps(5, 4, 1.0) == 5


def mean_of(rows: dict, weights: torch.Tensor, current: dict) -> dict:
    """The method's aggregate (FedUR's, ServerSide's: the weighted mean) of released rows."""
    result = FedUR().aggregate(ServerRound(1, 1, rows, weights, current, {}))
    assert isinstance(result, Aggregated)
    return result.shared


def test_a_fedbuff_step_applies_the_weighted_mean_of_the_staleness_weighed_changes():
    stage = Server(mode="fedbuff", concurrency=3, buffer=2, server_lr=0.5)
    x, base0, base2 = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0])
    sent0 = stage.leave(0, 0, {"visual": torch.tensor([1.0, 4.0]), "m": torch.tensor([7.0])}, {"visual": base0})
    sent2 = stage.leave(2, 0, {"visual": torch.tensor([3.0, 1.0]), "m": torch.tensor([9.0])}, {"visual": base2})
    assert torch.equal(sent0["visual"], torch.tensor([1.0, 2.0])) and torch.equal(sent0["m"], torch.tensor([7.0]))  # change
    rows = {"visual": torch.stack([sent0["visual"], torch.zeros(2), sent2["visual"]]), "m": torch.tensor([[7.0], [0.0], [9.0]])}
    weights = torch.tensor([1.0, 0.0, 3.0])
    staleness = torch.tensor([3, 0, 0])  # client 0's base is 3 versions behind: s = 1 / sqrt(4) = 0.5
    released, same, _ = stage.release(rows, weights, Exchange({"visual": x}, {}, 2, 4, staleness))
    assert torch.equal(same, weights) and torch.equal(released["m"], rows["m"])  # messages pass
    new = mean_of({"visual": released["visual"]}, weights, {"visual": x})["visual"]
    # x + lr (1 x 0.5 x (1, 2) + 3 x 1 x (2, 0)) / 4 = (1, 2) + 0.5 (6.5, 1) / 4
    assert torch.allclose(new, torch.tensor([1.0 + 0.5 * 6.5 / 4, 2.0 + 0.5 * 1.0 / 4]))
    assert torch.equal(released["visual"][1], torch.zeros(2))  # a row not taken stays as it was


def test_a_fedasync_step_mixes_the_arrival_in_by_its_staleness():
    stage = Server(mode="fedasync", concurrency=2, buffer=1, mixing=0.6, staleness="hinge", hinge_a=1.0, hinge_b=1)
    x, model = torch.tensor([0.0, 10.0]), torch.tensor([4.0, 2.0])
    assert stage.leave(1, 0, {"visual": model}, {"visual": torch.ones(2)})["visual"] is model  # its model as it is
    for tau, s in ((0, 1.0), (1, 1.0), (3, 1 / 3)):  # hinge a 1, b 1: 1 / (tau - 1 + 1) past 1
        rows = {"visual": torch.stack([torch.zeros(2), model])}
        weights = torch.tensor([0.0, 5.0])
        released, _, _ = stage.release(rows, weights, Exchange({"visual": x}, {}, 1, 0, torch.tensor([0, tau])))
        new = weighted_average(released["visual"], weights)
        assert torch.allclose(new, (1 - 0.6 * s) * x + 0.6 * s * model), tau  # x <- (1 - a) x + a x_k


def test_a_synchronous_server_passes_everything_on():
    stage = server.build(ServerConfig(), Building(None, 4, 0, 1, 1, None, 1.0))
    rows, weights = {"visual": torch.ones(2, 3)}, torch.ones(2)
    assert not stage.active and stage.leave(0, 0, rows, {"visual": torch.zeros(3)}) is rows
    assert stage.release(rows, weights, Exchange({"visual": torch.zeros(3)}, {}, 2, 0, torch.zeros(2)))[0] is rows
    assert stage.run_steps(5) == 5 and stage.describe() == []
