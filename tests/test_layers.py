"""The package's shape (docs/architecture.md): each package imports only from those below it, no module imports
itself back through others, and no module is over 400 lines; the entry point ``zbsolve_cli`` sits above them all."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zbsolve"
ENTRY = PACKAGE.parent / "zbsolve_cli" / "__init__.py"
LAYERS = ("base", "core", "schedulers", "costmodel", "problem", "io", "optimize", "planning", "configure", "present",
          "execute", "app")
"""From the bottom up: a module may import from its own package and those before it."""
MAX_LINES = 400


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in [*sorted(PACKAGE.rglob("*.py")), ENTRY]}


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
    """The layer of a module: its package's index in LAYERS; the package's own __init__ sits on top, and the
    entry points (``zbsolve_cli`` and ``python -m zbsolve``) above it."""
    if name in ("zbsolve_cli", "zbsolve.__main__"):
        return len(LAYERS) + 1
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def test_every_package_is_a_layer():
    assert {name.split(".")[1] for name in MODULES if name.count(".") >= 1} - {"__main__"} == set(LAYERS)
    assert "zbsolve_cli" in MODULES


def _upward(name: str, imports: set[str], layer: Callable[[str], int] = _layer) -> list[str]:
    """The modules among ``imports`` (those ``name`` imports) on a layer above ``name``'s, sorted."""
    return sorted(other for other in imports if layer(other) > layer(name))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles a depth-first walk of ``graph`` (each module: the modules it imports) meets, each as the
    modules on it from where it closes back to there, e.g. ``["a", "b", "a"]``; empty exactly when there is none (a
    walk meets a cycle whenever one exists: as an edge back to a module still on its trail)."""
    state: dict[str, int] = {}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph.get(name, ())):
            if state.get(other) == 1:
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


@pytest.mark.parametrize("name", list(MODULES))
def test_imports_go_only_downwards(name):
    upward = _upward(name, _imports(name))
    assert upward == [], f"{name} ({LAYERS[_layer(name)] if _layer(name) < len(LAYERS) else 'top'}) imports {upward}"


def test_no_import_cycle():
    assert _cycles({name: _imports(name) for name in MODULES}) == []


@pytest.mark.parametrize("name", list(MODULES))
def test_no_module_is_over_the_limit(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_cycles_of_synthetic_graphs():
    """``_cycles`` finds the one cycle of a graph with a cycle through three modules and a tail into it, a
    module importing itself and two separate cycles, and none in a diamond or a chain."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"d": {"b"}, "a": set(), "b": {"c"}, "c": {"b", "a"}}) == [["b", "c", "b"]]
    assert _cycles({"a": {"a"}}) == [["a", "a"]]
    assert _cycles({"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"x"}}) == [["a", "b", "a"], ["x", "y", "x"]]
    assert _cycles({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set(), "e": {"a", "c"}}) == []
    assert _cycles({}) == []


def test_upward_of_a_synthetic_layering():
    """``_upward`` names exactly the imports on a higher layer: on layers low < mid < high, mid importing all three
    (and a module of its own layer) imports high upward; low importing mid and high imports both."""
    layer = {"low": 0, "mid": 1, "mid2": 1, "high": 2}.__getitem__
    assert _upward("mid", {"low", "mid2", "high"}, layer) == ["high"]
    assert _upward("low", {"high", "mid"}, layer) == ["high", "mid"]
    assert _upward("high", {"low", "mid", "mid2"}, layer) == []
    # The real layering: core is below optimize, the package's own __init__ on top of everything.
    assert _upward("zbsolve.core.simulator", {"zbsolve.optimize.solve", "zbsolve.base.errors"}) == \
        ["zbsolve.optimize.solve"]
    assert _upward("zbsolve", {"zbsolve.app.cli", "zbsolve.core.simulator"}) == []
    assert _upward("zbsolve.app.cli.common", {"zbsolve_cli"}) == ["zbsolve_cli"]


def test_the_walk_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: in a small package laid out as zbsolve is, a core module importing the
    optimizer (inside a function, relatively) is found as an upward import, and the optimizer module importing it
    back closes a cycle, as the real tests walk the real package."""
    root = tmp_path / "zbsolve"
    for folder, files in {"": {}, "core": {"sim.py": "def run():\n    from ..optimize import solve\n"},
                          "optimize": {"solve.py": "from zbsolve.core.sim import run\nimport zbsolve.base.ok\n"},
                          "base": {"ok.py": "import os\n"}}.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
        for name, text in files.items():
            (root / folder / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {_name(path): path for path in sorted(root.rglob("*.py"))})
    assert _imports("zbsolve.core.sim") == {"zbsolve.optimize.solve"}
    assert _imports("zbsolve.optimize.solve") == {"zbsolve.core.sim", "zbsolve.base.ok"}
    assert _upward("zbsolve.core.sim", _imports("zbsolve.core.sim")) == ["zbsolve.optimize.solve"]
    assert _upward("zbsolve.optimize.solve", _imports("zbsolve.optimize.solve")) == []
    graph = {name: _imports(name) for name in MODULES}
    assert _cycles(graph) == [["zbsolve.core.sim", "zbsolve.optimize.solve", "zbsolve.core.sim"]]
