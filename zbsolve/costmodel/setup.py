"""One training setup: every knob of a run, named once (the model's config, the GPU, the dtype, the batch, the
degrees of parallelism, the optimizer's sharding, the recomputation, the overlaps, the expert dispatcher, the
device memory). ``estimate`` reads it, ``predict``'s configuration extends it, ``configure``'s space holds one, and
each command line option is bound to one of its fields by name (``--seq-len`` to ``seq_len``).

A field is added with its type, its default and one docstring line (the option's help); a rule that checks its
value goes into ``RULES``. A value the rules refuse is one ``InputError`` line naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self, cast

from pydantic import ConfigDict, InstanceOf

from zbsolve.base.checks import check_count
from zbsolve.base.errors import InputError
from zbsolve.base.inputs import InputModel
from zbsolve.base.units import GIB, MIB, parse_bytes
from zbsolve.costmodel.calibration import AUTO, STATED, Calibration, load_calibration, resolved
from zbsolve.costmodel.constants import DTYPE_BYTES
from zbsolve.costmodel.gpus import LINKS, Gpu, device_memory, get_gpu
from zbsolve.costmodel.model import Dispatcher, Setting, Zero
from zbsolve.costmodel.moe import DISPATCHERS
from zbsolve.costmodel.runtime_memory import RUNTIMES, outside_allocator

PREDICT_OPTIONS = ("seq_len", "microbatch_size", "global_batch", "gpus", "gpu", "dtype", "tp", "pp", "vp", "cp", "ep",
                   "zero", "recompute", "device_memory", "reserve", "runtime", "dispatcher", "overlap_grad_reduce",
                   "overlap_param_gather", "tp_comm_overlap", "compile", "calibration")
"""The fields of a setup ``zbsolve predict`` takes as options (besides its config, split and order)."""
PREDICT_DEFAULTS: dict[str, Any] = {"zero": 1, "overlap_grad_reduce": True, "overlap_param_gather": True,
                                    "calibration": AUTO}
"""Where ``zbsolve predict``'s default differs from the setup's: Megatron's distributed optimizer and overlaps, and
the shipped calibration of the GPU and runtime."""


class Setup(InputModel):
    """A training run's knobs, each once: what the estimate, ``predict`` and ``configure`` read."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    what: ClassVar[str] = "setup"

    config: str | Path | None = None
    """The model's Hugging Face config.json (None: given beside, as ``estimate`` takes it)."""
    gpu: str | InstanceOf[Gpu] = "h100"
    """The GPU preset (``costmodel.gpus.GPUS``), or a ``Gpu`` of one's own."""
    dtype: str = "bf16"
    """Type of the matrix products: bf16, fp16 or fp8 (Transformer Engine's FP8 linear layers)."""
    seq_len: int
    """Tokens per sequence."""
    microbatch_size: int
    """Sequences per microbatch."""
    global_batch: int | None = None
    """Sequences per step over every replica."""
    gpus: int | None = None
    """GPUs of the run."""
    tp: int = 1
    """Tensor-parallel degree (with sequence parallelism)."""
    pp: int = 1
    """Pipeline ranks."""
    vp: int = 1
    """Virtual stages per pipeline rank."""
    dp: int = 1
    """Data-parallel degree of one estimate (a configuration's is what its GPUs leave)."""
    cp: int = 1
    """Context-parallel degree (ring attention)."""
    ep: int = 1
    """Expert-parallel degree (routed experts whole, not split by tp)."""
    zero: int = 0
    """0: DDP; 1: the distributed optimizer (ZeRO-1); 3: FSDP, the weights and gradients sharded too."""
    recompute: str = "none"
    """none, full, uniform:N, per-stage:..., selective, modules:M,... or op (``problem.recompute.RECOMPUTE_FORMS``)."""
    device_memory: int | None = None
    """Memory per device, bytes or a size as text, e.g. "80GiB" (None: the GPU preset's)."""
    reserve: int | None = None
    """Memory per device kept free of stages and activations, bytes or a size as text (None: the runtime's own, the
    CUDA context and NCCL's buffers: ``kept``)."""
    runtime: str = "megatron"
    """The training runtime whose allocations the memory follows: megatron or torchtitan."""
    overlap_grad_reduce: bool = False
    """Gradients reduced during the backward, bucket by bucket (Megatron's --overlap-grad-reduce)."""
    overlap_param_gather: bool = False
    """Parameters all-gathered during the next forward (Megatron's --overlap-param-gather)."""
    tp_comm_overlap: bool = False
    """Hide each tensor-parallel collective behind the product beside it (Megatron's --tp-comm-overlap,
    torchtitan's AsyncTP)."""
    compile: bool = True
    """Memory-bound kernels fused (torch.compile, or Megatron-LM's fused kernels); off: torchtitan's Llama blocks in
    eager PyTorch, each elementwise op a kernel of its own (``costmodel.eager``)."""
    dispatcher: str = "alltoall"
    """Expert all-to-all: alltoall (a copy per expert) or flex (DeepEP: a copy per node, then NVLink)."""
    a2a_link: str | None = None
    """Link of every byte of the experts' all-to-all: nvlink or network (None: the copies within the node over
    NVLink, the others over the network)."""
    link: str = "nvlink"
    """Link between stages: nvlink or network."""
    efficiency: float | None = None
    """Time FLOPs at this share of the GPU's BF16 peak (None: the kernel model)."""
    flash_attention: bool = True
    """Flash attention, which keeps no s x s attention probabilities."""
    method: str = "formula"
    """formula (the closed form: fused kernels) or count (torch on transformers' eager modules: an upper bound)."""
    calibration: str | Path | InstanceOf[Calibration] | None = None
    """Multipliers on the cost model's terms: a calibrate file, a shipped fit's name, auto (the GPU's and
    runtime's shipped fit) or none."""

    def __init__(self, /, **data: Any) -> None:
        for name, value in data.items():  # each knob's own rule first, in its words
            if name in RULES:
                RULES[name](name, value)
        data = {name: sized(name, value) for name, value in data.items()}
        if data.get("calibration") == STATED:
            data["calibration"] = None
        super().__init__(**data)
        if not self.compile and self.runtime != "torchtitan":
            raise InputError(f"compile = False: runtime = {self.runtime!r} runs fused kernels (eager is torchtitan's)")
        if self.dtype == "fp8" and self.device.fp8_flops is None:
            raise InputError(f"dtype = 'fp8': the {self.device.name} has no FP8 tensor cores")

    @property
    def device(self) -> Gpu:
        """The GPU's figures, its interference factors times the calibration's ``interference``."""
        gpu = self.gpu if isinstance(self.gpu, Gpu) else get_gpu(self.gpu)
        return interfered(gpu, self.calibrated.scale("interference"))

    @property
    def calibrated(self) -> Calibration:
        """The multipliers ``calibration`` names, ``auto`` the shipped fit of the GPU and runtime (every one 1
        without one)."""
        return load_calibration(resolved(self.calibration, self.gpu, self.runtime))

    @property
    def gpu_name(self) -> str:
        """The GPU as a model's setting names it: the preset's name, or a ``Gpu``'s own."""
        return self.gpu.lower() if isinstance(self.gpu, str) else self.gpu.name

    @property
    def zero_stage(self) -> Zero:
        """``zero`` as the stage it is (its rule admits 0, 1 and 3 alone)."""
        return cast(Zero, self.zero)

    @property
    def dispatcher_kind(self) -> Dispatcher:
        """``dispatcher`` as the kind it is (its rule admits ``moe.DISPATCHERS`` alone)."""
        return cast(Dispatcher, self.dispatcher)

    @property
    def replicas(self) -> int:
        """Replicas the gradients are synchronised over: dp x cp."""
        return self.dp * self.cp

    @property
    def memory(self) -> int:
        """Bytes per device: the setup's, else its GPU preset's."""
        if isinstance(self.gpu, Gpu):
            return self.device_memory if self.device_memory is not None else self.gpu.memory_bytes
        return device_memory(self.gpu, self.device_memory)

    @property
    def kept(self) -> int:
        """Bytes per device outside the model's tensors: ``reserve`` where given, else the CUDA context and NCCL's
        buffers of the setup's communicators (``runtime_memory.outside_allocator``)."""
        if self.reserve is not None:
            return self.reserve
        return outside_allocator((self.tp, self.cp, self.dp, self.pp, self.ep))

    def replace(self, **changes: Any) -> Self:
        """This setup with ``changes``, checked as a new one is."""
        return type(self)(**{**{name: getattr(self, name) for name in self.model_fields_set}, **changes})

    def changed(self, fields: tuple[str, ...] = ()) -> dict[str, Any]:
        """The fields (``fields``: those alone, in that order) that differ from their defaults, and those without
        one, by name."""
        names = fields or tuple(type(self).model_fields)
        known = type(self).model_fields
        return {name: getattr(self, name) for name in names
                if known[name].is_required() or getattr(self, name) != known[name].default}

    def arguments(self, fields: tuple[str, ...], always: tuple[str, ...] = ()) -> list[str]:
        """The command line options of ``fields``, in that order, that differ from their defaults (and those of
        ``always``, and those without a default): ``--seq-len 8192``, ``--flag`` or ``--no-flag``, sizes in GiB."""
        words = []
        for name in fields:
            value = getattr(self, name)
            if (value is None and name != "calibration") or name not in always and name not in self.changed((name,)):
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else flag.replace("--", "--no-", 1))
            else:
                words += [flag, _shown(name, value)]
        return words

    def command(self) -> str:
        """The one ``zbsolve predict`` line that reproduces this setup (the split and order predict's defaults); an
        ``InputError`` naming a field predict needs and the setup lacks, or one it sets that predict does not take."""
        for name in ("config", "global_batch", "gpus"):
            if getattr(self, name) is None:
                raise InputError(f"{name} = None: zbsolve predict needs it to reproduce the setup")
        for name, value in self.changed().items():
            if name not in (*PREDICT_OPTIONS, "config"):
                why = " (it derives dp from the GPUs)" if name == "dp" else ""
                raise InputError(f"{name} = {value!r}: zbsolve predict takes no such option{why}")
        differ = tuple(name for name, default in PREDICT_DEFAULTS.items() if getattr(self, name) != default)
        return shlex.join(["zbsolve", "predict", str(self.config), *self.arguments(PREDICT_OPTIONS, differ)])

    def setting(self, experts: bool) -> Setting:
        """The setting a model estimated under this setup records (``Model.setting``); ``experts``: whether the
        model has experts (its ep and dispatcher are recorded)."""
        return Setting(seq_len=self.seq_len, microbatch_size=self.microbatch_size, tp=self.tp, dp=self.dp,
                       cp=self.cp if self.cp > 1 else None, ep=self.ep if experts else None,
                       dispatcher=self.dispatcher_kind if experts else None, zero=self.zero_stage, dtype=self.dtype,
                       gpu=self.gpu_name, efficiency=self.efficiency)


def sized(name: str, value: Any, where: str | None = None) -> Any:
    """``value`` of field ``name`` as the setup holds it: a size (``SIZES``, bytes or text such as "80GiB") read as
    bytes (``units.parse_bytes``, its error naming ``where``, default the field), any other value as it is."""
    if name not in SIZES or value is None:
        return value
    return parse_bytes(value, where or name, zero=name == "reserve")


def _shown(name: str, value: object) -> str:
    """A value as its option takes it: sizes in whole GiB or MiB where they are, other numbers as %g."""
    if name in SIZES and isinstance(value, int) and value:
        unit = next((u for u in (GIB, MIB) if value % u == 0), None)
        return str(value) if unit is None else f"{value // unit}{'GiB' if unit == GIB else 'MiB'}"
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:  # the one field whose option takes a word for None
        return STATED
    return value.name if isinstance(value, Gpu) else str(value)


def _count(name: str, value: object) -> None:
    check_count(name, value)


def _optional_count(name: str, value: object) -> None:
    if value is not None:
        check_count(name, value)


def _zero(name: str, value: object) -> None:
    if value not in (0, 1, 3) or isinstance(value, bool):
        raise InputError(f"{name} = {value!r}: should be 0, 1 or 3")


def _gpu(name: str, value: object) -> None:
    if not isinstance(value, Gpu):
        get_gpu(value)  # type: ignore[arg-type]


def _efficiency(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
        raise InputError(f"{name} = {value!r}: should be a number in (0, 1], or None for the kernel model")


def _calibration(name: str, value: object) -> None:
    if value is not None and not isinstance(value, (str, Path, Calibration)):
        raise InputError(f"{name} = {value!r}: should be a calibration file, a shipped one's name, {AUTO}, {STATED} "
                         "or a Calibration")
    if value not in (AUTO, STATED):
        load_calibration(value, name)


def _one_of(choices: tuple[str, ...], optional: bool = False) -> Callable[[str, object], None]:
    def rule(name: str, value: object) -> None:
        if not (optional and value is None) and value not in choices:
            raise InputError(f"{name} = {value!r}: should be one of {', '.join(choices)}")
    return rule


SIZES = ("device_memory", "reserve")
"""The fields in bytes, which options give as sizes (80GiB)."""
RULES: dict[str, Callable[[str, object], None]] = {
    "gpu": _gpu, "seq_len": _count, "microbatch_size": _count, "global_batch": _optional_count,
    "gpus": _optional_count, "tp": _count, "pp": _count, "vp": _count, "dp": _count, "cp": _count, "ep": _count,
    "zero": _zero, "efficiency": _efficiency, "link": _one_of(LINKS), "a2a_link": _one_of(LINKS, optional=True),
    "dispatcher": _one_of(DISPATCHERS), "runtime": _one_of(RUNTIMES), "dtype": _one_of(tuple(DTYPE_BYTES)),
    "calibration": _calibration}
"""Each field's rule where its type says too little, by field (the method is the estimate's: ``estimate.METHODS``):
an ``InputError`` naming the field and the value."""


@functools.lru_cache(maxsize=64)
def interfered(gpu: Gpu, factor: float) -> Gpu:
    """``gpu`` with its interference factors times ``factor`` (itself at 1)."""
    if factor == 1:
        return gpu
    return dataclasses.replace(gpu, compute_interference=gpu.compute_interference * factor,
                               collective_interference=gpu.collective_interference * factor)
