"""Helpers shared by the tests: paths built from the repository root (so the tests run from any working
directory), problem files, the command line run in-process, 1F1B written out by hand, checks of a solve result,
exhaustive search on tiny formulations, and small models; and, from ``helpers``, those on the runtimes zbsolve exports to and small MoE configs.

Test modules import them by name: ``from conftest import ROOT, problem, one_f_one_b``.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import Result
from helpers import (  # noqa: F401  (shared by test modules through conftest)
    DEEPSEEK,
    LLAMA,
    MEGATRON_CORE_FIELDS,
    MIXTRAL,
    QWEN2_MOE,
    import_llama3,
    load_torchtitan_config,
    megatron_flags,
    torchtitan_export,
)
from typer.testing import CliRunner

from zbsolve.base import parallel
from zbsolve.base.checks import slack
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core.placement import interleaved, sequential, vshape
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import BW, B, F, Pass, Schedule, W, build
from zbsolve.core.simulator import Timeline, simulate
from zbsolve.costmodel.model import Layer, Model, Setting
from zbsolve.problem.problem_file import Problem
from zbsolve.schedulers.families import PLACEMENT_FAMILIES, make_schedule
from zbsolve.schedulers.heuristic import heuristic


def pytest_configure(config: pytest.Config) -> None:
    """The library's worker pools fork in the tests, as they do under the ``zbsolve`` script: under ``python -m
    pytest`` (and in pytest-xdist's workers, which run a thread beside the tests) ``parallel.start_method`` would
    spawn them, each importing zbsolve and torch again before its first job. The forked workers run only zbsolve's
    jobs, never the test runner's thread. Process tests that start the script itself are unchanged."""
    if "fork" in multiprocessing.get_all_start_methods():
        parallel.start_method = lambda: "fork"


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' output as a file or a pipe gets it: without the COLUMNS that pytest-xdist's workers set (80),
    tables are laid out for 100 columns; a test that means a width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The notebooks first: each runs a kernel for tens of seconds, and with ``--dist loadgroup`` the workers take
    tests in this order, so that the longest ones start at once rather than leave one worker busy at the end."""
    items.sort(key=lambda item: item.path.suffix != ".ipynb")


ROOT = Path(__file__).resolve().parent.parent
"""The repository root: every path in the tests is built from it."""
PROBLEMS = ROOT / "problems"
ICLR = sorted((PROBLEMS / "iclr").glob("*.yaml"))
"""The Zero Bubble paper's twelve settings."""
VSHAPE = sorted((PROBLEMS / "vshape").glob("*.yaml"))
"""The paper's nine V-shape settings (per-chunk times)."""
assert ICLR and VSHAPE, f"no problem files under {PROBLEMS}"


def problem(name: str) -> Problem:
    """The problem file ``problems/<name>.yaml``, e.g. ``problem("iclr/1.5b-p8-m24")``."""
    return Problem.load(PROBLEMS / (name if name.endswith((".yaml", ".json")) else f"{name}.yaml"))


def stem(path: Path) -> str:
    """Test id of a problem file: its name without ``.yaml``."""
    return path.stem


# -- a Dask cluster -----------------------------------------------------------------------------------

@pytest.fixture
def dask_address() -> Iterator[str]:
    """The address of a local Dask cluster (two worker processes of one thread), as an executor takes it
    ("dask://HOST:PORT"), closed after the test: a cluster left running beside the later tests of its xdist worker
    was seen to hang a notebook's kernel shutdown (nbclient's heartbeat channel never joined). Tests that use it are
    marked ``xdist_group("dask")`` so that ``--dist loadgroup`` runs them on one worker."""
    distributed = pytest.importorskip("distributed", reason="dask's distributed is not installed (the dask extra)")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield f"dask://{cluster.scheduler_address}"


# -- the command line ---------------------------------------------------------------------------------

RUNNER = CliRunner()


def zbsolve(*args: object) -> Result:
    """Run the command line in-process, on a terminal wide enough that rich wraps no line; the result has
    exit_code, stdout, stderr and exception."""
    from zbsolve.app.cli import app

    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "100000"})


def failed_cleanly(result: Result, code: int) -> str:
    """Assert ``result`` exited with ``code`` after one line on stderr and no traceback; return that line."""
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    return lines[0]


# -- schedules -----------------------------------------------------------------------------------------

def one_f_one_b(p: int, m: int, profile: Profile = UNIT, mem_limit: float | Sequence[float] | None = None, *,
                split: bool = False) -> Schedule:
    """1F1B written out by hand: device i runs min(p-1-i, m) warm-up F, then F and backward alternating,
    then the cool-down backwards; the backward is one BW, or B then W when ``split``."""
    devices = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        back = [[Pass(B, k, s), Pass(W, k, s)] if split else [Pass(BW, k, s)] for k in range(m)]
        ops = [Pass(F, k, s) for k in range(warm)]
        for k in range(m - warm):
            ops += [Pass(F, warm + k, s), *back[k]]
        for k in range(m - warm, m):
            ops += back[k]
        devices.append(ops)
    return build("1f1b", sequential(p), m, profile, devices, mem_limit)


def span_bubble(timeline: Timeline) -> float:
    """The paper's bubble as a time: max span - max work."""
    return max(timeline.span) - max(timeline.work)


def objective_of(timeline: Timeline, kind: str = "span") -> float:
    """A solve objective of a timeline: the longest span ("span") or the makespan."""
    return max(timeline.span) if kind == "span" else timeline.makespan


def limits_of(limit: float | Sequence[float] | None, p: int) -> list[float | None]:
    """A memory limit as one value per device."""
    return list(limit) if isinstance(limit, (list, tuple)) else [limit] * p


# -- solve results -------------------------------------------------------------------------------------

def heuristic_objective(result) -> float:
    """The objective of the paper's heuristic on ``result``'s own problem: a warm start ``solve`` always
    tries, so no result may be worse."""
    s = result.schedule
    limit = list(s.mem_limit) if isinstance(s.mem_limit, tuple) else s.mem_limit
    return objective_of(simulate(heuristic(s.profile, s.placement, s.num_microbatches, limit)), result.objective_kind)


def placement_families(result) -> tuple[str, ...]:
    """The families of ``result``'s placement (``PLACEMENT_FAMILIES``)."""
    s = result.schedule
    names = {sequential(s.num_devices): "sequential", vshape(s.num_devices): "vshape",
             interleaved(s.num_devices): "interleaved"}.get(s.placement)
    return PLACEMENT_FAMILIES.get(names, ())


def floor_objective(result) -> float:
    """The best objective of the families of ``result``'s placement that fit its memory limit (infinite when none
    does): schedules every solve builds whatever its time limit, so no result that was not interrupted may be
    worse."""
    s = result.schedule
    limits = limits_of(list(s.mem_limit) if isinstance(s.mem_limit, tuple) else s.mem_limit, s.num_devices)
    best = math.inf
    for name in placement_families(result):
        timeline = simulate(make_schedule(name, s.profile, s.num_devices, s.num_microbatches))
        if all(lim is None or peak <= lim * (1 + 1e-9) for peak, lim in zip(timeline.peak_memory, limits)):
            best = min(best, objective_of(timeline, result.objective_kind))
    return best


def statuses_of(result) -> tuple[str, ...]:
    """The status ``result`` must have, told by its other figures, not by its own status: who made the schedule
    ("feasible" when the backend asked for did, as its schedules are named after it; else "heuristic": a family or
    a warm start) unless its lower bound meets its objective (up to ``slack``), when "optimal" if that bound is
    on the problem itself (the log reports no times rounded for the solver). The one case with two answers is a
    bound met on rounded times: "optimal" only if an exact bound proved it too, else who made the schedule."""
    made = "feasible" if result.solver in ("cpsat", "cbc") and result.schedule.name == result.solver else "heuristic"
    if result.objective - result.lower_bound > slack(result.objective):
        return (made,)
    return ("optimal", made) if "rounded to integers for the solver" in result.solver_log else ("optimal",)


def check_result(result, limit: float | Sequence[float] | None = None, *, status: str | None = None) -> Timeline:
    """What holds for every solve result whatever the time limit: its schedule re-simulates to its own
    figures, within ``limit``, its gap matches its bound, its status is the one its figures tell
    (``statuses_of``) and, when the caller states it, ``status``; and it is never worse than any schedule its log
    reports (the first schedule among them), nor, unless it was interrupted, than any family of its placement that
    fits (``floor_objective``), whatever its time limit."""
    timeline = simulate(result.schedule)
    assert timeline.start == result.timeline.start and timeline.end == result.timeline.end
    assert result.objective == objective_of(timeline, result.objective_kind)
    assert result.paper_bubble == timeline.paper_bubble and result.peak_memory == timeline.peak_memory
    assert result.gap == pytest.approx((result.objective - result.lower_bound) / result.objective)
    assert result.status in statuses_of(result), (result.status, statuses_of(result), result.solver_log)
    if status is not None:
        assert result.status == status, (result.status, result.solver_log)
    if limit is not None:
        for peak, lim in zip(timeline.peak_memory, limits_of(limit, timeline.schedule.num_devices)):
            assert peak <= lim * (1 + 1e-9)
    if not result.interrupted:
        assert result.objective <= floor_objective(result) * (1 + 1e-9), result.solver_log
    warm = [float(line.split(": objective ")[1]) for line in result.solver_log.splitlines() if ": objective " in line]
    assert warm and result.objective <= min(warm) * (1 + 1e-5), result.solver_log  # the log has six digits
    return timeline


# -- formulations --------------------------------------------------------------------------------------

def serial_order(form) -> list[list[int]]:
    """Per device, each microbatch's F, B, W together in microbatch order: a valid, poor order."""
    return [sorted(ps, key=lambda i: (form.passes[i].mb, "FBW".index(form.passes[i].kind)))
            for ps in form.device_passes()]


def interleavings(form, d: int) -> Iterator[list[int]]:
    """Every order of one-stage device d's passes that keeps each kind in microbatch order and runs each
    microbatch's F, B, W in that order (the only orders without a deadlock)."""
    stage = form.placement.routes[0].index(d)
    m = form.num_microbatches

    def extend(order: list[int], seen: dict[str, int]) -> Iterator[list[int]]:
        if len(order) == 3 * m:
            yield list(order)
        for k, before in ((F, None), (B, F), (W, B)):
            if seen[k] < m and (before is None or seen[k] < seen[before]):
                order.append(form.index_of(k, seen[k], stage))
                seen[k] += 1
                yield from extend(order, seen)
                seen[k] -= 1
                order.pop()

    yield from extend([], {F: 0, B: 0, W: 0})


def brute_force(form) -> tuple[int, list[list[int]]]:
    """The smallest scaled objective over all orders of a sequential formulation (same-kind passes in
    microbatch order, memory within the limit) and an order that reaches it."""
    p = form.num_devices
    per_device = [[o for o in interleavings(form, d) if form.memory_ok([o if e == d else [] for e in range(p)])]
                  for d in range(p)]
    best = None
    for combo in itertools.product(*per_device):
        try:
            value = form.value(form.asap(combo))
        except InputError:
            continue
        if best is None or value < best[0]:
            best = (value, [list(o) for o in combo])
    assert best is not None, "no order fits the memory limit"
    return best


def act_heavy() -> Model:
    """Eight blocks whose activations (1 GiB a microbatch, all of it read by W) dwarf their weights."""
    return Model(name="act", layers=[
        Layer(name=n, block=n.startswith("layers."), t_f=1.0, t_b=1.0, t_w=1.0, mem_f=GIB, mem_b=0, mem_w=-GIB,
              static_bytes=GIB // 8, out_bytes=GIB // 64)
        for n in ("tok_embeddings", *(f"layers.{i}" for i in range(8)), "output")])


def export_toy() -> Model:
    """An embedding, six blocks ``layers.0``..., a final norm and the head ``output``, as zbsolve estimates them."""
    def layer(name: str, block: bool) -> Layer:
        return Layer(name=name, block=block, t_f=1.0, t_b=1.0, t_w=0.5, mem_f=2, mem_b=-1, mem_w=-1,
                     static_bytes=10, out_bytes=1)

    return Model(name="toy", layers=[layer("tok_embeddings", False), *(layer(f"layers.{i}", True) for i in range(6)),
                                     layer("norm", False), layer("output", False)])


def heavy_head(blocks: int = 12, head: float = 3.0, t_comm: float = 0.0) -> Model:
    """Equal blocks (F = B = W = 1), a head of F = B = W = ``head``, and a tiny embedding and norm."""
    def layer(name: str, t: float, block: bool = True) -> Layer:
        return Layer(name=name, block=block, t_f=t, t_b=t, t_w=t, mem_f=2**26, mem_b=-2**25, mem_w=-2**25,
                     static_bytes=2**30, out_bytes=2**20)
    return Model(name="heavy", t_comm=t_comm, layers=[
        layer("tok_embeddings", 0.01, False), *(layer(f"layers.{i}", 1.0) for i in range(blocks)),
        layer("norm", 0.01, False), layer("output", head, False)])


def toy_layer(name: str, i: int, block: bool = True, **fields) -> dict:
    """A layer whose figures differ with ``i``, so that a wrong sum shows."""
    return {"name": name, "block": block, "t_f": 0.1 * i + 0.01, "t_b": 0.2 * i + 0.02, "t_w": 0.05 * i + 0.03,
            "mem_f": 1000 + i, "mem_b": -600 - i, "mem_w": -400, "static_bytes": 10**9 + i, "out_bytes": 500 + i,
            **fields}


TOY_LAYERS = ([toy_layer("tok_embeddings", 0, block=False, t_b=0.0)]
              + [toy_layer(f"layers.{i}", i + 1) for i in range(5)]
              + [toy_layer("norm", 6, block=False),
                 toy_layer("output", 7, block=False, shares="tok_embeddings", out_bytes=4)])
"""Embedding, five blocks, norm, head (tied to the embedding)."""


def toy(**fields) -> Model:
    """A model of ``TOY_LAYERS``, with ``fields``."""
    return Model(name="toy", layers=TOY_LAYERS, **fields)


# -- Megatron's combined 1F1B -------------------------------------------------------------------------------

def combined_toy(experts: bool = True, ep: int | None = 2, dtype: str = "bf16", mtp: int = 0) -> Model:
    """The export toy with a setting; its blocks with experts (half of F and B all-to-all) where asked, and ``mtp``
    MTP layers before the head."""
    layers = [layer.model_copy(update={"comm_f": 0.5, "comm_b": 0.5}) if layer.block and experts else layer
              for layer in export_toy().layers]
    extra = [Layer(name=f"mtp.{i}", t_f=1.0, t_b=1.0, t_w=0.5, mem_f=2, mem_b=-1, mem_w=-1, static_bytes=10,
                   out_bytes=1) for i in range(mtp)]
    setting = Setting(seq_len=16, microbatch_size=1, dp=4, ep=ep if experts else None, dtype=dtype)
    return Model(name="toy", setting=setting, layers=[*layers[:-1], *extra, layers[-1]])


COMBINED_CASES = {  # (combined_toy's arguments, devices, chunks, full, modules)
    "interleaved": ({}, 2, 2, False, ()),
    "no pipeline": ({}, 1, 1, False, ()),
    "no virtual stages": ({}, 2, 1, False, ()),
    "ep 1": ({"ep": 1}, 2, 2, False, ()),
    "dense": ({"experts": False}, 2, 2, False, ()),
    "full recomputation": ({}, 2, 2, True, ()),
    "selective modules": ({}, 2, 2, False, ("mlp", "core_attn")),
    "fp16": ({"dtype": "fp16"}, 2, 2, False, ()),
    "fp32": ({"dtype": "fp32"}, 2, 2, False, ()),
    "one mtp layer": ({"mtp": 1}, 2, 2, False, ()),
    "two mtp layers": ({"mtp": 2}, 2, 2, False, ()),
    "mtp without pipeline": ({"mtp": 1}, 1, 1, False, ()),
}
"""Plans of Megatron's combined 1F1B: the toy's arguments, devices, virtual stages per device, every block
recomputed whole, and the modules recomputed selectively."""


def predict_read(command: str, monkeypatch: pytest.MonkeyPatch) -> list:
    """The configurations ``zbsolve predict`` reads from the ``command`` line (run in-process, nothing predicted)."""
    import shlex

    import zbsolve.configure.predict as predict_module
    from zbsolve.app.cli import app

    taken: list = []

    def capture(given: object) -> None:
        taken.append(given)
        raise InputError("captured")

    monkeypatch.setattr(predict_module, "predict", capture)
    CliRunner().invoke(app, shlex.split(command)[1:])
    return taken
