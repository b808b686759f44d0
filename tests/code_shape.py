"""Checks on the shape of the code, read with `ast` (nothing is imported), for tests to assert on."""

from __future__ import annotations

import ast
from pathlib import Path


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef, keyword_only: bool = False) -> int:
    """Named parameters of `function`: positional-only and positional-or-keyword ones (and keyword-only
    ones when `keyword_only`), without a leading `self` or `cls`; `*args` and `**kwargs` do not count."""
    args = function.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + (len(args.kwonlyargs) if keyword_only else 0)


def long_signatures(package_dir: Path, limit: int = 8, keyword_only: bool = False) -> list[str]:
    """"<file>:<line> <function> (<n> parameters)" for every function and method in the .py files under
    `package_dir` (recursively) with more than `limit` parameters as `parameter_count` counts them:
    keyword-only parameters (named knobs after `*`) are left out unless `keyword_only`."""
    found = []
    for path in sorted(Path(package_dir).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = parameter_count(node, keyword_only)
                if count > limit:
                    where = path.relative_to(Path(package_dir).parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({count} parameters)")
    return found


def module_imports(package_dir: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for every .py file under `package_dir`, statically: every
    import statement counts, also those under `if TYPE_CHECKING:` or inside functions."""
    package_dir = Path(package_dir)
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def import_cycles(package_dir: Path) -> list[list[str]]:
    """The package's import circles: every strongly connected group of two or more modules, sorted."""
    graph = module_imports(package_dir)
    order, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(cycles)
