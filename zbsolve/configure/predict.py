"""One training configuration in, its figures out (``zbsolve predict``): the model estimated for its GPUs and
parallelism, cut into the pipeline's stages, run with one built-in order on the simulator, its step ended as the
runtime ends it (``costmodel.step_tail``).

The data-parallel degree is what the GPUs leave after tensor, pipeline and context parallelism, the microbatches
what the global batch leaves after the data-parallel replicas; a configuration that does not divide is refused in
one line naming the numbers. Pipeline parallelism is the outermost dimension of the device mesh (Megatron's
default order tp-cp-ep-dp-pp, torchtitan's pp first), so a data-parallel group spans nodes once tp x cp x dp
exceeds a node, and the stages' hops take the network once the GPUs span nodes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple, Optional, Union

from pydantic import InstanceOf

from zbsolve.base.errors import InputError
from zbsolve.base.shown import Tabled
from zbsolve.base.units import gib
from zbsolve.configure.memory_parts import DeviceMemory, device_memory, shortfalls
from zbsolve.core.schedule import Pass
from zbsolve.core.simulator import Timeline
from zbsolve.costmodel.calibration import Calibration, described
from zbsolve.costmodel.config_values import read_config
from zbsolve.costmodel.estimate import estimate, reference_flops_per_token
from zbsolve.costmodel.model import Model
from zbsolve.costmodel.setup import PREDICT_DEFAULTS, Setup
from zbsolve.costmodel.step_tail import device_tails
from zbsolve.io.targets.megatron.layout import layout_counts
from zbsolve.planning.runs import BaselineSetting, builtin_run
from zbsolve.problem.costs import Costs
from zbsolve.problem.partition import partition
from zbsolve.problem.recompute import parse_recompute
from zbsolve.problem.splits import split_ranges
from zbsolve.schedulers.builtins import BUILTINS, DUALPIPE, megatron_builtin, order_name

SPLITS = ("uniform", "torchtitan")
"""The splits ``--partition`` names besides layer counts."""
BREAKDOWN = ("compute", "bubble", "exposed_comm", "dp_sync", "optimizer")
"""The parts of the step on its critical device, which sum to the step."""
BREAKDOWN_NOTE = ("breakdown: on the device that ends the step; exposed_comm is the expert all-to-all of passes not "
                  "overlapped with another (tensor-parallel collectives are inside each pass's compute time), "
                  "dp_sync the data-parallel synchronisation after the last pass")


class Configuration(Setup):
    """One training run's configuration, as ``zbsolve predict`` takes it: a setup (Megatron's defaults: the
    distributed optimizer, the gradients' reduction and the parameters' gather overlapped), its split and its order."""

    what: ClassVar[str] = "configuration"
    OPTIONS: ClassVar[tuple[str, ...]] = (
        "seq_len", "microbatch_size", "global_batch", "gpus", "gpu", "dtype", "tp", "pp", "vp", "cp", "ep", "zero",
        "layout", "partition", "schedule", "recompute", "device_memory", "reserve", "runtime", "dispatcher",
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "compile", "calibration")
    """The fields ``zbsolve predict`` takes as options, in the order its command line writes them."""

    config: Union[str, Path]
    """The model's Hugging Face config.json."""
    global_batch: int
    """Sequences per step over every replica."""
    gpus: int
    """GPUs of the run."""
    zero: int = PREDICT_DEFAULTS["zero"]
    """0: DDP; 1: the distributed optimizer (ZeRO-1); 3: FSDP, the weights and gradients sharded too."""
    overlap_grad_reduce: bool = PREDICT_DEFAULTS["overlap_grad_reduce"]
    """Gradients reduced during the backward, bucket by bucket (Megatron's --overlap-grad-reduce)."""
    overlap_param_gather: bool = PREDICT_DEFAULTS["overlap_param_gather"]
    """Parameters all-gathered during the next forward (Megatron's --overlap-param-gather)."""
    layout: Optional[str] = None
    """Megatron's --pipeline-model-parallel-layout (None: the partition)."""
    partition: str = "uniform"
    """uniform, balanced, torchtitan, or layer counts per stage."""
    schedule: Optional[str] = None
    """A torch built-in, Combined1F1B or DualPipe, in any case (None: Megatron's order: 1F1B, or Interleaved1F1B
    with vp > 1)."""
    calibration: Union[str, Path, InstanceOf[Calibration], None] = PREDICT_DEFAULTS["calibration"]
    """Multipliers on the cost model's terms: auto (the shipped fit of the GPU and runtime where there is one, else
    none), none (the cost model as stated), a shipped one's name or zbsolve calibrate's file."""

    def command(self) -> str:
        """The ``zbsolve predict`` command line of this configuration: the options it needs, and those that differ
        from their defaults (``OPTIONS``)."""
        return shlex.join(["zbsolve", "predict", str(self.config), *self.arguments(self.OPTIONS)])


@dataclass(frozen=True, repr=False)
class Prediction(Tabled):
    """A configuration's figures; shown in Jupyter and rich as a table (``present.forms``)."""

    step_time_s: float
    """Seconds of one step."""
    tokens_per_s_per_gpu: float
    """Global batch x sequence length / step / GPUs."""
    model_tflops_per_gpu: float
    """Model FLOPs (6N + attention, ``reference_flops_per_token``) a second and GPU, in TFLOP/s."""
    mfu: float
    """Model FLOPs over the GPU's dense peak for the dtype."""
    peak_memory_gib: tuple[float, ...]
    """Per pipeline device, what torch's caching allocator holds at the peak (``DeviceMemory.allocator``: every
    part but the CUDA context's and NCCL's), GiB."""
    fits: bool
    """Whether every device's memory (``memory``: every part, the reserve included) fits the device memory."""
    breakdown: dict[str, float]
    """Seconds of the step by ``BREAKDOWN``."""
    dp: int
    """Data-parallel degree."""
    num_microbatches: int
    """Microbatches of a step on each pipeline."""
    schedule: str
    """The order run."""
    counts: tuple[int, ...]
    """Layers per stage."""
    device_memory_gib: float
    """Memory per device, GiB."""
    peak_flops: float
    """The dense peak the MFU is over, FLOP/s."""
    calibration: str = "calibration: none"
    """Which calibration scaled the cost model's terms, and by what (``calibration.described``)."""
    memory: tuple[DeviceMemory, ...] = ()
    """Per pipeline device, its memory by part (``memory_parts.PARTS``), which sum to what it needs."""
    shortfall_gib: tuple[float, ...] = ()
    """Per pipeline device, the GiB it needs beyond the device memory (0 where it fits)."""
    warnings: tuple[str, ...] = ()
    """Inputs past a limit the model's config states (``past_limits``): predicted all the same."""

    def figures(self) -> dict[str, object]:
        """The figures ``--json`` prints."""
        return {"step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu,
                "peak_memory_gib": list(self.peak_memory_gib), "fits": self.fits, "breakdown": self.breakdown,
                "calibration": self.calibration, "memory_gib": [m.gib() for m in self.memory],
                "shortfall_gib": list(self.shortfall_gib), "warnings": list(self.warnings)}

    def busiest(self) -> tuple[int, float]:
        """The pipeline device that needs the most memory and what it needs, GiB: every part, the reserve included
        (``DeviceMemory.total``, what the fit compares with the device memory); the allocator's peak where the parts
        are not given."""
        needs = [m.total / 2**30 for m in self.memory] or list(self.peak_memory_gib)
        device = max(range(len(needs)), key=needs.__getitem__)
        return device, needs[device]

    def __repr__(self) -> str:
        fits = "fits" if self.fits else f"does not fit ({max(self.shortfall_gib, default=0):.2f} GiB short)"
        return (f"Prediction({self.step_time_s:.4g} s a step, {self.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                f"MFU {100 * self.mfu:.1f}%, peak {max(self.peak_memory_gib, default=0):.2f} GiB of "
                f"{self.device_memory_gib:.2f}, {fits}; {self.schedule}, dp {self.dp}, m {self.num_microbatches})")


def past_limits(c: Configuration) -> tuple[str, ...]:
    """What in ``c`` goes past a limit its model's config states: a sequence longer than its positions
    (``max_position_embeddings``, GPT-2's ``n_positions``)."""
    data, where = read_config(c.config)
    limit = next((data[k] for k in ("max_position_embeddings", "n_positions") if k in data), None)
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < c.seq_len:
        return (f"seq_len = {c.seq_len} is beyond {where}'s max_position_embeddings = {limit}: the model was not "
                "trained on sequences this long; predicted all the same",)
    return ()


def degrees(c: Configuration) -> tuple[int, int]:
    """(data-parallel degree, microbatches) of ``c``; an ``InputError`` naming the numbers that do not divide."""
    replica = c.tp * c.pp * c.cp
    if c.gpus % replica:
        raise InputError(f"gpus = {c.gpus} is not a multiple of tp x pp x cp = {c.tp} x {c.pp} x {c.cp} = {replica}")
    dp = c.gpus // replica
    if c.global_batch % (c.microbatch_size * dp):
        raise InputError(f"global_batch = {c.global_batch} is not a multiple of microbatch_size x dp = "
                         f"{c.microbatch_size} x {dp} = {c.microbatch_size * dp}")
    return dp, c.global_batch // (c.microbatch_size * dp)


def configured_model(c: Configuration, dp: int) -> Model:
    """The estimate of ``c``'s model on one device of its parallelism, each layer's parameters recorded and its
    step ended as the runtime ends it (``Model.step``, even for one replica without ZeRO: its optimizer step)."""
    link = "network" if c.pp > 1 and c.gpus > c.device.gpus_per_node else "nvlink"
    return estimate(c.config, c.replace(dp=dp, link=link), step=True)


def stage_counts(c: Configuration, model: Model) -> tuple[int, ...]:
    """Layers per stage of ``c``'s layout or partition over ``c.pp`` x ``c.vp`` stages."""
    if c.layout is not None:
        given = layout_counts(model, c.layout, c.pp)
        if given.chunks != c.vp:
            raise InputError(f"layout = {c.layout!r} has {given.chunks} virtual stages per rank, but vp = {c.vp}")
        return given.counts
    stages = c.pp * c.vp
    ranges = (split_ranges(c.partition, model, stages) if c.partition in SPLITS
              else partition(model, stages, c.partition))
    return tuple(b - a for a, b in ranges)


class Run(NamedTuple):
    """A configuration's pipeline as ``predict`` simulates it."""

    model: Model
    """The estimate on one device of its parallelism (``configured_model``)."""
    schedule: str
    """The order run: ``c.schedule``, else Megatron's for ``c.vp``."""
    counts: tuple[int, ...]
    """Layers per stage."""
    timeline: Timeline
    """The order simulated on the partition, with the recomputation."""
    costs: Costs
    """The model's costs on that partition, and the device memory."""
    dp: int
    """Data-parallel degree."""
    num_microbatches: int
    """Microbatches of a step on each pipeline."""


def run(c: Configuration) -> Run:
    """``c``'s model, partition and order simulated: what ``predict`` reads its figures from."""
    dp, m = degrees(c)
    model = configured_model(c, dp)
    name = order_name(c.schedule) if c.schedule else megatron_builtin(c.vp)
    if name in BUILTINS and BUILTINS[name].chunks > 1 and c.vp == 1:
        raise InputError(f"schedule = {name!r} runs several stages per rank; give --vp")
    if name == DUALPIPE and c.vp > 1:
        raise InputError(f"vp = {c.vp}: DualPipe runs pp stages, each on two ranks (stages r and pp - 1 - r on "
                         "rank r); give vp 1")
    setting = BaselineSetting(model, c.pp, m, c.memory, c.kept)
    counts = stage_counts(c, model)
    timeline, costs = builtin_run(setting, name, c.vp, counts, parse_recompute(c.recompute))
    return Run(model, name, tuple(counts), timeline, costs, dp, m)


def predict(c: Configuration) -> Prediction:
    """The figures of configuration ``c``: its model, partition and order simulated, the step's tail included."""
    model, name, counts, timeline, costs, dp, m = run(c)
    gpu = c.device
    step = timeline.makespan
    tokens = c.global_batch * c.seq_len / step / c.gpus
    flops = tokens * reference_flops_per_token(c.config, c.seq_len)
    peak = gpu.fp8_flops if c.dtype == "fp8" and gpu.fp8_flops else gpu.flops
    memory = device_memory(c, costs, timeline, m, dp)
    short = shortfalls(memory, c.memory)
    return Prediction(step, tokens, flops / 1e12, flops / peak, tuple(gib(d.allocator) for d in memory),
                      not any(short), breakdown(model, timeline, costs), dp, m, name, counts, gib(c.memory), peak,
                      described(c.calibration, c.gpu, c.runtime), memory, short, past_limits(c))


def breakdown(model: Model, timeline: Timeline, costs: Costs) -> dict[str, float]:
    """Seconds of the step (``BREAKDOWN``) on the device whose share is the step: its passes' compute and their
    expert all-to-all where a pass runs alone (an overlapped pair hides it), its idle time before its last end, and
    its tail's synchronisation and optimizer step."""
    schedule = timeline.schedule
    shares = timeline.device_shares("makespan")
    d = max(range(len(shares)), key=shares.__getitem__)
    comm = sum(schedule.profile.comm(op.kind, op.stage) for op in schedule.devices[d] if isinstance(op, Pass))
    tail = device_tails(model, costs.ranges, schedule.placement)[d]
    work = timeline.work[d]
    return {"compute": work - comm, "bubble": timeline.end[d][-1] - work, "exposed_comm": comm,
            "dp_sync": tail.sync + tail.slowed, "optimizer": tail.optimizer}
