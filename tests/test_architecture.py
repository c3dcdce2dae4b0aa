"""The house's layering, checked on the source: data flows one way and no module imports one above it.

Every import counts: at module level, inside functions, and under `if TYPE_CHECKING:`. The expected
layers are the documented design (README "Code layout"), not something read back from the code.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rankscope"

#: For each room, the rooms of rankscope it may import (its own always allowed). Bottom first.
ALLOWED: dict[str, set[str]] = {
    "version": set(),
    "files": set(),
    "units": set(),
    "numbers": set(),
    "hardware": set(),
    "thresholds": set(),
    "interrupt": set(),
    "limits": set(),
    "model": {"units"},
    "synth": {"files"},
    "ingest": {"files", "model", "units", "numbers"},
    "analyses": {"model", "units", "numbers", "hardware", "thresholds", "ingest",
                 "results"},    # the typed report's parts, which analyses fill (results/)
    # the typed report, and what reads it: nothing from analyses/ (issue 29)
    "results": {"model", "units", "numbers", "ingest"},
    "findings": {"model", "units", "numbers", "hardware", "thresholds", "ingest", "results"},
    "render": {"version", "files", "model", "units", "numbers", "hardware", "thresholds", "ingest", "results"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    for c_source in PACKAGE.rglob("*.c"):           # C extensions are modules too
        found[".".join(c_source.relative_to(PACKAGE.parent).with_suffix("").parts)] = c_source
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rankscope modules `name` imports (the deepest module each import names)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in names:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("rankscope"):
                targets.add(target)
    return targets


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items() if path.suffix == ".py"}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rankscope"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_only_rooms_below(graph, room):
    wrong = sorted(f"{module} -> {target}" for module, targets in graph.items() if _room(module) == room
                   for target in targets if _room(target) != room and _room(target) not in ALLOWED[room])
    assert wrong == []


def test_every_room_is_known(graph):
    """A new top-level module or package must be placed in the layering above (or be a top layer)."""
    top_layers = {"rankscope", "api", "pipelines", "cli", "engine", "prefork", "capture", "__main__"}
    assert {_room(m) for m in graph} - set(ALLOWED) - top_layers == set()


def test_planted_analyses_import_in_render_is_caught(graph):
    """The rule above on a graph with one render module importing analyses/: reported."""
    planted = dict(graph, **{"rankscope.render.planted": {"rankscope.analyses.rank.breakdown"}})
    wrong = [f"{m} -> {t}" for m, targets in planted.items() if _room(m) == "render"
             for t in targets if _room(t) not in ALLOWED["render"] | {"render"}]
    assert wrong == ["rankscope.render.planted -> rankscope.analyses.rank.breakdown"]
