"""One error type for what a user can fix: every `raise` in fedur either raises a fedur.errors.FedurError (caught once
by the entry point, printed as one line by rank 0) or says on its line why the error is not the user's to fix
(`# internal:` on its line or the one above: a broken invariant of fedur's own code, `# machine:` a failure of the machine the entry point
reports in its own line). A new user error cannot slip into a traceback by being raised as a built-in."""

import ast
import importlib
from pathlib import Path

import pytest

from fedur.errors import FedurError

from .conftest import REPO

PACKAGE = REPO / "fedur"
REASONS = ("# internal:", "# machine:")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def raises(path: Path):
    """(line, the raised expression's source, the statement's source lines) of every raise with an exception."""
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            yield node.lineno, ast.unparse(target), lines[node.lineno - 2:node.end_lineno]  # the line above too


def resolve(module, dotted: str):
    """The object a raised name refers to in the module (None: a local variable, a re-raise)."""
    found = module
    for part in dotted.split("."):
        found = getattr(found, part, None)
        if found is None:
            return getattr(__import__("builtins"), dotted, None)
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "configs" not in p.parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_raise_is_a_user_error_or_says_why_it_is_not(path):
    module = importlib.import_module(module_name(path))
    wrong = []
    for line, name, statement in raises(path):
        cls = resolve(module, name)
        if cls is None or not isinstance(cls, type):  # `raise err`: an error caught and raised again
            continue
        if issubclass(cls, FedurError):
            continue
        if not any(reason in text for text in statement for reason in REASONS):
            wrong.append(f"{path.relative_to(REPO)}:{line}: raise {name}")
    assert not wrong, ("raise a fedur.errors.FedurError for what a user can fix, or say on the line why it is not "
                       "theirs (# internal: / # machine:):\n" + "\n".join(wrong))


def test_the_walk_sees_the_raises_it_checks():
    """The walk itself: it finds fedur's raises, resolves their classes, and sees both kinds."""
    seen = {name for path in SOURCES for _, name, _ in raises(path)}
    assert {"RunDirError", "ConfigError", "PluginError"} <= seen
    module = importlib.import_module("fedur.train.run_dir")
    assert issubclass(resolve(module, "RunDirError"), FedurError) and resolve(module, "KeyError") is KeyError


def test_every_error_class_of_fedur_is_a_fedur_error_or_the_machines():
    """Every exception class fedur defines is a FedurError, but for the machine's (a broken collective) and the
    test-only injected fault."""
    machine = {"fedur.federated.collectives.CollectiveError", "fedur.federated.collectives.DeviceMemoryError",
               "fedur.train.faults.InjectedFault"}
    found = []
    for path in SOURCES:
        module = importlib.import_module(module_name(path))
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.append(value)
    assert len(found) >= 14
    for cls in found:
        assert issubclass(cls, FedurError) or f"{cls.__module__}.{cls.__qualname__}" in machine, cls
