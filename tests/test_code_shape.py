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
