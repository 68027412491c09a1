"""Everything zbsolve uses of torch.distributed.pipelining, private names included; checked against torch 2.13.0.

torch's CSV loader (``_PipelineScheduleRuntime._load_csv``), its runtime, its stages' per-pass methods and its
split backward (``_backward.stage_backward_input``/``stage_backward_weight``) and its schedule classes' orders
(``pipeline_order``, ``_Action``, single-stage ``_step_microbatches``) are not public API and may change between
torch versions: this is the one module of zbsolve that touches them, so a new torch means checking this file alone.
torch is imported only when a function here is called; zbsolve works without it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zbsolve.base.errors import InputError
from zbsolve.core.schedule import BW, B, F, Kind, Op, Pair, Pass, W
from zbsolve.core.transforms import TORCH_KIND

_REJECTIONS = (AssertionError, RuntimeError, ValueError, KeyError)
"""What torch's loader raises for a schedule it refuses."""

_PASS_METHODS: tuple[tuple[str, Callable[[dict], Kind]], ...] = (
    ("forward_one_chunk", lambda kwargs: F),
    ("backward_one_chunk", lambda kwargs: BW if kwargs.get("full_backward", True) else B),
    ("backward_weight_one_chunk", lambda kwargs: W),
)
"""A pipeline stage's method for each pass, and the zbsolve pass kind of a call (given its keyword arguments)."""

_KIND_OF = {torch: kind for kind, torch in TORCH_KIND.items()}
"""torch's computation type (F, I, W, B) -> zbsolve pass kind (F, B, W, BW)."""


def has_pipelining() -> bool:
    """Whether torch.distributed.pipelining can be imported."""
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        return False
    return True


def _load_csv_text(runtime: Any, csv_text: str) -> None:
    """Load compute-only CSV text into ``runtime`` with torch's file loader; ``InputError`` if torch refuses it."""
    with tempfile.TemporaryDirectory(prefix="zbsolve-torch-") as tmp:
        path = Path(tmp) / "schedule.csv"
        path.write_text(csv_text)
        try:
            runtime._load_csv(str(path), format="compute_only")
        except _REJECTIONS as exc:
            raise InputError(f"torch rejects the exported schedule: {str(exc).splitlines()[0]}") from None


def lower_csv(csv_text: str, *, num_stages: int, num_microbatches: int, num_devices: int) -> list[list[str]]:
    """Load compute-only CSV text with torch's own loader, without a process group, as each rank would: torch
    parses it, validates it and lowers it to communication. Returns, per rank, torch's actions (compute and
    send/recv) as its action strings; raises ``InputError`` if torch rejects the schedule."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime.__new__(_PipelineScheduleRuntime)
    runtime._n_microbatches = num_microbatches
    runtime._num_stages = num_stages
    runtime.pp_group_size = num_devices
    runtime._stages = []
    runtime._defer_pp_recv = False
    runtime.pipeline_order = {}
    _load_csv_text(runtime, csv_text)
    lowered = runtime.pipeline_order_with_comms
    return [[str(action) for action in lowered[rank]] for rank in sorted(lowered)]


class _StageStandIn:
    """A pipeline stage as far as torch's schedule classes read it, without a module or a process group: the
    constructors read its sizes; a single-stage class's ``_step_microbatches`` gets no communication from it and
    records the passes it runs in ``ran``."""

    submod = None
    """No module: ``_check_torch_compile_compatibility`` skips the stage."""
    is_last = False
    """No loss to compute."""

    def __init__(self, stage_index: int, num_stages: int, num_devices: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = stage_index, num_stages, num_devices, 0
        self.ran: list[Op] = []
        for name, kind_of in _PASS_METHODS:
            setattr(self, name, self._recorder(kind_of))

    def _recorder(self, kind_of: Callable[[dict], Kind]) -> Callable[..., None]:
        def run(mb: int, *args: Any, **kwargs: Any) -> None:
            self.ran.append(Pass(kind_of(kwargs), mb, self.stage_index))
        return run

    def get_fwd_recv_ops(self, mb: int) -> list:
        """No communication."""
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, scale: int) -> None:
        """No gradients to reduce."""


def schedule_order(name: str, *, num_devices: int, stages_per_rank: int, num_microbatches: int) -> list[list[Op]]:
    """The order torch's own schedule class ``name`` (``schedules.get_schedule_class``, case-insensitive) runs on
    ``num_devices`` ranks of ``stages_per_rank`` stages each with ``num_microbatches`` microbatches, without a
    process group: per rank, its compute actions as zbsolve ops, torch's F, I, W and B as F, B, W and BW and an
    ``OVERLAP_F_B`` as an F&B ``Pair``.

    A ``PipelineScheduleMulti`` subclass is constructed on stand-in stages (every rank computes every rank's
    order): its ``pipeline_order`` (``_calculate_single_rank_operations``, validated and lowered by
    ``_prepare_schedule_with_comms`` less its FSDP pass, ``_without_fsdp_lowering``) without bubbles (None) and
    ``REDUCE_GRAD``. A ``PipelineScheduleSingle`` one (GPipe, 1F1B) is constructed once per rank and its
    ``_step_microbatches`` run on a stand-in stage that records each ``forward_one_chunk`` and
    ``backward_one_chunk``: its ``_get_pipeline_order`` is not what it runs (in torch 2.13, 1F1B's last rank starts
    there at microbatch 1), and is not built. ``InputError`` of one line, naming the
    schedule, when torch refuses ``name`` or the combination."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    p, v, m = num_devices, stages_per_rank, num_microbatches
    what = f"torch's {name} schedule (ranks = {p}, stages per rank = {v}, microbatches = {m})"
    try:
        cls = get_schedule_class(name)
        if issubclass(cls, PipelineScheduleSingle):
            if v != 1:
                raise ValueError(f"{cls.__name__} runs one stage per rank")
            return [_run_single(cls, _StageStandIn(rank, p, p), m) for rank in range(p)]
        with _without_fsdp_lowering():
            order = cls([_StageStandIn(i, p * v, p) for i in range(v)], m).pipeline_order
    except (*_REJECTIONS, TypeError) as exc:
        raise InputError(f"{what} is refused: {str(exc).splitlines()[0]}") from None
    if sorted(order) != list(range(p)):
        raise InputError(f"{what} is refused: {cls.__name__} gives no order for every rank")
    return [[_op(action) for action in order[rank] if action is not None and action.is_compute_op]
            for rank in range(p)]


@contextmanager
def _without_fsdp_lowering() -> Iterator[None]:
    """torch's lowering with its FSDP pass (``_add_unshard_reshard``, quadratic in a rank's actions: minutes at 128
    ranks and 1024 microbatches) left out: it only adds UNSHARD and RESHARD around the compute actions, which
    ``pipeline_order`` never holds, and refuses nothing; the send and receive pass that checks the order still runs."""
    from torch.distributed.pipelining import schedules

    def compute_only(compute_actions: list, max_active_stages: int = 3) -> list:
        return [a for a in compute_actions if a is not None]

    lowering = schedules._add_unshard_reshard
    schedules._add_unshard_reshard = compute_only
    try:
        yield
    finally:
        schedules._add_unshard_reshard = lowering


def _run_single(cls: type, stage: _StageStandIn, num_microbatches: int) -> list[Op]:
    """The passes single-stage schedule class ``cls`` runs on ``stage``, in order (its ``_step_microbatches``)."""
    # torch's __init__ builds every rank's ``_get_pipeline_order``, which ``_step_microbatches`` never reads: skipped
    schedule = type(cls.__name__, (cls,), {"_get_pipeline_order": lambda self: None})(stage, num_microbatches)
    schedule._stage_forward_initialized = True  # no shapes to infer: no module, no peers
    schedule._step_microbatches()
    return stage.ran


def _op(action: Any) -> Op:
    """A torch compute ``_Action`` as a zbsolve op."""
    if action.sub_actions is not None:
        f, b = (_pass(sub) for sub in action.sub_actions)
        return Pair(f, b)
    return _pass(action)


def _pass(action: Any) -> Pass:
    """A torch compute ``_Action`` of one pass as a zbsolve pass."""
    return Pass(_KIND_OF[action.computation_type.value], action.microbatch_index, action.stage_index)


def pipeline_stage(module: Any, stage_index: int, num_stages: int, device: Any) -> Any:
    """torch's ``PipelineStage`` running ``module`` as stage ``stage_index`` of ``num_stages`` on ``device``."""
    from torch.distributed.pipelining import PipelineStage

    return PipelineStage(module, stage_index, num_stages, device)


def pipeline_runtime(stages: list, num_microbatches: int, loss_fn: Callable, csv_text: str) -> Any:
    """torch's runtime for this rank's ``stages`` (ascending stage order) running the compute-only CSV text;
    ``step(*inputs, target=..., losses=..., return_outputs=False)`` runs one training step. ``InputError`` if
    torch rejects the schedule. ``defer_pp_recv`` stays off: it gave wrong gradients with a V-shape."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    runtime = _PipelineScheduleRuntime(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)
    _load_csv_text(runtime, csv_text)
    return runtime


def intercept_passes(stage: Any, around: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Route every F, B (torch's I), W and BW that torch's runtime runs on pipeline ``stage`` through
    ``around(kind, run)``, which must call ``run()`` once and return its result."""
    for name, kind_of in _PASS_METHODS:
        _intercept(stage, name, kind_of, around)


def _intercept(stage: Any, name: str, kind_of: Callable[[dict], Kind],
               around: Callable[[str, Callable[[], Any]], Any]) -> None:
    inner = getattr(stage, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return around(kind_of(kwargs), lambda: inner(*args, **kwargs))

    setattr(stage, name, call)


def backward_input(outputs: list, output_grads: list | None, inputs: list,
                   params: Iterable) -> list[dict[str, Any]]:
    """torch's B: the gradient of ``inputs`` from ``outputs`` (or the loss, with ``output_grads`` None), the graph
    kept for ``backward_weight``; returns the parameter groups that call needs."""
    from torch.distributed.pipelining._backward import stage_backward_input

    _, groups = stage_backward_input(outputs, output_grads, inputs, iter(params))
    return groups


def backward_weight(params: Iterable, groups: list[dict[str, Any]]) -> None:
    """torch's W: the gradients of ``params`` from the graph ``backward_input`` kept."""
    from torch.distributed.pipelining._backward import stage_backward_weight

    stage_backward_weight(iter(params), groups)

