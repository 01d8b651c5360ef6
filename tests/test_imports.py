"""The project-internal import graph has no cycles.

Every module of the project's packages is found with ``pkgutil.walk_packages``; its imports (at module top
and inside functions alike, but not those under ``if TYPE_CHECKING:``) are read with ``ast``, without running
the module. An edge ``a -> b`` means module ``a`` imports project module ``b`` (``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``). A cycle is a strongly connected component of
more than one module, or a module importing itself.

``CHECKED`` lists the packages whose modules may not sit on a cycle (the graph always spans every package,
so a cycle that leaves a checked package and comes back is found too). ``ALLOWED_CYCLES`` holds known
cycles (each a frozenset of module names) that are tolerated for now; keep it empty.
"""

from __future__ import annotations

import ast
import pkgutil
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("routers", "data_synthesis", "train", "eval")
CHECKED = [("routers",), ("data_synthesis",), ("train",), ("eval",)]
ALLOWED_CYCLES: set[frozenset[str]] = set()


@lru_cache(maxsize=None)
def project_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """name -> (source file, is a package) for every module of ``packages``."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in packages:
        out[pkg] = (REPO / pkg / "__init__.py", True)
        errors: list[str] = []
        for info in pkgutil.walk_packages([str(REPO / pkg)], prefix=f"{pkg}.", onerror=errors.append):
            base = Path(info.module_finder.path) / info.name.rsplit(".", 1)[-1]
            out[info.name] = (base / "__init__.py", True) if info.ispkg else (base.with_suffix(".py"), False)
        assert not errors, f"packages that could not be imported to walk them: {errors}"
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _owner(name: str, modules) -> str | None:
    """The longest prefix of ``name`` that is a project module (``a.b.C`` -> ``a.b``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in its source)."""
    modules = project_modules(packages)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if is_pkg else name.rpartition(".")[0]
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:  # relative: from . / .. import
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None:
                    edges.add(owner)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with a cycle (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return f"{sorted(component)}: " + ", ".join(edges)


def test_cycle_finder_on_a_toy_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["d"]]


def test_every_module_is_found():
    modules = project_modules()
    assert {"eval.progressive.run", "eval.bench.common", "eval.plots", "routers.base"} <= set(modules)
    assert all(path.is_file() for path, _ in modules.values())


@pytest.mark.parametrize("packages", CHECKED, ids=lambda p: "+".join(p))
def test_no_import_cycles(packages):
    graph = import_graph()
    bad = [c for c in cycles(graph)
           if any(m == p or m.startswith(p + ".") for m in c for p in packages) and c not in ALLOWED_CYCLES]
    assert not bad, "import cycles:\n" + "\n".join(_describe(c, graph) for c in bad)


# The floors follow the pipeline: shared infrastructure (routers) < synthesis < training < evaluation. A module
# may import its own floor or a lower one; ``routers.cli`` dispatches to every job by "module:function" strings,
# which are not imports.
FLOORS = {pkg: i for i, pkg in enumerate(PACKAGES)}


def test_floors_run_in_pipeline_order():
    graph = import_graph()
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if FLOORS[b.split(".")[0]] > FLOORS[a.split(".")[0]])
    assert not upward, "imports that run up the floors (routers < data_synthesis < train < eval):\n" + "\n".join(upward)
