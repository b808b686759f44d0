"""The shape of fedur's code, read with `ast`: short signatures (a concern's settings travel as one typed
object, a plugin's on its class) and no import circles (the round loop knows methods; methods, labellers
and datasets need not know the loop)."""

from pathlib import Path

import fedur
import fedur.data
from tests.code_shape import import_cycles, long_signatures, module_imports

FEDUR = Path(fedur.__file__).parent


def test_no_function_in_fedur_takes_more_than_eight_parameters():
    assert long_signatures(FEDUR) == []
    # keyword-only knobs (after `*`) are allowed beyond 8 only in pure math, one named setting each
    allowed = {"fedur/methods/fedotp_math.py"}
    assert [s for s in long_signatures(FEDUR, keyword_only=True) if s.split(":")[0] not in allowed] == []
    assert long_signatures(Path(fedur.data.__file__).parent, keyword_only=True) == []


def test_fedur_has_no_import_circles():
    assert import_cycles(FEDUR) == []


def test_plugins_do_not_reach_into_the_round_loop():
    graph = module_imports(FEDUR)
    lower = [m for m in graph if m.startswith(("fedur.methods", "fedur.labels", "fedur.data", "fedur.model", "fedur.federated"))]
    assert lower and all(not any(t.startswith("fedur.train") for t in graph[m]) for m in lower), {
        m: sorted(t for t in graph[m] if t.startswith("fedur.train")) for m in lower}


def test_long_signatures_counts_named_parameters_without_self(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "def short(a, b, *args, **kwargs): ...\n"
        "def long(a, b, c, /, d, *, e, f): ...\n"
        "class C:\n"
        "    def method(self, a, b, c): ...\n"
    )
    assert long_signatures(package, limit=2) == ["pkg/m.py:2 long (4 parameters)", "pkg/m.py:4 method (3 parameters)"]
    assert long_signatures(package, limit=4, keyword_only=True) == ["pkg/m.py:2 long (6 parameters)"]
    assert long_signatures(package, limit=4) == []


def test_import_cycles_finds_a_circle_through_type_checking_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg import a\n")
    assert import_cycles(package) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert module_imports(package)["pkg.d"] == {"pkg", "pkg.a"}


# The import layers, lowest first: a module imports from its own layer or below, never above (fedur/data and
# fedur/model sit side by side and import neither the other). At the bottom what every layer may use (the error type,
# value ranges, metrics and figures, the plugin lookup, which imports the plugin packages by name only when asked);
# client-level privacy above the methods (it reads what a method shares); the channel's stages above privacy (the one
# door for what clients send: clock, adversary, noise, reducer); above the library the typed settings
# (which hold the plugins) and the launch environment; then the training layer; above them all the commands and tools
# (fedur/app: the `fedur` command's parser, settling and run, fedur-report, fedur-tables, fedur-attack, ..., and the
# demo CLIP's training tool), and fedur/main.py, the `fedur` command as a script for `fabric run`.
LAYERS = (("fedur.errors", "fedur.ranges", "fedur.network", "fedur.metrics", "fedur.plots", "fedur.plugins"),
          ("fedur.data", "fedur.model"), ("fedur.labels",), ("fedur.federated",), ("fedur.methods",), ("fedur.privacy",),
          ("fedur.channel",), ("fedur.config", "fedur.launch_env"), ("fedur.train",), ("fedur.app", "fedur.main"))
SIDE_BY_SIDE = 1  # the layer whose packages import neither the other


def layer_of(module: str) -> tuple[int, str] | None:
    for level, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                return level, name
    return None


def test_the_library_imports_downwards_only():
    graph = module_imports(FEDUR)
    wrong = []
    for module, targets in graph.items():
        mine = layer_of(module)
        if mine is None:
            continue
        for target in targets:
            theirs = layer_of(target) if target.startswith("fedur.") else (-1, "")
            if theirs is None or theirs[0] > mine[0] or (theirs[0] == mine[0] == SIDE_BY_SIDE and theirs[1] != mine[1]):
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong
    assert all(layer_of(m) is not None for m in graph if m != "fedur"), "every module of fedur is in a layer"


def test_architecture_md_names_every_module_of_fedur():
    """docs/architecture.md's file map lists every module under fedur/ and none that is not there."""
    text = (FEDUR.parent / "docs" / "architecture.md").read_text()
    block = text.split("```\nfedur/\n", 1)[1].split("```", 1)[0]
    named, folders = set(), []  # folders: (indent, name) of the enclosing folders
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        head = line.strip().split("  ")[0]  # the names, before the description
        if not (head.endswith("/") or ".py" in head):
            continue  # a description's continuation
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if head.endswith("/"):
            folders.append((indent, head.rstrip("/")))
            continue
        prefix = "/".join(name for _, name in folders)
        named |= {f"{prefix}/{name.strip()}" if prefix else name.strip() for name in head.split(",") if name.strip().endswith(".py")}
    actual = {str(p.relative_to(FEDUR)) for p in FEDUR.rglob("*.py") if p.name != "__init__.py" and "configs" not in p.parts}
    assert named == actual, {"not in the map": sorted(actual - named), "in the map, not in fedur/": sorted(named - actual)}
