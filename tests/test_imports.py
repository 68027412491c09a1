"""What a process imports: ``import zbsolve`` loads each public name on first use, so that the package, an
executor's rank and a pool's worker start without the solver, the charts or torch, and the command line without
OR-Tools, matplotlib or torch until a command runs that uses them; every public name is still there."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import zbsolve

HEAVY = ("ortools", "pandas", "matplotlib", "torch", "pulp", "scipy")
"""Libraries a process imports only when it runs what needs them."""


def _heavy_after(*statements: str) -> dict[str, list[str]]:
    """Each of ``statements``, run in turn in one fresh interpreter -> the ``HEAVY`` libraries it holds after it."""
    probe = "import sys\n" + "".join(
        f"{statement}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules), flush=True)\n"
        for statement in statements)
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return dict(zip(statements, (line.split() for line in ran.stdout.splitlines())))


STARTS = ("import zbsolve", "import zbsolve.configure", "import zbsolve.base.parallel",
          "import zbsolve.execute.launch", "import zbsolve.configure.predict", "import zbsolve.present.forms",
          "from zbsolve.app.cli import app")
"""How the package, a rank (``python -m zbsolve.execute.launch``), a pool's worker, ``predict``, a result shown and
the command line start."""


def test_starting_imports_no_heavy_library():
    """Imported in turn (so each after the ones before it), none of ``STARTS`` brings a heavy library."""
    assert _heavy_after(*STARTS) == {statement: [] for statement in STARTS}


def test_what_runs_the_solver_imports_it():
    """The probe sees a heavy library where one is imported: the optimizer's module brings OR-Tools."""
    assert "ortools" in _heavy_after("import zbsolve.optimize.solve")["import zbsolve.optimize.solve"]


@pytest.mark.parametrize("name", zbsolve.__all__)
def test_every_public_name_is_there_and_listed(name):
    """Each name of ``__all__`` is an attribute, the object its own module defines (``configure`` the package, the
    rest where ``zbsolve`` loads them from)."""
    value = getattr(zbsolve, name)
    home = zbsolve._HOMES.get(name)
    if name == "configure":
        assert value is importlib.import_module("zbsolve.configure")
    elif home is not None:
        assert value is getattr(importlib.import_module(home), name)
    else:
        assert value.__module__ == "zbsolve"


def test_dir_lists_the_public_names_before_their_first_use():
    listed = "import zbsolve\nassert set(zbsolve.__all__) <= set(dir(zbsolve)), dir(zbsolve)"
    assert _heavy_after(listed) == {listed: []}


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        zbsolve.no_such_name  # noqa: B018


def test_configure_is_a_package_and_the_call():
    """``zbsolve.configure`` is the package ``import zbsolve.configure`` gives, callable with ``choose.configure``'s
    signature, its modules reachable as attributes."""
    import zbsolve.configure as package
    from zbsolve.configure.choose import configure

    assert zbsolve.configure is package and callable(package)
    assert inspect.signature(package) == inspect.signature(configure)
    assert package.choose.configure is configure
    with pytest.raises(AttributeError, match="no_such_module"):
        package.no_such_module  # noqa: B018
