"""fedur's entry point.

    fabric run --devices 8 fedur/main.py --config configs/cub.yaml [--group.key value ...]
    python fedur/main.py --config configs/smoke.yaml            (Fabric launches the ranks itself)

Settings come from YAML files (`--config`, repeatable, later wins) and `--group.key` overrides;
`--help` documents every key and its range, `--print_config` prints the resolved settings.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: keep fedur/'s folders from shadowing top-level modules
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import errno
import inspect
import re
import threading
import time
from argparse import ArgumentError
from dataclasses import fields
from pathlib import Path

import torch
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, lazy_instance, set_parsing_settings

import fedur.data  # noqa: F401  (every built-in dataset class, so that --dataset finds it by name)
from fedur.config import GROUPS, PLUGINS, Config, new_client_count, result_settings
from fedur.data.datasets import Dataset, DataUnavailableError, ImageFolder
from fedur.data.partition import PartitionError
from fedur.data.split_file import count_clients
from fedur.federated.collectives import CollectiveError, Collectives, first_line
from fedur.labels import Labeller
from fedur.launch_env import LaunchEnv, deterministic_environment, make_fabric, set_determinism, set_threads, stop_with_launcher
from fedur.methods import FedUR, Method
from fedur.model.clip import ModelUnavailableError, check_model
from fedur.train import faults, ownership
from fedur.train import run_dir as run_dirs
from fedur.train.checkpoint import CheckpointError
from fedur.train.preemption import StopRequest
from fedur.train.setup import SetupError


class ConfigError(ValueError):
    """Settings do not fit together; the message names the keys."""


ERROR_GRACE_SECONDS = 5.0

USER_ERRORS = (
    ArgumentError, ConfigError, DataUnavailableError, ModelUnavailableError, PartitionError, CheckpointError,
    run_dirs.RunDirError, SetupError,
)

PLUGIN_HELP = {
    "method": "The federated method: one of fedur's ({names}; default FedUR), or the import path of a class of "
              "your own (a subclass of fedur.methods.Method). Its settings: --method.<arg>; list them with "
              "--method.help CLASS.",
    "labeller": "The pseudo-labeller: one of fedur's ({names}), or the import path of a class of your own (a "
                "subclass of fedur.labels.Labeller); null (default): the method's own (FedUR: CoDPL, FedCoPL: CoPL, "
                "the baselines: FPL). Its settings: --labeller.<arg>; list them with --labeller.help CLASS.",
    "dataset": "Where the clients' images come from: one of fedur's ({names}; default ImageFolder: "
               "dataset.root/train/<class>/*, dataset.root/test/<class>/*), or the import path of a class of your own "
               "(a subclass of fedur.data.datasets.Dataset). Its settings: --dataset.<arg>; list them with "
               "--dataset.help CLASS.",
}

# Keys of fedur before methods, labellers and datasets were classes, and what replaces them: the ones no plugin class
# owns; each of fedur's plugin classes names its own (`old_keys`), gathered by `legacy_keys`.
LEGACY_KEYS = {
    "method.name": "--method CLASS (FedUR, FedCoPL, PromptFL, PromptProx, PFedPrompt, FedOTP, ZeroShot, GDAU)",
    "run.fault": "the FEDUR_FAULT environment variable (fedur/train/faults.py)",
}
PLUGIN_BASES = {"method": Method, "labeller": Labeller, "dataset": Dataset}


def legacy_keys() -> dict[str, str]:
    """Old key (a prefix when it ends in "." or "_") -> what replaces it: LEGACY_KEYS and the `old_keys` of
    fedur's own plugin classes."""
    keys = dict(LEGACY_KEYS)
    for key in PLUGINS:
        for cls in builtin_classes(key):
            keys.update(cls.__dict__.get("old_keys", {}))
    return keys


class Parser(ArgumentParser):
    """jsonargparse's parser, with a plugin class's whole first docstring paragraph as its settings' heading
    (`--method.help CLASS`; jsonargparse takes the docstring's first line, which cuts a wrapped sentence)."""

    def add_class_arguments(self, class_type, nested_key=None, *args, **kwargs):
        if kwargs.get("help") is None and isinstance(class_type, type) and issubclass(class_type, tuple(PLUGIN_BASES.values())):
            kwargs["help"] = class_description(class_type)
        return super().add_class_arguments(class_type, nested_key, *args, **kwargs)


def class_description(cls: type) -> str | None:
    """The first paragraph of the docstring that describes `cls` as one line, looked up as jsonargparse does (the
    nearest class in the MRO with a docstring, stopping at one that defines its own constructor); None: none."""
    for owner in cls.__mro__:
        doc = owner.__dict__.get("__doc__")
        if doc and doc.strip():
            return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
        if "__init__" in owner.__dict__:
            return None  # jsonargparse then reads the constructor's docstring
    return None


def build_parser() -> Parser:
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = Parser(
        prog="fedur",
        description="FedUR: federated unsupervised visual recognition with CLIP, every client on a Lightning "
        "Fabric rank. Launch with `fabric run [--devices N] fedur/main.py ...` or `python fedur/main.py ...`.",
        default_config_files=[],
        exit_on_error=False,  # main() prints parse errors as one line, once
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML settings file (repeatable; later wins).")
    parser.add_argument(
        "--check_data", action="store_true",
        help="Check the dataset's layout, print its image counts per split, class and domain, and exit without training.",
    )
    plugins = {"method": (Method, lazy_instance(FedUR)), "labeller": (Labeller | None, None),
               "dataset": (Dataset, lazy_instance(ImageFolder))}
    for key, (kind, default) in plugins.items():
        names = ", ".join(plugin_names(key))
        parser.add_argument(f"--{key}", type=kind, default=default, help=PLUGIN_HELP[key].format(names=names))
    for name, group in GROUPS.items():
        parser.add_class_arguments(group, name, help=group.__doc__)
    return parser


def parse_config(argv: list[str] | None = None, parser: ArgumentParser | None = None) -> tuple[Config, str]:
    """The typed settings and their resolved YAML (saved to the run directory); `parser`: one from
    `build_parser()` to reuse across many calls."""
    cfg, config_yaml, _ = parse_args(argv, parser)
    return cfg, config_yaml


def parse_args(argv: list[str] | None = None, parser: ArgumentParser | None = None) -> tuple[Config, str, Namespace]:
    parser = parser or build_parser()
    try:
        namespace = parser.parse_args(argv)
    except ArgumentError as err:
        raise ArgumentError(None, explain(str(err), sys.argv[1:] if argv is None else argv)) from err
    keys = (*PLUGINS, *GROUPS)
    resolved = Namespace({name: namespace[name] for name in keys})
    config_yaml = parser.dump(resolved, skip_unset=False)  # a null (model.pretrained: null) must stay null when read back
    objects = instantiate(parser, resolved)
    settings = {name: _plain(resolved[name]) for name in keys}
    for name in PLUGINS:  # one name per class however it was spelled (FedUR, fedur.methods.fedur.FedUR, ...)
        if objects[name] is not None:
            cls = type(objects[name])
            settings[name]["class_path"] = f"{cls.__module__}.{cls.__qualname__}"
    for name in GROUPS:  # plain numbers: jsonargparse's range types would change NumPy's float32 promotion
        group = objects[name]
        for field in fields(group):
            setattr(group, field.name, _plain_number(getattr(group, field.name)))
    return Config(**{name: objects[name] for name in keys}, settings=settings), config_yaml, namespace


def instantiate(parser: ArgumentParser, resolved: Namespace) -> Namespace:
    """The settings' objects; a plugin's constructor that refuses its arguments (ValueError, TypeError) is a
    ConfigError naming the plugin: "--labeller mypkg.Strict: <its message>" (jsonargparse would wrap it in
    its own error, a union's alternatives and a traceback)."""
    refused = []

    def construct(cls, *args, **kwargs):
        try:
            return cls(*args, **kwargs)
        except (ValueError, TypeError) as err:
            refused.append((cls, err))
            raise

    try:
        return parser.instantiate(resolved, instantiators=[(construct, base, True) for base in PLUGIN_BASES.values()])
    except (ValueError, TypeError) as err:
        if not refused:
            raise
        cls, cause = refused[0]
        key = next(k for k, base in PLUGIN_BASES.items() if issubclass(cls, base))
        message = " ".join(str(cause).split())  # one line, as every error of fedur's
        raise ConfigError(f"--{key} {cls.__module__}.{cls.__qualname__}: {message}") from err


def _plain_number(value):
    """An int or float of a range type (PositiveInt, Fraction, ...) as the plain int or float."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and type(value) is not int:
        return int(value)
    if isinstance(value, float) and type(value) is not float:
        return float(value)
    return value


def _plain(value):
    """A namespace as plain dicts and lists (what config.yaml and summary.json hold)."""
    if isinstance(value, Namespace):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# The parse errors fedur explains, as jsonargparse words them. jsonargparse (4.53) raises ArgumentError(None, text):
# nothing in it, nor in the exceptions it chains (TypeError, ValueError, NSKeyError, all text only), names the refused
# key, the plugin or the class path as data, so fedur reads the text. Each form is pinned by
# tests/test_plugin_description.py::test_the_jsonargparse_messages_fedur_reads: an upgrade that rewords one fails there.
MESSAGES = {
    "group option": re.compile(r"Group '(\w+)' does not accept option '(\w+)'"),  # a YAML group's unknown key
    "plugin option": re.compile(r'Parser key "(\w+)":.*?Option \'([\w.]+)\' is not accepted', re.DOTALL),  # a class's
    "option": re.compile(r"Option '([\w.]+)' is not accepted"),  # a YAML key outside every group
    "unrecognized": re.compile(r"unrecognized arguments: --([\w.]+)"),  # a command-line key
    "plugin name": re.compile(r'Parser key "(method|labeller|dataset)":.*?Expected a dot import path string: (\S+)',
                              re.DOTALL),  # a class name that is no class
    "plugin abstract": re.compile(r'Parser key "(method|labeller|dataset)":.*is abstract', re.DOTALL),  # no class named
}


def refused_key(message: str) -> str | None:
    """The dotted key a parse error refuses, e.g. "method.name" for jsonargparse's ``Parser key "method": ...
    Option 'name' is not accepted``, "labels.tau_neg" or "data.name"; None when it names none."""
    for form in ("group option", "plugin option", "option", "unrecognized"):
        found = MESSAGES[form].search(message)
        if found:
            return ".".join(found.groups())
    return None


def explain(message: str, argv: list[str]) -> str:
    """A parse error, with what to do: the known classes for an unknown plugin name, the class to name first
    for a plugin setting given without one, and what replaces a key of fedur before plugins (on the command
    line or in a YAML file)."""
    key = refused_key(message)
    for old, new in legacy_keys().items():
        if key is not None and (key == old.rstrip("._") or (old.endswith((".", "_")) and key.startswith(old))):
            return f"{message} (`{key}` is gone: use {new}; see docs/extending.md)"
    unknown = MESSAGES["plugin name"].search(message)
    if unknown:
        key, name = unknown.groups()
        names = plugin_names(key)
        close = [n for n in names if n.lower() == name.lower()]
        hint = f" (did you mean --{key} {close[0]}? names are class names)" if close else ""
        return (f"--{key} {name}: no such {key}{hint}; fedur's own: {', '.join(names)}, or the import path of a class "
                "of your own (mypackage.module.ClassName)")
    abstract = MESSAGES["plugin abstract"].search(message)
    if abstract:
        key = abstract.group(1)
        return f"{message} (name the {key} before its settings: --{key} CLASS --{key}.<arg> ...)"
    if key is not None and key.split(".")[0] in PLUGINS:  # a setting the plugin's class does not have
        plugin = key.split(".")[0]
        return (f"{message} (--{key} is not a setting of this {plugin}: name the class that has it first, "
                f"--{plugin} CLASS --{key} ...; --{plugin}.help CLASS lists a class's settings)")
    return message


def plugin_names(key: str) -> list[str]:
    """The class names `--<key>` takes for fedur's own plugins."""
    return sorted({cls.__name__ for cls in builtin_classes(key)[1:] if not inspect.isabstract(cls)})


def builtin_classes(key: str) -> list[type]:
    """fedur's own classes of plugin `key`: its base class, then every subclass in fedur (but private ones)."""
    base = PLUGIN_BASES[key]
    found, todo = [base], list(base.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        if cls.__module__.startswith("fedur.") and not cls.__name__.startswith(("_", "LazyInstance")) and cls not in found:
            found.append(cls)
    return found


def settle_num_clients(cfg: Config) -> int | None:
    """With federation.partition clients or file the clients come from the dataset's folders or the split file:
    federation.num_clients becomes their number (returned; None for fedur's own splits)."""
    fed = cfg.federation
    if fed.partition_file is not None and fed.partition != "file":
        raise ConfigError(f"federation.partition_file is read only with federation.partition=file (not "
                          f"{fed.partition}); set both, or drop the file")
    own = cfg.dataset.client_names()
    if fed.partition == "file":
        if fed.partition_file is None:
            raise ConfigError("federation.partition=file needs federation.partition_file: a JSON or CSV split "
                              "(e.g. an earlier run's partition.json; docs/own-data.md)")
        num_clients = count_clients(fed.partition_file)
    elif fed.partition == "clients":
        if own is None:
            raise ConfigError(f"federation.partition=clients takes each client's own folder, and dataset "
                              f"{type(cfg.dataset).__name__} has none: use dataset ClientFolders, or a split of fedur's")
        num_clients = len(own)
    elif own is not None:
        raise ConfigError(f"dataset {type(cfg.dataset).__name__} brings its own {len(own)} clients: set "
                          f"federation.partition=clients (or file), not {fed.partition}")
    else:
        return None
    fed.num_clients = cfg.settings["federation"]["num_clients"] = num_clients
    return num_clients


def with_num_clients(config_yaml: str, num_clients: int) -> str:
    """The resolved YAML with federation.num_clients as the folders or the split file set it."""
    settings = yaml.safe_load(config_yaml)
    settings["federation"]["num_clients"] = num_clients
    return yaml.safe_dump(settings, sort_keys=False, allow_unicode=True)


def validate(cfg: Config, env: LaunchEnv) -> None:
    """What the annotations cannot check: settings that must fit together, and whether the model and data
    can be had; before anything is loaded or launched."""
    method = cfg.method
    settle_num_clients(cfg)
    try:
        method.pair(cfg.labeller)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    try:
        new_client_count(cfg.evaluation.new_clients, cfg.federation.num_clients)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    held_out = cfg.evaluation.base_to_novel or cfg.evaluation.held_out_domain is not None
    if held_out and cfg.federation.partition == "file":
        raise ConfigError("evaluation.base_to_novel and evaluation.held_out_domain choose the clients' images themselves; "
                          "they do not combine with federation.partition=file (a split given image by image)")
    if cfg.run.clients_per_step > 1 and cfg.optim.optimizer_state == "shared":
        raise ConfigError("run.clients_per_step > 1 trains clients at once, so no momentum can pass from one to the "
                          "next (optim.optimizer_state=shared); use optim.optimizer_state=client or reset")
    world, clients, group = env.expected_world_size(cfg.fabric), cfg.federation.num_clients, cfg.run.clients_per_step
    if cfg.optim.optimizer_state == "shared" and world > 1:
        raise ConfigError("optim.optimizer_state=shared passes momentum from client to client and needs one rank")
    groups = -(-clients // group)
    if groups < min(world, clients) and env.is_rank_zero:  # groups are placed whole: some ranks get no client
        print(f"fedur: warning: run.clients_per_step={group} makes {groups} group(s) of {clients} clients for {world} "
              f"ranks: {world - groups} rank(s) will host no client; a smaller run.clients_per_step spreads them",
              file=sys.stderr)
    if env.precision_error():
        raise ConfigError(env.precision_error())
    if env.precision_warning(cfg.fabric) and env.is_rank_zero:
        print(f"fedur: warning: {env.precision_warning(cfg.fabric)}", file=sys.stderr)
    try:
        faults.injected()
    except ValueError as err:
        raise ConfigError(str(err)) from err
    check_model(cfg.model.name, cfg.model.pretrained, cfg.model.config_file, cfg.model.cache_dir)
    cfg.dataset.check()


def run(cfg: Config, config_yaml: str, env: LaunchEnv | None = None):
    from fedur.train.fit import fit

    env = env or LaunchEnv.read()
    num_clients = settle_num_clients(cfg)
    if num_clients is not None:
        config_yaml = with_num_clients(config_yaml, num_clients)
    cfg.fabric.precision = env.resolved_precision(cfg.fabric)  # recorded resolved: auto is not the same on CPU and GPU
    cfg.settings["fabric"]["precision"] = cfg.fabric.precision
    run = cfg.run
    deterministic_environment(run.deterministic)
    fabric = make_fabric(cfg.fabric, env, run.wait_timeout)
    set_threads(fabric, run.threads)
    set_determinism(run.deterministic, fabric.device)
    root = run_dirs.target(run.output_dir, run.resume)
    if root is None and run.resume is not False:
        raise run_dirs.RunDirError("run.resume needs run.output_dir: the directory of the run to continue (a requeued job "
                                   "names the same one every time, e.g. runs/<job name>-<job id>)")
    if root is None:  # a new run directory, named by rank 0's clock
        root = fabric.broadcast(os.path.join("runs", time.strftime("%Y%m%d-%H%M%S")), src=0)
    run.output_dir = root  # what an error message names
    claim = on_rank_zero(fabric, lambda: ownership.claim(root, create=run.resume in (False, "auto")),
                         ownership.Claim(Path(root)))
    if fabric.world_size > 1:  # every rank looks for rank 0's nonce
        claim.nonce = fabric.broadcast(claim.nonce, src=0)
    try:
        if fabric.world_size > 1 and claim.nonce:  # every node must see the directory rank 0 holds
            ownership.check_shared(Collectives(fabric), root, claim.nonce, fabric.node_rank)
        settings = result_settings(cfg.settings)  # the file settings' digests read once, for the resume and the markers
        run_dir, resume = run_dirs.resolve(root, run.resume, run.force_resume, cfg.federation.num_clients, settings)
        rounds = cfg.method.rounds(cfg.federation.rounds)
        if resume is not None and resume.round_idx + 1 >= rounds and run_dir.path("summary.json").is_file():
            if fabric.is_global_zero:
                print(f"fedur: {run_dir.root} is finished: all {rounds} round(s) are committed and its summary.json is written; "
                      f"nothing to resume (a larger --federation.rounds trains on from round {resume.round_idx + 2})")
            Collectives(fabric).end_of_run()
            return None
        claim.keep()
        if run.resume == "auto" and resume is None and run_dir.root.is_dir():  # a job that died before its first commit
            removed = on_rank_zero(fabric, run_dir.clear_without_commit, [])
            if removed and fabric.is_global_zero:
                print(f"fedur: {run_dir.root} holds no committed round; starting over (removed {', '.join(removed)})")
        requeue_on = tuple(run.requeue_on) if fabric.is_global_zero else ()
        with StopRequest(requeue_on=requeue_on, requeue_deadline=run.requeue_deadline) as stop:  # stop after a commit
            result = fit(fabric, cfg, run_dir, config_yaml, resume, stop, settings)
        Collectives(fabric).end_of_run()
        return result
    finally:
        claim.release()


def on_rank_zero(fabric, action, others):
    """`action()` on rank 0, its result (`others` on the other ranks) or its error raised on every rank: an error
    met on rank 0 alone is then printed once, and no rank waits for the others in a collective."""
    result, error = others, None
    if fabric.is_global_zero:
        try:
            result = action()
        except (run_dirs.RunDirError, OSError) as err:
            error = str(err)
    if fabric.world_size > 1:
        error = fabric.broadcast(error, src=0)
    if error is not None:
        raise run_dirs.RunDirError(error)
    return result


def check_data(cfg: Config) -> None:
    """`--check_data`: load the dataset as configured and print its counts; nothing is trained or written."""
    from fedur.data.inspect import dataset_report
    from fedur.train.setup import load_data

    print(dataset_report(load_data(cfg)))  # every dataset checks its layout first


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines reach log files as they happen
    env = LaunchEnv.read()
    stop_with_launcher()
    threading.excepthook = quiet_write_errors
    cfg = None
    try:
        cfg, config_yaml, namespace = parse_args(argv)
        if namespace.check_data:
            return check_data(cfg)
        validate(cfg, env)
        run(cfg, config_yaml, env)
    except USER_ERRORS as err:
        if env.is_rank_zero:  # every rank meets the same error: print it once
            message = " ".join(str(err).split()) if isinstance(err, ArgumentError) else str(err)  # jsonargparse's: one line
            print(f"fedur: error: {message}", file=sys.stderr, flush=True)
        else:  # the launcher stops every rank when the first one exits: let rank 0 print first
            time.sleep(ERROR_GRACE_SECONDS)
        sys.exit(2)
    except CollectiveError as err:
        fail(str(err))  # the process group is broken: do not wait in its teardown
    except OSError as err:  # a file the run writes: a full disk, a quota, a read-only or vanished folder
        if err.errno is None:  # not the system's (an image library's, a re-raised worker's): its traceback says more
            raise
        fail(write_error(err, None if cfg is None else cfg.run.output_dir))
    except torch.OutOfMemoryError as err:
        fail(f"rank {os.environ.get('RANK', '0')} ran out of device memory ({first_line(err)}); a smaller optim.batch_size, "
             "optim.eval_batch_size or run.clients_per_step, or fewer clients per rank, need less")
    except RuntimeError as err:
        if "deterministic" not in str(err) or "use_deterministic_algorithms" not in str(err):
            raise
        fail(f"{first_line(err)} (run.deterministic true); --run.deterministic false runs without it, and results then "
             "vary in the last bits")


def fail(message: str) -> None:
    """A failure of this rank, in one line; exits at once (peers learn of it through the heartbeat)."""
    print(f"fedur: error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def write_error(err: OSError, output_dir: str | None) -> str:
    """A file the run could not write, what is intact, and how to go on."""
    space = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    writing = space or err.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
    what = f"{'could not write' if writing else 'failed on'} {err.filename or 'a file'} ({err.strerror or err})"
    committed = checkpoint_latest(output_dir)
    if committed is None:
        return f"{what}; no round is committed yet: fix that, then start again"
    fix = "free space (or move the run directory to where there is some)" if space else "fix that"
    return (f"{what}; the last committed round ({committed.round_idx + 1}) in {committed.folder.parent} is intact: "
            f"{fix} and continue it with --run.resume true")


def checkpoint_latest(output_dir: str | None):
    from fedur.train import checkpoint

    try:
        return None if output_dir is None else checkpoint.latest(Path(output_dir))
    except (OSError, CheckpointError):
        return None


def quiet_write_errors(args) -> None:
    """A thread that fails to write (TensorBoard's event writer on a full disk) says nothing: the main thread meets
    the same error at its next write and reports it in one line (`write_error`)."""
    if issubclass(args.exc_type, OSError):
        return
    threading.__excepthook__(args)


if __name__ == "__main__":
    main()
