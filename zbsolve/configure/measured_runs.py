"""Measured runs in ``problems/calibration/``'s schema (its README): each file read as the ``predict``
configuration it ran and the figures it measured, the step time and, where published, the peak memory per device.

A file that ``predict`` cannot take (no config the estimate reads, a recomputation or an order it does not model)
maps to the reason instead. A config path is read as given, else beside the file, else under the repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.configure.predict import Configuration
from zbsolve.costmodel.gpus import get_gpu
from zbsolve.costmodel.model import OP_POLICY, RECOMPUTE_MODULES
from zbsolve.schedulers.builtins import COMBINED, megatron_builtin

ROOT = Path(__file__).resolve().parents[2]
"""The repository, under which the published runs name their configs (``problems/models/configs/``)."""
GPUS = {"h100-sxm-80gb": "h100", "h100-hbm2e-96gb-500w": "h100", "h200-sxm-141gb": "h200"}
"""The preset each calibration GPU is predicted with."""
SUBSTITUTES = {"h100-hbm2e-96gb-500w": "no preset for the H100 96 GB HBM2e at 500 W: the h100 (SXM 80 GB, 700 W) "
                                       "preset's peaks, with the 96 GB part's memory"}
"""What a preset stands in for where it is not the run's GPU."""
MEMORY = {"h100-hbm2e-96gb-500w": 96 * GIB - (80 * GIB - get_gpu("h100").memory_bytes)}
"""The memory of a run's GPU where its preset stands in with another: the 96 GB part's six 16 GiB HBM2e stacks
(the 80 GB part's five stacks are its 80 GiB), less what the 80 GB part's NVML total leaves out of its 80 GiB
(``problems/measured/h100/nvidia-smi.csv``: 81,559 MiB)."""
SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "interleaved-1f1b-combined": COMBINED}
"""predict's order for each calibration schedule name (``none (...)``: no pipeline, predict's default)."""


@dataclass(frozen=True)
class Mapped:
    """A calibration file as ``zbsolve predict`` takes it."""

    configuration: Configuration | None
    """The configuration (None: ``reason``); its config path as the file writes it."""
    reason: str | None
    """Why the file has no configuration."""
    notes: tuple[str, ...] = ()
    """What the configuration assumes where the file leaves it open or predict has no flag for it."""


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run, as a calibration fits it."""

    name: str
    """The file's ``name``."""
    configuration: Configuration
    """What it ran, its config path resolved."""
    step_time_s: float
    """Measured seconds of a step (published, or global batch x sequence / tokens/s/GPU / GPUs)."""
    peak_memory_gib: float | None
    """Published peak memory per device, GiB (None: not published)."""
    group: str
    """The GPU preset and runtime it ran on (``h100-megatron``): which shipped calibration it belongs to."""
    held_back: bool = False
    """Marked held back: never fitted to."""
    scored: bool = True
    """False for a record kept only for traceability: never fitted to."""


def recompute_choice(recompute: dict) -> str | InputError:
    """The recomputation of a file in ``problem.recompute``'s grammar, or why it has none."""
    granularity, modules, method = recompute["granularity"], recompute.get("modules"), recompute.get("method")
    if granularity == "none":
        return "none"
    if granularity == "full":
        if method == "block":
            return f"uniform:{recompute['num_layers']}"
        return "full"
    if granularity == "selective" and method == OP_POLICY:
        return OP_POLICY
    if granularity == "selective" and modules:
        unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
        if unknown:
            return InputError(f"recompute module {unknown[0]!r} is not one of Megatron-LM's that zbsolve models")
        return "modules:" + ",".join(modules)
    if granularity == "selective":
        return InputError(f"recompute: {method or 'a selective policy without modules'} has no form in "
                          "problem/recompute.py (its selective forms are Megatron's norms and activation and "
                          f"torchtitan's per-op policy, method {OP_POLICY})")
    return InputError("recompute granularity not published (unknown)")


def runtime(run: dict) -> str:
    """The runtime a file ran: torchtitan where its schedule or source says so, else megatron."""
    said = f"{(run.get('schedule') or {}).get('runtime', '')} {(run.get('source') or {}).get('repo', '')}"
    return "torchtitan" if "torchtitan" in said else "megatron"


def mapped(run: dict) -> Mapped:
    """The ``zbsolve predict`` configuration of calibration file ``run``, or the reason it has none."""
    if run["model"]["config"] is None:
        return Mapped(None, "no config zbsolve's estimate reads (model.config: null)")
    recompute = recompute_choice(run["recompute"])
    if isinstance(recompute, InputError):
        return Mapped(None, str(recompute))
    par, batch, schedule = run["parallelism"], run["batch"], run.get("schedule") or {}
    overlap, optimizer = run.get("overlap") or {}, run.get("optimizer") or {}
    hardware = run["hardware"]
    if hardware["gpu"] not in GPUS:
        return Mapped(None, f"hardware.gpu {hardware['gpu']!r} is not one of {', '.join(GPUS)}")
    notes = [SUBSTITUTES[hardware["gpu"]]] if hardware["gpu"] in SUBSTITUTES else []
    name = schedule.get("name") or "none"
    if name not in SCHEDULES and not name.startswith("none"):
        return Mapped(None, f"schedule {name!r} is not one predict runs")
    zero = 3 if optimizer.get("fsdp") else optimizer.get("zero")
    if zero is None:
        zero = 1
        notes.append("optimizer not published: zero 1 (the distributed optimizer)")
    flags: dict[str, bool] = {}
    for key in ("overlap_grad_reduce", "overlap_param_gather"):
        value = overlap.get(key, optimizer.get(key))
        if value is None:
            notes.append(f"{key} not published: on")
        flags[key] = True if value is None else bool(value)
    tp_comm_overlap = bool(overlap.get("tp_comm_overlap") or overlap.get("async_tp"))
    if par["tp"] > 1 and overlap.get("tp_comm_overlap") is None and overlap.get("async_tp") is None:
        notes.append("TP communication overlap not published: off")
    dispatcher = "flex" if str((run.get("moe") or {}).get("dispatcher", "")).startswith("flex") else "alltoall"
    if overlap.get("delay_wgrad_compute"):
        notes.append("delay_wgrad_compute on in the run: predict has no flag for it")
    vp = par["vp"] or 1
    layout = schedule.get("layout")
    titan = layout is None and par["pp"] > 1 and runtime(run) == "torchtitan"
    if layout is None and par["pp"] > 1 and not titan and "split not published" in schedule.get("notes", ""):
        notes.append("pipeline split not published: uniform")
    order = SCHEDULES.get(name)
    configuration = Configuration(
        config=run["model"]["config"], gpu=GPUS[hardware["gpu"]], dtype=run["precision"]["dtype"],
        seq_len=batch["seq_len"], microbatch_size=batch["microbatch_size"], global_batch=batch["global_batch_size"],
        gpus=hardware["gpus"], tp=par["tp"], pp=par["pp"], vp=vp, cp=par["cp"], ep=par["ep"], zero=zero,
        layout=layout, partition="torchtitan" if titan else "uniform",
        schedule=None if order in (None, megatron_builtin(vp)) else order, recompute=recompute,
        tp_comm_overlap=tp_comm_overlap and par["tp"] > 1, dispatcher=dispatcher if par["ep"] > 1 else "alltoall",
        overlap_grad_reduce=flags["overlap_grad_reduce"], overlap_param_gather=flags["overlap_param_gather"],
        runtime=runtime(run), device_memory=MEMORY.get(hardware["gpu"]),
        compile=schedule.get("compile") is not False)
    return Mapped(configuration, None, tuple(notes))


def measured_step(run: dict) -> float:
    """Measured seconds of a step of file ``run``: its published step time, else derived from tokens/s/GPU."""
    measured, batch = run["measured"], run["batch"]
    if measured.get("step_time_s"):
        return float(measured["step_time_s"])
    return batch["global_batch_size"] * batch["seq_len"] / (measured["tokens_per_s_per_gpu"] * run["hardware"]["gpus"])


def read_run(path: str | Path) -> MeasuredRun:
    """The measured run of the file at ``path``; an ``InputError`` naming the file where it is not one predict
    takes."""
    path = Path(path)
    try:
        run = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise InputError(f"run {str(path)!r}: not a readable YAML file ({type(error).__name__})") from None
    try:
        m = mapped(run)
        step = measured_step(run)
        memory = (run["measured"] or {}).get("peak_memory_gib")
        name = str(run.get("name") or path.stem)
        held_back, scored = bool(run.get("held_back", False)), bool(run.get("scored", True))
    except (KeyError, TypeError, AttributeError, ZeroDivisionError) as error:
        raise InputError(f"run {str(path)!r}: not in problems/calibration/'s schema ({type(error).__name__}: "
                         f"{error})") from None
    if m.configuration is None:
        raise InputError(f"run {str(path)!r}: {m.reason}")
    config = _config_path(Path(m.configuration.config), path)
    return MeasuredRun(name, m.configuration.replace(config=config), step,
                       None if memory is None else float(memory), f"{m.configuration.gpu_name}-{runtime(run)}",
                       held_back, scored)


def _config_path(config: Path, beside: Path) -> Path:
    """``config`` as given where it is a file, else beside the run's file, else under the repository."""
    for candidate in (config, beside.parent / config, ROOT / config):
        if candidate.is_file():
            return candidate
    raise InputError(f"run {str(beside)!r}: model.config {str(config)!r} is no file (as given, beside the run, or "
                     "under the repository)")
