"""The frozen-feature cache in whole runs (data.feature_cache): a cold and a warm run give the same bits, and so do 1
rank and 2 ranks each building its own cache; a damaged cache file is built again with one line and changes nothing;
with the cache off, the results are those of the cache on within float rounding (benchmarks/output_parity.py's
tolerance mode measures it). FedOTP reads the tower's tokens, PromptFL its features in fused groups of two clients.
(Every shared run of tests/shared_runs.py runs with the cache on too: resumed exactly, label-blind, 2 ranks = 1.)"""

import shutil
import sys

import pytest

from .conftest import assert_same_results, run_ok
from .shared_runs import SHARED, run_all
from .test_benchmarks import benchmark

pytestmark = pytest.mark.slow  # whole fedur runs

CASES = {"otp": ["--method", "FedOTP"], "fl": ["--method", "PromptFL", "--run.clients_per_step", "2"]}
BOUNDS = {"accuracy": 0.0, "loss": 1e-5, "other": 1e-5, "tensors": 1e-5, "counts": 0}  # float rounding only


def cached(root, name: str, folder: str, *flags: str) -> list[str]:
    return [*CASES[name], "--data.cache_dir", str(root / folder), *flags]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """root/<name>-cold (a new cache folder), <name>-warm (the same folder again), <name>-off (the cache off) on 1
    rank; <name>-2 on 2 ranks with a new cache folder of its own."""
    root = tmp_path_factory.mktemp("feature-cache")
    one = {}
    for name in CASES:
        one[f"{name}-cold"] = cached(root, name, f"cache-{name}")
        one[f"{name}-warm"] = cached(root, name, f"cache-{name}")
        one[f"{name}-off"] = cached(root, name, f"cache-{name}-off", "--data.feature_cache", "false")
    run_all(one, root)
    run_all({f"{name}-2": cached(root, name, f"cache-{name}-2") for name in CASES}, root, ranks=2)
    return root


def feature_files(folder):
    return {p.name: p for p in folder.glob("*-features-*.npy")} | {p.name: p for p in folder.glob("*-tokens-*.npy")}


@pytest.mark.parametrize("name", list(CASES))
def test_a_warm_cache_and_two_ranks_give_the_cold_runs_bits(runs, name):
    cold = runs / f"{name}-cold"
    for other in ("warm", "2"):
        assert_same_results(cold, runs / f"{name}-{other}", num_clients=4)
    one, two = feature_files(runs / f"cache-{name}"), feature_files(runs / f"cache-{name}-2")
    kinds = {"features", "tokens"} if name == "otp" else {"features"}
    assert {n.split("-")[2] for n in one} == kinds and len(one) == 2 * len(kinds)  # train and test of each kind
    assert one.keys() == two.keys()  # the same keys: nothing of the placement in them
    assert all(one[n].read_bytes() == two[n].read_bytes() for n in one)  # built by rank 0 of 2 as by a rank alone


@pytest.mark.parametrize("name", list(CASES))
def test_the_cache_changes_results_by_float_rounding_only(runs, name):
    parity = benchmark("output_parity")
    deltas = parity.measured(runs / f"{name}-off", runs / f"{name}-cold")
    assert deltas.within(parity.Deltas(**BOUNDS)), deltas
    assert not feature_files(runs / f"cache-{name}-off")  # off: nothing cached


def test_a_damaged_cache_file_is_said_in_one_line_built_again_and_changes_nothing(runs, tmp_path):
    """A byte of the train features flipped: the next run says so once, computes the file again and gives the same
    bits as the run that first built it."""
    folder = tmp_path / "cache"
    shutil.copytree(runs / "cache-otp", folder)
    train = next(folder.glob("*-train-features-*.npy"))
    data = bytearray(train.read_bytes())
    data[len(data) // 2] ^= 0x40
    train.write_bytes(bytes(data))
    done = run_ok([sys.executable, "-m", "fedur.main", *SHARED, *cached(tmp_path, "otp", "cache"),
                   "--run.output_dir", str(tmp_path / "run")])
    said = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert len(said) == 1 and str(train) in said[0] and "checksum" in said[0], done.stderr[-2000:]
    assert_same_results(runs / "otp-cold", tmp_path / "run", num_clients=4)
    assert train.read_bytes() == next((runs / "cache-otp").glob("*-train-features-*.npy")).read_bytes()

