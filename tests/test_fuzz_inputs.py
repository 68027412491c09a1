"""A fuzzer over what a user types first: ``zbsolve predict``'s and ``zbsolve configure``'s options (in-process)
and the Python entry points (``predict``, ``configure``, ``estimate``, ``solve``, ``plan``). Each value is drawn
from the valid ones, from near misses (wrong case, sizes as text, zero, negative, huge) and from junk; whatever is
drawn, the command exits 0, 1 or 2 with no traceback (one line on stderr where it fails), and the function returns
a result or raises an ``InputError``, never another exception. ``benchmarks/first_contact.py`` runs the same
strategies with more examples (``CHECKS``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import zbsolve
from zbsolve.app.cli import app

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / "problems/models/configs/llama3-8b.json")
SMALL = str(ROOT / "problems/models/configs/gpt3-1.5b.json")
MODEL = str(ROOT / "problems/models/gpt3-1.5b.yaml")

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([10**9, 2**31, -1, 0.5, float("nan")]),
                 st.text(max_size=6))
"""Values of no field."""
COUNT = st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(-2, 2**20), st.sampled_from(["4", "x", 1.5]))
SIZE = st.one_of(st.sampled_from(["80GiB", "40gib", "16GB", "1.5TiB", 80 * 2**30, "80", "0", "-4GiB", "lots",
                                  "1e400GiB"]), st.integers(-1, 2**40))
SCHEDULE = st.sampled_from(["1F1B", "1f1b", "dualpipe", "DualPipe", "Interleaved1F1B", "zbvzerobubble", "gpipe",
                            "zb-h1", "", "Combined1F1B"])
PREDICT: dict[str, st.SearchStrategy[Any]] = {
    "seq_len": st.one_of(st.sampled_from([2048, 8192, 10_000_000]), COUNT),
    "microbatch_size": COUNT, "global_batch": st.one_of(st.sampled_from([16, 64]), COUNT),
    "gpus": st.one_of(st.sampled_from([8, 16, 1_000_000]), COUNT), "tp": COUNT, "pp": COUNT, "vp": COUNT,
    "cp": COUNT, "ep": COUNT, "zero": st.one_of(st.sampled_from([0, 1, 3]), COUNT),
    "gpu": st.sampled_from(["h100", "H100", "a100", "b200", "tpu", ""]),
    "dtype": st.sampled_from(["bf16", "fp8", "FP8", "int4"]), "schedule": SCHEDULE, "device_memory": SIZE,
    "reserve": SIZE, "runtime": st.sampled_from(["megatron", "torchtitan", "deepspeed"]),
    "partition": st.sampled_from(["uniform", "balanced", "torchtitan", "8,8,8,8", "x", "1,2"]),
    "recompute": st.sampled_from(["none", "full", "selective", "uniform:2", "per-stage:1,0", "bogus"]),
    "layout": st.sampled_from(["Et|t*8|t*8|t*8|t*8L", "E|L", "zz"]),
}
"""Each of ``predict``'s fields drawn: valid values, near misses and junk."""
CONFIGURE: dict[str, st.SearchStrategy[Any]] = {
    name: PREDICT[name] for name in ("seq_len", "global_batch", "gpus", "gpu", "dtype", "device_memory", "reserve")}
"""``configure``'s fields drawn (the rest it searches)."""

runner = CliRunner()


def _flags(knobs: dict[str, Any]) -> list[str]:
    """``knobs`` as the command line writes them."""
    return [word for name, value in knobs.items() for word in ("--" + name.replace("_", "-"), str(value))]


def cli_clean(args: list[str]) -> None:
    """``zbsolve ARGS`` run in-process: exit 0, 1 or 2 and no traceback; a failure says one line on stderr."""
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 2:
        assert result.stderr.strip(), (args, result.output)


def python_clean(call: Callable[[], object]) -> None:
    """``call()`` returns a result or raises an ``InputError``, nothing else (an infeasible memory is an
    ``InfeasibleError``: a ``ZbsolveError`` too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except zbsolve.ZbsolveError:
            pass


def check_predict_cli(knobs: dict[str, Any]) -> None:
    cli_clean(["predict", CONFIG, *_flags(knobs)])


def check_configure_cli(knobs: dict[str, Any]) -> None:
    cli_clean(["configure", SMALL, "--time-limit", "1", "--refine", "0", "--jobs", "1", *_flags(knobs)])


def check_predict(knobs: dict[str, Any]) -> None:
    python_clean(lambda: zbsolve.predict(CONFIG, **knobs))


def check_configure(knobs: dict[str, Any]) -> None:
    python_clean(lambda: zbsolve.configure(SMALL, time_limit=1, refine=0, jobs=1, **knobs))


def check_estimate(knobs: dict[str, Any]) -> None:
    python_clean(lambda: zbsolve.estimate(CONFIG, **knobs))


def check_solve(knobs: dict[str, Any]) -> None:
    python_clean(lambda: zbsolve.solve(zbsolve.UNIT, time_limit=0.5, **knobs))


def check_plan(knobs: dict[str, Any]) -> None:
    python_clean(lambda: zbsolve.plan(MODEL, time_limit=1, jobs=1, **knobs))


def _some(fields: dict[str, st.SearchStrategy[Any]], required: dict[str, Any] | None = None,
          most: int = 4) -> st.SearchStrategy[dict[str, Any]]:
    """Up to ``most`` of ``fields`` drawn (with junk now and then) over ``required``'s valid values."""
    return st.fixed_dictionaries({}, optional={**{k: st.one_of(v, JUNK) for k, v in fields.items()}}).map(
        lambda drawn: {**(required or {}), **dict(list(drawn.items())[:most])})


SOLVE = {"mem_limit": st.one_of(st.sampled_from([None, 3, 8.0, [4, 4]]), JUNK),
         "num_microbatches": COUNT, "num_devices": st.one_of(st.sampled_from([2, 4]), COUNT),
         "placement": st.sampled_from(["sequential", "interleaved", "vshape", "Vshape", "x"]),
         "device_memory": SIZE, "recompute": st.sampled_from(["none", "full", "x"]),
         "mem_factor": st.one_of(st.sampled_from([0.5, 1, 2]), JUNK)}
PLAN = {"num_devices": st.one_of(st.sampled_from([2, 4]), COUNT), "num_microbatches": COUNT,
        "device_memory": SIZE, "placement": st.sampled_from(["auto", "sequential", "vshape", "VSHAPE", "x"]),
        "recompute": st.sampled_from(["none", "auto", "full", "x"]), "reserve": SIZE}
PREDICT_BASE = {"seq_len": 2048, "microbatch_size": 1, "global_batch": 16, "gpus": 8, "pp": 2}
CHECKS: dict[str, tuple[Callable[[dict[str, Any]], None], st.SearchStrategy[dict[str, Any]]]] = {
    "predict (CLI)": (check_predict_cli, _some(PREDICT, PREDICT_BASE)),
    "configure (CLI)": (check_configure_cli, _some(CONFIGURE, {"gpus": 8, "global_batch": 16, "seq_len": 2048}, 2)),
    "zbsolve.predict": (check_predict, _some(PREDICT, PREDICT_BASE)),
    "zbsolve.configure": (check_configure, _some(CONFIGURE, {"gpus": 8, "global_batch": 16, "seq_len": 2048}, 2)),
    "zbsolve.estimate": (check_estimate, _some(PREDICT, {"seq_len": 2048, "microbatch_size": 1})),
    "zbsolve.solve": (check_solve, _some(SOLVE, {"num_microbatches": 8, "num_devices": 4})),
    "zbsolve.plan": (check_plan, _some(PLAN, {"num_devices": 2, "num_microbatches": 4, "device_memory": "80GiB"})),
}
"""Each entry point's check and the options drawn for it; the tests run a few examples of each."""
EXAMPLES = {"configure (CLI)": 3, "zbsolve.configure": 3, "zbsolve.plan": 4}
"""Examples of the slow entry points (a search each); the others run ``FEW``."""
FEW = 15


@pytest.mark.parametrize("name", list(CHECKS))
def test_an_entry_point_never_tracebacks(name: str) -> None:
    """A CLI command ends in exit 0, 1 or 2 with at most one line on stderr; a Python entry point returns or raises
    an ``InputError`` alone."""
    check, strategy = CHECKS[name]
    runs = settings(max_examples=EXAMPLES.get(name, FEW), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
    runs(given(strategy)(check))()
