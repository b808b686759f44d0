"""The command line: the parser (the settings groups, and the three plugins by class), the typed `Config` it
gives, and its errors as one line that says what to write instead.

Settings come from YAML files (`--config`, repeatable, later wins) and `--group.key` overrides; `--help` documents
every key and its range, `--print_config` prints the resolved settings.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from argparse import ArgumentError
from dataclasses import fields

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, lazy_instance, set_parsing_settings

from fedur import plugins
from fedur.config import GROUPS, PLUGINS, RENAMED, Config
from fedur.errors import CommandLineError, ConfigError
from fedur.launch_env import LaunchEnv

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
# owns; each of fedur's plugin classes (and each kind's base) names its own (`old_keys`), gathered by `legacy_keys`.
# "{names}" in a replacement is filled with fedur's own class names of its kind.
LEGACY_KEYS = {
    "method.name": "--method CLASS ({names})",
    "run.fault": "the FEDUR_FAULT environment variable (fedur/train/faults.py)",
}


def legacy_keys() -> dict[str, str]:
    """Old key (a prefix when it ends in "." or "_") -> what replaces it: LEGACY_KEYS and the `old_keys` of fedur's
    plugin classes and their bases, each "{names}" filled with the class names `--<kind>` takes."""
    keys = {old: new.format(names=", ".join(plugins.names("method"))) for old, new in LEGACY_KEYS.items()}
    for kind in PLUGINS:
        names = ", ".join(plugins.names(kind))
        for cls in (plugins.base_class(kind), *plugins.builtin(kind)):
            keys.update({old: new.replace("{names}", names) for old, new in cls.__dict__.get("old_keys", {}).items()})
    return keys


class Parser(ArgumentParser):
    """jsonargparse's parser, with a plugin class's whole first docstring paragraph as its settings' heading
    (`--method.help CLASS`; jsonargparse takes the docstring's first line, which cuts a wrapped sentence)."""

    def add_class_arguments(self, class_type, nested_key=None, *args, **kwargs):
        bases = tuple(plugins.base_class(kind) for kind in PLUGINS)
        if kwargs.get("help") is None and isinstance(class_type, type) and issubclass(class_type, bases):
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


def build_parser(docs: bool = True, method: type | None = None) -> Parser:
    """The parser; `docs`: each setting's help from the docstring under its field (read from the source files, a
    third of a second: what --help shows; parsing needs none); `method`: the default method class (FedUR)."""
    from fedur.data.datasets import ImageFolder
    from fedur.methods import FedUR

    set_parsing_settings(docstring_parse_attribute_docstrings=docs)
    parser = Parser(
        prog="fedur",
        description="FedUR: federated unsupervised visual recognition with CLIP, every client on a Lightning "
        "Fabric rank. Launch with `fabric run [--devices N] fedur/main.py ...` or `python fedur/main.py ...`.",
        default_config_files=[],
        exit_on_error=False,  # errors become one line (CommandLineError), printed once by the entry point
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML settings file (repeatable; later wins).")
    parser.add_argument(
        "--check_data", action="store_true",
        help="Check the dataset's layout, print its image counts per split, class and domain, and exit without training.",
    )
    defaults = {"method": lazy_instance(method or FedUR), "labeller": None, "dataset": lazy_instance(ImageFolder)}
    for kind in PLUGINS:
        base = plugins.base_class(kind)
        parser.add_argument(f"--{kind}", type=base | None if defaults[kind] is None else base, default=defaults[kind],
                            help=PLUGIN_HELP[kind].format(names=", ".join(plugins.names(kind))))
    for name, group in GROUPS.items():
        parser.add_class_arguments(group, name, help=group.__doc__)
    return parser


def parse_config(argv: list[str] | None = None, parser: ArgumentParser | None = None) -> Config:
    """The typed settings of a command line (`argv`; None: sys.argv); `parser`: one from `build_parser()` to reuse
    across many calls. A CommandLineError or ConfigError says what is wrong in one line."""
    return parse_args(argv, parser)[0]


def parse_args(argv: list[str] | None = None, parser: ArgumentParser | None = None) -> tuple[Config, Namespace]:
    """`parse_config`'s Config and the whole namespace (with --check_data)."""
    argv = moved_keys(sys.argv[1:] if argv is None else argv)
    given = argv
    docs = any("help" in arg or "print_config" in arg for arg in given)
    parser = parser or build_parser(docs=docs)
    namespace = parse_namespace(parser, argv)
    # jsonargparse carries the arguments of the default method over to the method a command names (`--method SCAFFOLD`
    # after FedUR's defaults: FedUR's `weighting`), so a method's own defaults would be lost: parsed again with the
    # named method as the default, every argument not given is its own.
    chosen = plugins.by_path("method", namespace["method"]["class_path"])
    if chosen is not plugins.by_path("method", parser.get_defaults()["method"]["class_path"]):
        namespace = parse_namespace(parser_with_default(docs, chosen), argv)
    keys = (*PLUGINS, *GROUPS)
    resolved = Namespace({name: namespace[name] for name in keys})
    objects = instantiate(parser, resolved)
    given = {}
    for name in PLUGINS:  # one name per class however it was spelled (FedUR, fedur.methods.fedur.FedUR, ...)
        value = _plain(resolved[name])
        if objects[name] is not None:
            cls = type(objects[name])
            value["class_path"] = f"{cls.__module__}.{cls.__qualname__}"
        given[name] = value
    for name in GROUPS:  # plain numbers: jsonargparse's range types would change NumPy's float32 promotion
        group = objects[name]
        for field in fields(group):
            setattr(group, field.name, _plain_number(getattr(group, field.name)))
    return Config(**{name: objects[name] for name in keys}, plugins=given), namespace


def moved_keys(argv: list[str]) -> list[str]:
    """`argv` with every key that moved to a group of its own (fedur.config.RENAMED) under its new name, on the command
    line (`--federation.drop_rate 0.2`) and in YAML files (`--config run/config.yaml` of a run from before: read, its
    keys moved, handed on as YAML text); each old key said once, by rank 0."""
    out, said = [], []
    for i, arg in enumerate(argv):
        key, sep, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key in RENAMED:
            out.append(f"--{RENAMED[key]}{sep}{value}")
            said.append(key)
        elif i > 0 and argv[i - 1] == "--config" or key == "config" and sep:
            out.append(("--config=" if sep else "") + moved_in_file(value if sep else arg, said))
        else:
            out.append(arg)
    for key in dict.fromkeys(said):
        if LaunchEnv.read().is_rank_zero and key not in SAID:
            print(f"fedur: note: {key} is {RENAMED[key]} now (the old key still works)", file=sys.stderr)
            SAID.add(key)
    return out


SAID: set[str] = set()  # the old keys said in this process


def moved_in_file(path: str, said: list[str]) -> str:
    """A `--config` value as given, or, for a YAML file holding keys that moved, its settings with them moved as YAML
    text (`said`: the old keys found are added)."""
    import yaml

    try:
        with open(path) as f:
            settings = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return path  # jsonargparse reads it (a YAML string, or an error in its words)
    old = settings.get("federation") if isinstance(settings, dict) else None
    found = [k for k in (old or {}) if f"federation.{k}" in RENAMED] if isinstance(old, dict) else []
    if not found:
        return path
    for key in found:
        group, new = RENAMED[f"federation.{key}"].split(".")
        settings.setdefault(group, {})[new] = old.pop(key)
        said.append(f"federation.{key}")
    return yaml.safe_dump(settings, sort_keys=False)


@functools.lru_cache(maxsize=8)
def parser_with_default(docs: bool, method: type) -> Parser:
    """build_parser's parser with `method` the default method (built once per class in a process)."""
    return build_parser(docs=docs, method=method)


def parse_namespace(parser: ArgumentParser, argv: list[str] | None) -> Namespace:
    try:
        return parser.parse_args(argv)
    except ArgumentError as err:
        raise CommandLineError(explain(str(err), sys.argv[1:] if argv is None else argv)) from err


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

    bases = {kind: plugins.base_class(kind) for kind in PLUGINS}
    try:
        return parser.instantiate(resolved, instantiators=[(construct, base, True) for base in bases.values()])
    except (ValueError, TypeError) as err:
        if not refused:
            raise
        cls, cause = refused[0]
        key = next(k for k, base in bases.items() if issubclass(cls, base))
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
    """A parse error as one line, with what to do: the known classes for an unknown plugin name, the class to name
    first for a plugin setting given without one, and what replaces a key of fedur before plugins (on the command
    line or in a YAML file)."""
    message = " ".join(message.split())
    key = refused_key(message)
    for old, new in legacy_keys().items():
        if key is not None and (key == old.rstrip("._") or (old.endswith((".", "_")) and key.startswith(old))):
            return f"{message} (`{key}` is gone: use {new}; see docs/extending.md)"
    unknown = MESSAGES["plugin name"].search(message)
    if unknown:
        key, name = unknown.groups()
        names = plugins.names(key)
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
