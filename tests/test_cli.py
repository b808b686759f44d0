import re
import time

import numpy as np
import pytest

from fedur.app.cli import parse_config
from fedur.app.settle import settle
from fedur.config import GROUPS
from fedur.errors import CommandLineError, ConfigError
from fedur.launch_env import LaunchEnv


def test_help_documents_every_option(run_main):
    out = run_main("--help").stdout
    for name, group in GROUPS.items():
        for field in group.__dataclass_fields__:
            assert f"--{name}.{field}" in out
    assert "Learnable text context vectors" in out  # field docstrings become help text
    assert "(type: PositiveInt, default: 10)" in out and "(type: Fraction, default: 1.0)" in out  # ranges show
    assert "--fabric.devices" in out and "\n  --devices" not in out  # namespaced: no clash with `fabric run`


def test_print_config_and_overrides(run_main):
    out = run_main("--config", "configs/tiny.yaml", "--federation.rounds", "7", "--print_config").stdout
    assert "rounds: 7" in out and "name: fedur-tiny" in out


def test_overrides_and_later_configs_win(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("federation:\n  beta: 0.05\n")
    cfg = parse_config(["--config", "configs/cifar10.yaml", "--config", str(extra), "--optim.lr", "0.2"])
    assert cfg.federation.beta == 0.05 and cfg.optim.lr == 0.2 and cfg.model.name == "ViT-B-32"


@pytest.mark.parametrize(
    "override, message",
    [
        (["--federation.beta", "0"], 'Parser key "federation.beta": Not of type PositiveFloat: 0 does not conform to restriction v>0'),
        (["--federation.join_rate", "1.5"],
         "federation.join_rate\": Not of type Fraction: 1.5 does not conform to restriction v>0 and v<=1"),
        (["--model.n_ctx", "-1"], "model.n_ctx\": Not of type NonNegativeInt: -1"),
        (["--model.visual_tokens", "-2"], "model.visual_tokens\": Not of type NonNegativeInt: -2"),
        (["--labeller", "CoDPL", "--labeller.tau_neg", "1.2"], "Not of type OpenUnitInterval: 1.2"),
        (["--method", "PromptProx", "--method.mu", "-1"], "Not of type NonNegativeFloat: -1"),
        (["--method", "PromptFL", "--method.share", "visual"], "share"),  # PromptFL has no share setting
        (["--labeller", "CPL", "--labeller.negatives", "mass"], "negatives"),  # nor CPL negatives
        (["--method", "fedur"], "--method fedur"),  # a class name, with the choices in the message
        (["--optim.batch_size", "0"], "optim.batch_size\": Not of type PositiveInt: 0"),
        (["--data.train_fraction", "0"], "data.train_fraction\": Not of type Fraction: 0"),
    ],
)
def test_settings_out_of_range_fail_at_parse_time(override, message):
    """The ranges live in config.py's annotations: jsonargparse refuses such values and --help shows them."""
    with pytest.raises(CommandLineError) as error:
        parse_config(["--config", "configs/tiny.yaml", *override])
    assert message in " ".join(str(error.value).split())


@pytest.mark.parametrize(
    "override, message",
    [
        (["--model.name", "ViT-Huge-Nope"], "Unknown open_clip model"),
        (["--dataset", "ImageFolder", "--dataset.root", "/nonexistent/data"], "/nonexistent/data/train is missing"),
        (["--optim.optimizer_state", "shared", "--fabric.accelerator", "cpu", "--fabric.devices", "2"], "needs one rank"),
        (["--method", "ZeroShot", "--labeller", "FPL"], "ZeroShot trains nothing, so it uses no pseudo-labeller"),
        (["--method", "GDAU", "--labeller", "CoDPL"], "GDAU trains nothing"),
    ],
)
def test_settings_that_do_not_fit_together_fail_before_compute(override, message):
    cfg = parse_config(["--config", "configs/tiny.yaml", *override])
    with pytest.raises(Exception, match=re.escape(message)):
        settle(cfg, LaunchEnv.read({}))


def test_bad_input_exits_2_and_touches_nothing(tmp_path, run_main):
    out_dir = tmp_path / "run"
    result = run_main("--config", "configs/tiny.yaml", "--federation.beta", "-1", "--run.output_dir", str(out_dir))
    assert result.returncode == 2
    assert result.stderr == ('fedur: error: Parser key "federation.beta": Not of type PositiveFloat: -1 does not conform to '
                             'restriction v>0\n')
    assert not out_dir.exists()


def test_offline_real_config_stops_at_once_with_what_to_download(run_main):
    start = time.perf_counter()
    result = run_main("--config", "configs/cifar10.yaml")
    assert result.returncode == 2
    assert "model.pretrained=" in result.stderr and "huggingface.co" in result.stderr
    assert time.perf_counter() - start < 60


def test_existing_run_directory_is_never_overwritten(tmp_path, run_main):
    (tmp_path / "keep.txt").write_text("earlier results")
    result = run_main("--config", "configs/tiny.yaml", "--run.output_dir", str(tmp_path))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_precision_auto_and_fabric_run_flags():
    from fedur.config import FabricConfig

    plain = LaunchEnv.read({})
    assert plain.resolved_precision(FabricConfig(accelerator="cpu")) == "32-true"
    # auto on a GPU: bf16-mixed where the GPU has bf16 units (tests/test_device_guards.py)
    assert plain.resolved_precision(FabricConfig(precision="bf16-mixed", accelerator="cpu")) == "bf16-mixed"
    cli = LaunchEnv.read({"LT_CLI_USED": "1", "LT_PRECISION": "bf16", "LT_DEVICES": "3", "WORLD_SIZE": "3", "RANK": "2"})
    assert cli.resolved_precision(FabricConfig(accelerator="cpu")) == "bf16-mixed"  # `fabric run --precision` wins
    assert cli.cli and not cli.is_rank_zero and cli.expected_world_size(FabricConfig()) == 3
    assert LaunchEnv.read({"LT_DEVICES": "4", "LT_NUM_NODES": "2"}).expected_world_size(FabricConfig(accelerator="cpu")) == 8
    assert not LaunchEnv.read({"LOCAL_RANK": "1"}).is_rank_zero  # Fabric's own launcher's second process
    cfg = parse_config(["--config", "configs/tiny.yaml"])
    with pytest.raises(ConfigError, match="GradScaler"):
        settle(cfg, LaunchEnv.read({"LT_PRECISION": "16-mixed"}))


def test_under_torchrun_fabric_takes_torchruns_processes():
    """`torchrun --nproc-per-node 2 fedur/main.py ...` needs no --fabric.devices: auto is torchrun's processes per
    node, num_nodes 1 its nodes; settings that name another count stop before any compute, in one line. `fabric run`
    (which also sets TORCHELASTIC_RUN_ID) and plain launches keep the settings."""
    from fedur.config import FabricConfig

    def torchrun(world: int, local: int) -> LaunchEnv:
        return LaunchEnv.read({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(local),
                               "RANK": "0"})

    assert torchrun(2, 2).layout(FabricConfig(accelerator="cpu")) == (2, 1)
    assert torchrun(8, 4).layout(FabricConfig()) == (4, 2)  # two nodes of 4
    assert torchrun(8, 4).layout(FabricConfig(devices=4, num_nodes=2)) == (4, 2)
    assert torchrun(2, 2).layout(FabricConfig(devices="0,1")) == ("0,1", 1)
    with pytest.raises(ConfigError, match=re.escape("torchrun started 2 processes (2 per node), but fabric.devices=3 x "
                                                    "fabric.num_nodes=1 makes 3; leave fabric.devices auto")):
        torchrun(2, 2).layout(FabricConfig(devices=3))
    cfg = parse_config(["--config", "configs/tiny.yaml", "--fabric.devices", "4"])
    with pytest.raises(ConfigError, match="torchrun started 2 processes"):
        settle(cfg, torchrun(2, 2))
    fabric_run = LaunchEnv.read({"TORCHELASTIC_RUN_ID": "none", "LT_CLI_USED": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert not fabric_run.elastic and fabric_run.layout(FabricConfig(devices=2)) == (2, 1)
    assert LaunchEnv.read({}).layout(FabricConfig()) == ("auto", 1)


def snapshot(root) -> dict:
    """Every file under root with its size, mtime and contents."""
    from pathlib import Path

    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A one-round smoke run with its committed checkpoint."""
    from fedur.app.run import run

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    cfg = parse_config(["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--run.output_dir", str(run_dir)])
    run(cfg)
    return run_dir


def image_folder(root, classes: dict[str, int], corrupt: bool = False):
    import numpy as np
    from PIL import Image

    for split in ("train", "test"):
        for name, count in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(np.full((8, 8, 3), 40 * i % 255, dtype=np.uint8)).save(folder / f"{i}.png")
    if corrupt:
        (root / "train" / next(iter(classes)) / "broken.png").write_bytes(b"\x89PNG not really")
    return root


def bad_input_case(case: str, tmp_path, finished_run):
    """(arguments, expected message) of one bad input; files it needs are made under tmp_path/inputs."""
    import shutil

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    fresh = ["--run.output_dir", str(tmp_path / "new-run")]
    if case in ("corrupt checkpoint", "changed settings", "metrics cut mid-line"):
        copy = inputs / "run"
        shutil.copytree(finished_run, copy)
        resume = ["--run.resume", "true", "--run.output_dir", str(copy)]
        if case == "changed settings":
            return [*resume, "--model.n_ctx", "8"], "model.n_ctx: 4 (checkpoint) -> 8 (now)"
        if case == "metrics cut mid-line":  # the checkpoint is newer than the metrics: refused after the data loaded
            metrics = copy / "metrics.jsonl"
            metrics.write_bytes(metrics.read_bytes()[:40])
            return [*resume, "--federation.rounds", "2"], "holds only 0 complete rounds"
        victim = copy / "checkpoints" / "round_00001" / "client_002.pt"
        victim.write_bytes(victim.read_bytes()[:100])
        return resume, f"checkpoint file {victim} is corrupt"
    if case in ("truncated weights", "weights of another architecture"):
        import torch

        from fedur.model.clip import load_clip

        weights = inputs / "tiny.pt"
        torch.save(load_clip("fedur-tiny", None).model.state_dict(), weights)
        if case == "truncated weights":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a download cut short
            return [*fresh, "--model.pretrained", str(weights)], f"model.pretrained={weights} cannot be read ("
        return [*fresh, "--model.name", "ViT-B-32", "--model.pretrained", str(weights)], (
            f"model.pretrained={weights} does not fit model.name=ViT-B-32: "
        )
    if case == "client folder grew":  # a client's own folder gained an image since the run: its split differs
        from fedur.app.run import run

        from .own_data import write_client_folders, write_images

        names = write_client_folders(inputs / "data", clients=2, classes=2, train_per_client=12, test_per_client=4)
        own = ["--dataset", "ClientFolders", "--dataset.root", str(inputs / "data"), "--data.classnames_file", str(names),
               "--federation.partition", "clients", "--federation.min_train_per_client", "1", "--run.progress", "false"]
        run(parse_config(["--config", "configs/tiny.yaml", *own, "--federation.rounds", "1",
                          "--run.output_dir", str(inputs / "run")]))
        write_images(inputs / "data" / "clients" / "site_01" / "train", np.zeros((1, 32, 32, 3), dtype=np.uint8), start=900)
        return [*own, "--federation.rounds", "2", "--run.resume", "true", "--run.output_dir", str(inputs / "run")], (
            "client 1: its train_indices differ from the checkpoint's")
    if case == "no such domain":
        return [*fresh, "--evaluation.held_out_domain", "photo"], "synthetic has no domains"
    if case == "bad model json":
        (inputs / "broken.json").write_text("{not json")
        return [*fresh, "--model.name", "broken", "--model.config_file", str(inputs / "broken.json")], "is not valid JSON"
    if case in ("empty class", "names mismatch", "corrupt image"):
        root = image_folder(inputs / "data", {"cat": 0 if case == "empty class" else 12, "dog": 12}, corrupt=case == "corrupt image")
        data = [*fresh, "--dataset", "ImageFolder", "--dataset.root", str(root), "--federation.num_clients", "2",
                "--federation.min_train_per_client", "1"]
        if case == "names mismatch":
            (inputs / "names.txt").write_text("cat\n")
            return [*data, "--data.classnames_file", str(inputs / "names.txt")], "has 1 names but there are 2 classes (cat, dog)"
        if case == "empty class":
            return data, f"{root}/train/cat has no images"
        return data, "broken.png"
    return {
        "beta": ([*fresh, "--federation.beta", "0"], "federation.beta\": Not of type PositiveFloat: 0"),
        "join rate": ([*fresh, "--federation.join_rate", "1.01"], "federation.join_rate\": Not of type Fraction: 1.01"),
        "more clients than samples": (
            [*fresh, "--federation.num_clients", "400", "--federation.min_train_per_client", "1"],
            "300 train samples cannot give 400 clients",
        ),
        "n_ctx": ([*fresh, "--model.n_ctx", "-1"], "model.n_ctx\": Not of type NonNegativeInt: -1"),
        "prompt tokens": ([*fresh, "--model.visual_tokens", "-1"], "model.visual_tokens\": Not of type NonNegativeInt: -1"),
        "unknown dataset": ([*fresh, "--dataset", "ImageNetNope"], "--dataset ImageNetNope"),
        "old settings": ([*fresh, "--method.name", "fedotp"], "`method.name` is gone: use --method CLASS"),
        "unknown model": ([*fresh, "--model.name", "ViT-Huge-Nope"], "Unknown open_clip model"),
        "missing checkpoint": (["--run.resume", str(tmp_path / "no-such-run")], "does not exist"),
        "resume without a directory": (["--run.resume", "auto"], "run.resume needs run.output_dir"),
        "run directory taken": (["--run.output_dir", str(finished_run)], "already exists and is not empty (it holds a checkpoint"),
        "shared momentum in groups": ([*fresh, "--optim.optimizer_state", "shared", "--run.clients_per_step", "2"],
                                      "run.clients_per_step > 1 trains clients at once"),
    }[case]


@pytest.mark.parametrize(
    "case",
    [
        "beta", "join rate", "more clients than samples", "n_ctx", "prompt tokens",
        "unknown dataset", "unknown model", "bad model json", "truncated weights", "weights of another architecture",
        "missing checkpoint", "corrupt checkpoint", "resume without a directory",
        "changed settings", "empty class", "names mismatch", "corrupt image", "run directory taken", "shared momentum in groups",
        "old settings", "metrics cut mid-line", "client folder grew", "no such domain",
    ],
)
@pytest.mark.slow
def test_bad_input_stops_with_a_clear_error_and_changes_nothing_on_disk(case, tmp_path, finished_run, run_main):
    """One line, no traceback, and every file as it was (a refused resume's run directory too, its fedur.lock
    included: the refused process is not named as its owner)."""
    args, message = bad_input_case(case, tmp_path, finished_run)
    before, finished_before = snapshot(tmp_path), snapshot(finished_run)
    result = run_main("--config", "configs/tiny.yaml", *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert result.stderr.count("fedur: error: ") == 1 and "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before and snapshot(finished_run) == finished_before


def test_check_data_prints_counts_and_trains_nothing(tmp_path, run_main):
    root = image_folder(tmp_path / "data", {"cat": 3, "dog": 2})
    result = run_main("--config", "configs/tiny.yaml", "--dataset", "ImageFolder", "--dataset.root", str(root), "--check_data")
    assert result.returncode == 0, result.stderr
    assert "imagefolder: 2 classes, 5 train / 5 test images" in result.stdout
    assert [line.split() for line in result.stdout.splitlines() if line.strip().startswith(("0", "1"))] == [
        ["0", "cat", "3", "3"], ["1", "dog", "2", "2"],
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    missing = run_main("--config", "configs/tiny.yaml", "--dataset", "CUB", "--dataset.root", str(tmp_path / "nope"), "--check_data")
    assert missing.returncode == 2 and str(tmp_path / "nope") in missing.stderr


@pytest.mark.parametrize("flags", [[], ["--method", "PFedPrompt", "--method.cache_shots", "null", "--run.threads", "null"]])
def test_the_config_yaml_a_run_writes_reads_back_as_the_same_settings(tmp_path, flags):
    """config.yaml is the run's settings: a null in it (tiny's model.pretrained) must not read back as the default."""
    cfg = parse_config(["--config", "configs/tiny.yaml", *flags])
    (tmp_path / "config.yaml").write_text(cfg.yaml())
    again = parse_config(["--config", str(tmp_path / "config.yaml")])
    assert again.settings == cfg.settings and again.model.pretrained is None


def test_a_run_records_what_computed_it(finished_run):
    """summary.json's environment: the versions, the device and the CPU's vector instructions, and which of
    the variables that cap them were set (another capability may change the last bits of a float)."""
    import json

    import torch

    from fedur.launch_env import software_environment

    environment = json.loads((finished_run / "summary.json").read_text())["environment"]
    assert environment["torch"] == torch.__version__ and environment["device"] == "cpu" and environment["cuda"] is None
    assert environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    capped = software_environment(torch.device("cpu"), {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"})
    assert capped["cpu_isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    # on a GPU: the CUDA torch was built with and the device's name (a stub names it here)
    gpu = software_environment(torch.device("cuda", 3), {}, device_name=lambda d: f"GPU {d.index}")
    assert (gpu["device"], gpu["cuda"]) == ("GPU 3", torch.version.cuda)


def test_a_method_named_on_the_command_line_keeps_its_own_defaults():
    """jsonargparse carries the default method's arguments over to the one a command names; fedur parses again so
    that what is not given is the named method's own (SCAFFOLD's uniform weighting, Algorithm 1's mean), while what is
    given, before or after the name, stays."""
    from fedur.app.cli import parse_config

    smoke = ["--config", "configs/smoke.yaml"]
    assert parse_config([*smoke, "--method", "SCAFFOLD"]).method.weighting == "uniform"
    assert parse_config([*smoke, "--method.weighting", "data", "--method", "SCAFFOLD"]).method.weighting == "data"
    assert parse_config([*smoke, "--method", "SCAFFOLD", "--method.weighting", "selected"]).method.weighting == "selected"
    assert parse_config([*smoke, "--config", "configs/presets/demo/scaffold.yaml"]).method.weighting == "uniform"
    assert parse_config(smoke).method.weighting == "selected"  # FedUR's
