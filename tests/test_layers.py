"""The package's shape (docs/architecture.md): each package imports only from those below it, no module imports
itself back through others, and no module is over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zbsolve"
LAYERS = ("base", "core", "schedulers", "problem", "io", "optimize", "planning", "present", "runtime", "app")
"""From the bottom up: a module may import from its own package and those before it."""
MAX_LINES = 400


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """Every zbsolve module ``name`` imports, anywhere in it (inside functions and TYPE_CHECKING blocks too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
    return {module for module in found if module in MODULES and module != name}


def _layer(name: str) -> int:
    """The layer of a module: its package's index in LAYERS; the package's own __init__ and __main__ sit on top."""
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def test_every_package_is_a_layer():
    assert {name.split(".")[1] for name in MODULES if name.count(".") >= 1} - {"__main__"} == set(LAYERS)


@pytest.mark.parametrize("name", list(MODULES))
def test_imports_go_only_downwards(name):
    upward = sorted(other for other in _imports(name) if _layer(other) > _layer(name))
    assert upward == [], f"{name} ({LAYERS[_layer(name)] if _layer(name) < len(LAYERS) else 'top'}) imports {upward}"


def test_no_import_cycle():
    graph = {name: _imports(name) for name in MODULES}
    state: dict[str, int] = {}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[name] = 2

    for name in MODULES:
        if name not in state:
            visit(name, [name])
    assert cycles == []


@pytest.mark.parametrize("name", list(MODULES))
def test_no_module_is_over_the_limit(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_the_walk_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a core module importing the optimizer is upward, and two modules importing each
    other are a cycle."""
    assert _layer("zbsolve.core.simulator") < _layer("zbsolve.optimize.solve")
    graph = {"a": {"b"}, "b": {"a"}}
    assert any(graph[x] & {y} and graph[y] & {x} for x in graph for y in graph)
