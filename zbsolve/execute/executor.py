"""Run a zbsolve schedule for real on torch.distributed and compare it with the simulator.

Each rank builds torch pipeline stages for its stages (ascending; the GPT cut as the document's partition says when
it has one), loads the exported CSV into torch's pipeline runtime (``zbsolve.core.torch_compat``) and runs ``steps``
training steps (no optimizer). Every F, B (torch's I), W and BW is timed (CUDA events on GPU) and its activation
memory counted through saved-tensor hooks; the first step is a warm-up, untimed when there are more. ``check``
compares every gradient with a single-process run of the whole model (nothing recomputed) on the same batch.

The blocks the document's ``partition.recompute`` names run under ``zbsolve.execute.recompute.checkpoint``: F keeps
each one's input; the first backward that reads it (B; W on the first stage, whose B computes nothing in torch)
runs its forward again and keeps what that saves until W ends, as the cost model says; those ``partition.selective``
names recompute their norms' and GELU's outputs so (``recompute_output``); the hooks count all of it. The plan's
peak lies a little above (a recomputing B's ``mem_r`` counts its input again); on the first stage far above, as
the plan holds what W reads from B's end while torch recomputes and frees it within W.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from zbsolve.base.checks import check_positive
from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.base.units import mib
from zbsolve.core import torch_compat
from zbsolve.core.measures import device_bubble
from zbsolve.core.profile import Profile, paper_deltas
from zbsolve.core.schedule import BW, B, F, Schedule, W, build
from zbsolve.core.simulator import simulate
from zbsolve.execute.launch import launch, torchrun_rank
from zbsolve.execute.memory import SavedBytes
from zbsolve.execute.modules import ModelSpec, load_model
from zbsolve.io.document import from_document, to_document
from zbsolve.io.torch_csv import torch_csv
from zbsolve.problem.costs import Costs

DEVICES = ("cpu", "cuda")
"""Where ``run_schedule`` runs: "cpu" (gloo) or "cuda" (NCCL)."""
_RTOL, _ATOL = 1e-4, 1e-6
_PASS_ORDER: tuple[str, ...] = (F, B, W, BW)
"""The passes in the order a rank's report lists them."""


class GradientCheckError(ZbsolveError):
    """A pipelined gradient differs from the single-process reference."""


class PeerTimeoutError(ZbsolveError):
    """A peer rank did not answer within the process-group timeout."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How ``run_schedule`` runs a schedule."""

    model: ModelSpec = ModelSpec()
    """The model, cut into as many stages as the schedule's placement has."""
    steps: int = 2
    """Training steps (the first is a warm-up and is not timed when there are more)."""
    device: str = "cpu"
    """"cpu" (gloo) or "cuda" (NCCL, one GPU per rank)."""
    check: bool = False
    """Compare every gradient with a single-process run of the whole model on the same batch."""
    batch_size: int | None = None
    """Full batch size, a multiple of the number of microbatches (None: the number of microbatches)."""
    timeout_s: float = 60.0
    """Process-group timeout: seconds before a silent peer is an error."""
    seed: int = 0
    """Seed of the batches: step i runs the batch of seed + i."""
    costs: Costs | None = None
    """The schedule document's costs (``zbsolve.io.costs_section.document_costs``): with a partition, the GPT is cut
    into the stages it names (``ModelSpec.partition``) and the plan's seconds and bytes are reported in ms and
    MiB."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise InputError(f"steps = {self.steps} must be >= 1")
        if self.device not in DEVICES:
            raise InputError(f"device = {self.device!r} is unknown; choose one of {', '.join(DEVICES)}")
        check_positive("timeout", self.timeout_s, "> 0 seconds and finite")


@dataclasses.dataclass(frozen=True)
class _RankJob:
    """Everything a rank needs; pickled to every spawned rank."""

    document: dict
    """The schedule document."""
    csv_text: str
    """The schedule as torch's compute-only CSV."""
    options: RunOptions
    """How to run it."""
    batch_size: int
    """Full batch size."""


class _Probe:
    """Times every pass of this rank's stages and tracks their activation memory."""

    def __init__(self, stages: list, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.saved = SavedBytes([t for st in stages for t in (*st.submod.parameters(), *st.submod.buffers())])
        self.events: list[tuple[int, str, Any, Any, int]] = []
        self.records: list[list[tuple[int, str, float, int]]] = []
        self.cuda_peaks: list[int] = []
        self.saved_peaks: list[int] = []
        self.busy: list[float] = []
        self.step_ms: list[float] = []
        self.started = 0.0
        self.cuda_base = 0
        for stage in stages:
            torch_compat.intercept_passes(stage, functools.partial(self._timed, stage.stage_index))

    def _clock(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _timed(self, stage_index: int, kind: str, run: Callable[[], Any]) -> Any:
        before = self.saved.current
        start = self._clock()
        with self.saved.hooks():
            out = run()
        self.events.append((stage_index, kind, start, self._clock(), self.saved.current - before))
        return out

    def begin_step(self) -> None:
        self.events = []
        self.saved.reset_peak()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.cuda_base = torch.cuda.memory_allocated(self.device)
        self.started = time.perf_counter()

    def end_step(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.cuda_peaks.append(torch.cuda.max_memory_allocated(self.device) - self.cuda_base)
        self.step_ms.append(1e3 * (time.perf_counter() - self.started))
        ms = [(s, k, a.elapsed_time(b) if self.cuda else 1e3 * (b - a), mem) for s, k, a, b, mem in self.events]
        self.records.append(ms)
        self.saved_peaks.append(self.saved.peak)
        self.busy.append(sum(x[2] for x in ms))


@contextmanager
def _peer_timeout(timeout_s: float) -> Iterator[None]:
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        if "timed out" in text.lower() or "timeout" in text.lower():
            raise PeerTimeoutError(f"no answer from a peer within the process-group timeout of {timeout_s:g} s: "
                                   f"{text.splitlines()[0]}") from None
        raise


def _check_grads(stages: list, reference: list, own: list[int], x: Any, y: Any, loss_fn: Any, step: int,
                 rank: int) -> None:
    for module in reference:
        module.zero_grad(set_to_none=True)
    out = x
    for module in reference:
        out = module(*out) if isinstance(out, tuple) else module(out)
    loss_fn(out, y).backward()
    for s, stage in zip(own, stages):
        for (name, got), ref in zip(stage.submod.named_parameters(), reference[s].parameters()):
            if (got.grad is None) != (ref.grad is None):
                raise GradientCheckError(f"rank {rank} step {step}: stage {s} parameter {name}: gradient is "
                                         f"{'missing' if got.grad is None else 'unexpected'} in the pipelined run")
            if got.grad is not None and not torch.allclose(got.grad, ref.grad, rtol=_RTOL, atol=_ATOL):
                diff = (got.grad - ref.grad).abs().max().item()
                raise GradientCheckError(f"rank {rank} step {step}: stage {s} parameter {name}: gradient differs "
                                         f"from the single-process reference by up to {diff:.3g}")


def _to(value: Any, device: torch.device) -> Any:
    return tuple(v.to(device) for v in value) if isinstance(value, (tuple, list)) else value.to(device)


def _rank_row(rank: int, own: list[int], probe: _Probe, loss: float | None, checked: bool) -> dict:
    timed = probe.records[1:] if len(probe.records) > 1 else probe.records
    stage_ms: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    stage_mem: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for step in timed:
        for s, kind, ms, mem in step:
            stage_ms[s][kind].append(ms)
            stage_mem[s][kind].append(mem)
    kinds = sorted({k for s in stage_ms for k in stage_ms[s]}, key=_PASS_ORDER.index)
    pass_ms = {k: _mean([ms for s in stage_ms for ms in stage_ms[s][k]]) for k in kinds}
    skip = len(probe.records) - len(timed)
    return {"rank": rank, "stages": own, "timed_steps": len(timed), "pass_ms": pass_ms,
            "stage_ms": {s: {k: _mean(v) for k, v in d.items()} for s, d in stage_ms.items()},
            "stage_mem": {s: {k: _mean(v) for k, v in d.items()} for s, d in stage_mem.items()},
            "busy_ms": _mean(probe.busy[skip:]), "step_ms_each": list(probe.step_ms[skip:]),
            "peak_saved_bytes": max(probe.saved_peaks[skip:]),
            "peak_cuda_bytes": max(probe.cuda_peaks[skip:]) if probe.cuda_peaks else None,
            "loss": loss, "grad_check": "passed" if checked else "not run"}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _run_rank(rank: int, schedule: Schedule, job: _RankJob, device: torch.device) -> dict:
    options = job.options
    S, m = schedule.num_stages, schedule.num_microbatches
    model = load_model(options.model, S)
    own = sorted(s for _, s in schedule.placement.stages_of(rank))
    stages = [torch_compat.pipeline_stage(model.stages[s].to(device), s, S, device) for s in own]
    runtime = torch_compat.pipeline_runtime(stages, m, model.loss_fn, job.csv_text)
    plain = dataclasses.replace(options.model, recompute=(), selective=())
    reference = [module.to(device) for module in load_model(plain, S).stages] if options.check else []
    probe = _Probe(stages, device)
    losses: list = []
    for step in range(options.steps):
        for stage in stages:
            stage.submod.zero_grad(set_to_none=True)
        x, y = (_to(v, device) for v in model.make_batch(job.batch_size, options.seed + step))
        args = (x if isinstance(x, tuple) else (x,)) if 0 in own else ()
        dist.barrier()
        probe.begin_step()
        runtime.step(*args, target=y if S - 1 in own else None, losses=losses if S - 1 in own else None,
                     return_outputs=False)
        probe.end_step()
        if options.check:
            _check_grads(stages, reference, own, x, y, model.loss_fn, step, rank)
    dist.barrier()
    loss = torch.stack([v.detach() for v in losses]).mean().item() if losses else None
    rows: list = [None] * dist.get_world_size()
    dist.all_gather_object(rows, _rank_row(rank, own, probe, loss, options.check))
    return {"rows": rows}


def _rank_main(rank: int, world_size: int, init_method: str, job: _RankJob) -> dict:
    """One rank: join the process group, run the schedule, return every rank's report row."""
    schedule, _ = from_document(job.document)
    options = job.options
    place = torchrun_rank()
    local = place.local_rank if place is not None else rank
    if options.device == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    with _peer_timeout(options.timeout_s):
        dist.init_process_group("nccl" if options.device == "cuda" else "gloo", init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=options.timeout_s))
        try:
            return _run_rank(rank, schedule, job, device)
        finally:
            dist.destroy_process_group()


def _measured_profile(schedule: Schedule, rows: list[dict]) -> Profile:
    """Per-stage mean times (ms) and memory deltas (MiB) measured, as a profile for the simulator."""
    t: dict[str, list[float]] = {name: [] for name in ("t_f", "t_b", "t_w", "mem_f", "mem_b", "mem_w")}
    ms = {s: d for row in rows for s, d in row["stage_ms"].items()}
    mem = {s: d for row in rows for s, d in row["stage_mem"].items()}
    tiny = 1e-6
    for s in range(schedule.num_stages):
        _, t_b0, t_w0 = schedule.profile.durations(s)
        t_f = ms[s].get(F, tiny)
        if B in ms[s]:
            t_b, t_w = ms[s][B], ms[s].get(W, tiny)
        else:
            share = t_b0 / (t_b0 + t_w0)
            t_b, t_w = share * ms[s][BW], (1 - share) * ms[s][BW]
        mem_f = mib(mem[s].get(F, 0.0))
        mem_b = mib(mem[s][B]) if B in mem[s] else 0.0
        for name, value in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w)):
            t[name].append(max(value, tiny))
        t["mem_f"].append(mem_f)
        t["mem_b"].append(mem_b)
        t["mem_w"].append(paper_deltas(mem_f, mem_f + mem_b)[2])
    return Profile(t_f=t["t_f"], t_b=t["t_b"], t_w=t["t_w"], mem_f=t["mem_f"], mem_b=t["mem_b"], mem_w=t["mem_w"])


def _with_predictions(schedule: Schedule, rows: list[dict], costs: Costs | None) -> list[dict]:
    """Add the measured makespan and bubble, and the simulator's figures, to each rank's row; the plan's makespan
    in ms when its times are a model's seconds, its peak in MiB when its memory is in bytes."""
    steps = len(rows[0]["step_ms_each"])
    makespan = _mean([max(row["step_ms_each"][i] for row in rows) for i in range(steps)])
    planned = simulate(schedule)
    measured = build(schedule.name, schedule.placement, schedule.num_microbatches, _measured_profile(schedule, rows),
                     schedule.devices, None, schedule.microbatch_route)
    replay = simulate(measured)
    seconds, in_bytes = costs is not None and costs.model is not None, costs is not None and costs.in_bytes
    out = []
    for row in rows:
        d = row["rank"]
        out.append({**row, "makespan_ms": makespan, "bubble": device_bubble(row["busy_ms"], makespan),
                    "peak_saved_mib": mib(row["peak_saved_bytes"]),
                    "sim_bubble": device_bubble(planned.work[d], planned.makespan), "sim_peak": planned.peak_memory[d],
                    "sim_makespan_ms": replay.makespan,
                    "sim_bubble_measured": device_bubble(replay.work[d], replay.makespan),
                    "sim_peak_mib": replay.peak_memory[d],
                    "plan_makespan_ms": 1e3 * planned.makespan if seconds else None,
                    "plan_peak_mib": mib(planned.peak_memory[d]) if in_bytes else None})
    return out


def oversubscription(num_ranks: int, device: str) -> str | None:
    """A one-line warning when ``num_ranks`` CPU ranks on this machine (torchrun's local ranks when under
    torchrun) outnumber its cores: ranks then wait for a core, and the measured figures are not comparable with
    the simulator's. None when they fit."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", num_ranks))
    cores = os.cpu_count() or 1
    if device != "cpu" or local <= cores:
        return None
    return (f"{local} ranks on {cores} CPU cores: ranks wait for a core, so the measured times and bubbles are not "
            "comparable with the simulator's")


def run_schedule(schedule: Schedule, options: RunOptions = RunOptions(),
                 warn: Callable[[str], None] | None = None) -> list[dict]:
    """Run ``schedule`` on one process per device (the built-in launcher, or the current torchrun job) and return
    one report row per rank, each with the simulator's prediction beside the measurement, this machine's CPU cores
    and whether the ranks outnumber them (``oversubscription``, told to ``warn`` once the inputs are checked and
    before any rank starts)."""
    costs = options.costs
    if costs is not None and costs.model is not None:
        layers = costs.model.layers
        model = dataclasses.replace(options.model, recompute=tuple(layers[i].name for i in costs.recomputed),
                                    selective=tuple(layers[i].name for i in costs.selective),
                                    partition=tuple(tuple(x.name for x in layers[a:b]) for a, b in costs.ranges))
        options = dataclasses.replace(options, model=model)
    timeline = simulate(schedule)
    p, S, m = schedule.num_devices, schedule.num_stages, schedule.num_microbatches
    csv_text = torch_csv(schedule)
    torch_compat.lower_csv(csv_text, num_stages=S, num_microbatches=m, num_devices=p)
    batch_size = m if options.batch_size is None else options.batch_size
    if batch_size < 1 or batch_size % m:
        raise InputError(f"batch_size = {batch_size} must be a positive multiple of num_microbatches = {m}")
    place = torchrun_rank()
    if options.device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("device = 'cuda' but torch.cuda.is_available() is False (no GPU or a CPU-only torch)")
        if place is None and torch.cuda.device_count() < p:
            raise InputError(f"device = 'cuda' needs one GPU per rank: the schedule has {p} devices, "
                             f"this machine {torch.cuda.device_count()} GPUs")
    load_model(options.model, S)  # a bad model is an input error here, before any rank starts
    crowded = oversubscription(p, options.device)
    if crowded is not None and warn is not None:
        warn(crowded)
    job = _RankJob(to_document(timeline), csv_text, options, batch_size)
    if place is not None:
        if place.world_size != p:
            raise InputError(f"torchrun started {place.world_size} ranks, but the schedule has {p} devices")
        rows = _rank_main(place.rank, place.world_size, "env://", job)["rows"]
    else:
        rows = launch(_rank_main, p, job, deadline_s=120.0 + options.timeout_s * (options.steps + 2))[0]["rows"]
    names, spec = options.model.partition or ((),) * S, options.model
    return [{**row, "cpu_cores": os.cpu_count(), "oversubscribed": crowded is not None,
             **{key: [n for s in row["stages"] for n in names[s] if n in chosen]
                for key, chosen in (("recomputed", spec.recompute), ("selective", spec.selective))}}
            for row in _with_predictions(schedule, rows, costs)]

