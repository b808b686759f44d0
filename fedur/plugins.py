"""fedur's own plugins, found from their classes: the methods, pseudo-labellers and datasets the package defines.

Nothing here is a list. A class is one of fedur's own `kind` when it subclasses the kind's base, is defined in a
fedur module, and is neither private (a leading underscore) nor abstract; importing `fedur.methods`,
`fedur.labels` and `fedur.data` defines them all. The command line's names and help, the legacy keys' hints,
the tables' rows, the demo presets, the tests that run every method and the benchmarks all read them from here,
so a method added to fedur is its file and its import line.
"""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
from pathlib import Path

KINDS = ("method", "labeller", "dataset")
PACKAGES = {"method": "fedur.methods", "labeller": "fedur.labels", "dataset": "fedur.data"}
BASES = {"method": ("fedur.methods.base", "Method"), "labeller": ("fedur.labels.base", "Labeller"),
         "dataset": ("fedur.data.datasets", "Dataset")}


def base_class(kind: str) -> type:
    """The class every plugin of `kind` ("method", "labeller", "dataset") subclasses."""
    module, name = BASES[kind]
    return getattr(importlib.import_module(module), name)


def builtin(kind: str) -> list[type]:
    """fedur's own concrete classes of plugin `kind`, ordered by module and name (the same in every process, however
    the modules were imported)."""
    importlib.import_module(PACKAGES[kind])
    base = base_class(kind)
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        if (cls.__module__.startswith("fedur.") and not cls.__name__.startswith(("_", "LazyInstance"))
                and not inspect.isabstract(cls) and cls not in found):
            found.append(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def names(kind: str) -> list[str]:
    """The class names `--<kind>` takes for fedur's own plugins, sorted."""
    return sorted({cls.__name__ for cls in builtin(kind)})


def by_key(kind: str) -> dict[str, type]:
    """{key: class} of fedur's own plugins of `kind` (a method's `key`: "fedur", "promptfl", ...)."""
    return {cls.key: cls for cls in builtin(kind) if getattr(cls, "key", None)}


def by_path(kind: str, class_path: str | None) -> type | None:
    """The class a plugin setting names (`kind`: method, labeller or dataset; `class_path` as the settings record
    it); one that cannot be imported (a settings record of someone else's plugin): the kind's base class, whose
    description every plugin of the kind starts from. None: no plugin (the method's own labeller)."""
    if class_path is None:
        return None
    parts = class_path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes (nested classes)
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            break
        if isinstance(found, type):
            return found
        break
    return base_class(kind)


def configs_dir() -> Path:
    """fedur's configs/: shipped inside the package as fedur.configs (a checkout's configs/ when installed
    editable); a checkout that is only on the path has them beside the package."""
    try:
        return Path(str(importlib.resources.files("fedur.configs")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[1] / "configs"


def demo_preset(method: type) -> Path | None:
    """configs/presets/demo/<key>.yaml: the method's settings on the demo (the learning rate a sweep chose), or None
    where it runs the demo at fedur's own settings."""
    path = configs_dir() / "presets" / "demo" / f"{method.key}.yaml"
    return path if path.is_file() else None


def demo_flags(method: type) -> list[str]:
    """The flags that run `method` on the demo (after `--config configs/smoke.yaml`) with its demo preset."""
    preset = demo_preset(method)
    return ["--method", method.__name__] + (["--config", str(preset)] if preset else [])


def piece_names(pieces: dict) -> list[str]:
    """The pieces' names for a table, the shared in bold; the weights of one module (`generator.*`) as one entry."""
    out, seen = [], {}
    for name, piece in pieces.items():
        group = name.split(".")[0] + ".*" if "." in name else name
        seen.setdefault(group, []).append(piece)
    for group, members in seen.items():
        label = f"{group} ({len(members)})" if len(members) > 1 else group
        out.append(f"**{label}**" if all(p.shared for p in members) else label)
    return out


def methods_page() -> str:
    """docs/methods.md: every one of fedur's methods, read from its class (its name, table label, pieces with the
    shared ones in bold, default labeller, presets and first docstring line); `python -m fedur.plugins methods` writes
    it, and a test checks that the page in the repository is this."""
    rows = []
    for cls in builtin("method"):
        method = cls()
        pieces = ", ".join(piece_names(method.pieces())) or "none"
        labeller = method.default_labeller() if method.trains else None
        demo = demo_preset(cls)
        presets = ", ".join(f"`configs/{p}`" for p in ([f"presets/{cls.preset}.yaml"] if cls.preset else [])
                            + ([f"presets/demo/{cls.key}.yaml"] if demo else [])) or "-"
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        rows.append(f"| `{cls.__name__}` | {cls.key} | {cls.label} | {pieces} | "
                    f"{type(labeller).__name__ if labeller else '-'} | {presets} | {summary} |")
    return (
        "# The methods\n\n"
        f"fedur has {len(rows)} methods, each one class in `fedur/methods/` (`--method CLASS`; `--method.help CLASS` lists its "
        "settings). This page is generated from the classes (`python -m fedur.plugins methods > docs/methods.md`; "
        "tests/test_plugin_description.py checks it): what each holds (its pieces, the shared ones in bold: the server "
        "averages them, the others stay with the client), the labeller it trains with unless `--labeller` names one, its "
        "published settings and its demo preset. Where each differs from its original code, and why: "
        "[reference-parity.md](reference-parity.md).\n\n"
        "| `--method` | key | in tables | pieces | labeller | presets | what it is |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["methods"]:
        raise SystemExit("usage: python -m fedur.plugins methods > docs/methods.md")  # internal: a maintainer's command
    print(methods_page(), end="")
