"""Each command line option declared once: a setup's options come from the table of ``app.cli.options`` (bound to
their ``Setup`` fields), the options several commands share from ``app.cli.common``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import typer.main

from zbsolve.app.cli import app
from zbsolve.app.cli.options import OPTIONS, _parameters, flag
from zbsolve.configure.predict import Configuration
from zbsolve.costmodel.setup import Setup

CLI = Path(__file__).resolve().parent.parent / "zbsolve" / "app" / "cli"
HOMONYMS = {("run", "--seq-len"), ("profile", "--seq-len"), ("profile", "--microbatch-size"),
            ("export", "--microbatch-size"),
            ("solve", "--partition"), ("solve", "--recompute"), ("plan", "--recompute")}
"""Options named as a setup's field that are another thing: the runtime's small GPT's sequence and microbatch, an
export's microbatch size, and the split and recomputation a solve or a plan takes (layer counts; per-stage, auto)."""
SHARED = ("--devices", "--microbatches", "--time-limit", "--jobs", "--executor", "--target", "--output", "--chart",
          "--json", "--wide", "--quiet", "--profile")
"""Options several commands take, declared in ``common.py`` alone."""


def _helps(name: str) -> set[str]:
    """The helps the table gives field ``name``'s options, under either model's default."""
    return {str(p.default.help) for model in (Configuration, Setup) if name in model.model_fields
            for p in _parameters(model, name)}


def test_every_option_of_a_setup_field_comes_from_the_table():
    group = typer.main.get_command(app)
    flags = {flag(name): name for name in OPTIONS} | {flag(f"no_{name}"): name for name in OPTIONS}
    checked = 0
    for command_name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            for opt in (*param.opts, *getattr(param, "secondary_opts", ())):
                if opt in flags and (command_name, opt) not in HOMONYMS:
                    assert param.help in _helps(flags[opt]), (command_name, opt, param.help)
                    checked += 1
    assert checked > 40


def _declared() -> dict[str, list[str]]:
    """Each flag given to a ``typer.Option`` (or a shared option's declaration) in the command line's modules, and
    where."""
    found: dict[str, list[str]] = {}
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("Option", "_shared"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                        found.setdefault(arg.value, []).append(f"{path.name}:{node.lineno}")
    return found


def test_no_option_is_declared_twice():
    """A setup's flags are never written out but where a command takes its homonym; a shared flag is written in
    common.py alone."""
    declared = _declared()
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in OPTIONS:
        allowed = {Path(inspect.getsourcefile(inspect.unwrap(commands[c].callback))).name  # type: ignore[arg-type]
                   for c, f in HOMONYMS if f == flag(name)}
        written = {place.split(":")[0] for place in declared.get(flag(name), [])}
        assert written <= allowed, (flag(name), written)
    for shared in SHARED:
        assert {place.split(":")[0] for place in declared[shared]} == {"common.py"}, (shared, declared[shared])
