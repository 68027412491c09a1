"""Measure a Profile from a real model: per-stage F, B, W times and memory deltas, and the point-to-point latency.

B and W follow torch.distributed.pipelining's split (``torch_compat.backward_input`` and ``backward_weight``): B is
the gradient with respect to the stage input with the graph retained, W the weight gradients afterwards. The first
stage is measured as torch's runtime runs it: its B does nothing (there is no input gradient to send) and its W runs
the whole backward, so its t_b is the measured time of that no-op, tiny but positive as a Profile needs.

Two memory models (``MEMORY_MODELS``): "torch", the measured deltas of torch's split backward, whose B keeps for W
every node of the graph below the last weight-gradient op and so frees almost nothing (what the loss and the ops after
the last weight saved); "paper", the Zero Bubble paper's runtime, where B frees every saved activation except those W
reads (``ReadBytes``): M_B = the saved bytes F leaves, M_W = the saved bytes torch's W reads, mem_b = M_W - M_B,
mem_w = -M_W. "paper" counts saved bytes on every device.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import queue
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch import nn

from zbsolve.base.errors import InputError, ZbsolveError
from zbsolve.base.files import write_atomic
from zbsolve.core import torch_compat
from zbsolve.core.profile import STAGE_FIELDS, Profile, paper_deltas
from zbsolve.execute.memory import Saved, SavedBytes
from zbsolve.execute.modules import ModelSpec, StagedModel

Batches = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
"""A batch maker: (batch_size, seed) -> (inputs, target)."""
DEVICES = ("cpu", "cuda")
"""Where ``measure`` runs the stages."""
MEMORY_MODELS = ("torch", "paper")
"""What B frees: "torch", the measured deltas of torch's split backward (B frees almost nothing); "paper", every
saved activation W does not read (the Zero Bubble paper's runtime)."""


@dataclass(frozen=True)
class ProfileOptions:
    """How ``measure`` measures a model's stages."""

    microbatch_size: int = 1
    """Samples in the one microbatch every stage runs."""
    repeats: int = 10
    """Measurements of each figure (the profile keeps their medians)."""
    warmup: int = 2
    """Untimed runs before the timed ones."""
    latency: bool = True
    """Also measure the point-to-point latency (t_comm) of the largest activation between stages."""
    device: str = "cpu"
    """"cpu" or "cuda" (or "cuda:N")."""
    threads: int = 1
    """CPU threads torch runs meanwhile (1, as each rank of ``zbsolve run`` does)."""
    seed: int = 0
    """Seed of the microbatch and of the output gradients."""
    memory_model: str = "torch"
    """One of ``MEMORY_MODELS``: what the memory deltas describe."""

    def __post_init__(self) -> None:
        if self.microbatch_size < 1 or self.repeats < 1 or self.threads < 1 or self.warmup < 0:
            raise InputError(f"microbatch_size = {self.microbatch_size}, repeats = {self.repeats} and threads = "
                             f"{self.threads} must be >= 1, warmup = {self.warmup} >= 0")
        if self.device.partition(":")[0] not in DEVICES:
            raise InputError(f"device = {self.device!r} must be cpu or cuda")
        if self.memory_model not in MEMORY_MODELS:
            raise InputError(f"memory_model = {self.memory_model!r} must be one of {', '.join(MEMORY_MODELS)}")


@dataclass(frozen=True)
class Measurement:
    """Repeated measurements of every stage and the latency, and the Profile of their medians."""

    samples: dict[str, list[list[float]]]
    """Per Profile field (t_f ... mem_w), per stage, the measured values (µs, bytes)."""
    latency: list[float]
    """One-way point-to-point latency samples in µs (empty when not measured)."""

    @property
    def profile(self) -> Profile:
        """Medians; mem_w is set to -(mem_f + mem_b) so each stage's deltas sum to exactly 0."""
        med = {name: [statistics.median(v) for v in per_stage] for name, per_stage in self.samples.items()}
        med["mem_w"] = [paper_deltas(f, f + b)[2] for f, b in zip(med["mem_f"], med["mem_b"])]
        t_comm = round(statistics.median(self.latency), 3) if self.latency else 0.0
        fields = {name: [round(x, 3) if name.startswith("t_") else x for x in med[name]] for name in STAGE_FIELDS}
        return Profile.model_validate({**fields, "t_comm": t_comm})

    def noise(self) -> dict[str, list[float]]:
        """Interquartile range over |median| per field and stage (0 for a single sample or a zero median);
        ``t_comm`` holds one value."""
        out = {name: [relative_iqr(v) for v in per_stage] for name, per_stage in self.samples.items()}
        if self.latency:
            out["t_comm"] = [relative_iqr(self.latency)]
        return out


def relative_iqr(values: list[float]) -> float:
    """Interquartile range of ``values`` relative to the absolute median."""
    if len(values) < 2 or statistics.median(values) == 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / abs(statistics.median(values))


class ReadBytes(SavedBytes):
    """``SavedBytes`` that also records, pass by pass, the counted storages backward reads."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__(exclude)
        self.reads: list[dict[int, int]] = [{}]
        """Per pass (one entry per ``next_pass``, the last one current): the storages read, with their bytes."""

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Context in which the tensors autograd saves are counted, and their reads recorded."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def next_pass(self) -> int:
        """Start recording the next pass's reads; returns the bytes counted now."""
        self.reads.append({})
        return self.current

    def _unpack(self, saved: Saved | torch.Tensor) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        self.reads[-1][saved.key] = saved.tensor.untyped_storage().nbytes()
        return saved.tensor


def run_passes(stage: nn.Module, x: torch.Tensor, tail: torch.Tensor, loss_fn: Callable | None,
               mark: Callable[[], None], saved: SavedBytes | None = None, *, split: bool) -> None:
    """F, B and W of ``stage`` on input ``x``; ``tail`` is the output gradient, or the target when ``loss_fn``
    is given (last stage). ``mark()`` runs after each pass, with the pass's transient tensors dropped. ``split``:
    B is the input gradient and W the weight gradients (torch's split backward); otherwise B does nothing and W
    runs the whole backward, as torch's runtime does for the first stage."""
    params = [p for p in stage.parameters() if p.requires_grad]
    x = x.detach().requires_grad_(split)
    with saved.hooks() if saved else contextlib.nullcontext():
        out = stage(x)
        outputs = [loss_fn(out, tail) if loss_fn else out]
        del out
    mark()
    grads = None if loss_fn else [tail]
    groups = []
    if split:
        groups = torch_compat.backward_input(outputs, grads, [x], params)
        outputs.clear()
        x.grad = None
    mark()
    if split:
        torch_compat.backward_weight(params, groups)
    else:
        torch.autograd.backward(outputs, grads)
    del groups, outputs
    mark()


def measure_stage(stage: nn.Module, x: torch.Tensor, tail: torch.Tensor, loss_fn: Callable | None, *, split: bool,
                  repeats: int, warmup: int, memory_model: str = "torch") -> dict[str, list[float]]:
    """``repeats`` timed runs of F, B, W (``run_passes``) after ``warmup`` untimed ones, then ``repeats`` memory
    runs; returns samples per Profile field (µs, bytes). Memory, "torch" model: CUDA allocator differences (the
    stage output counts until B), on CPU the bytes autograd saves for backward; mem_w holds the measured W delta.
    "paper" model: the saved bytes on every device, with mem_b = M_W - M_B (``MEMORY_MODELS``)."""
    cuda = x.device.type == "cuda"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter() * 1e6

    samples: dict[str, list[float]] = {name: [] for name in STAGE_FIELDS}
    for i in range(warmup + repeats):
        deltas = pass_deltas(stage, x, tail, loss_fn, now, split=split)
        for name, value in zip(("t_f", "t_b", "t_w"), deltas if i >= warmup else ()):
            samples[name].append(value)
    for _ in range(repeats):
        saved = None if cuda and memory_model == "torch" else ReadBytes([*stage.parameters(), *stage.buffers()])
        probe = functools.partial(torch.cuda.memory_allocated, x.device) if saved is None else saved.next_pass
        mem_f, mem_b, mem_w = pass_deltas(stage, x, tail, loss_fn, probe, saved, split=split)
        if saved is not None and memory_model == "paper":
            m_w = float(sum(saved.reads[3].values()))  # reads[1], [2], [3]: F, B, W (probed before each)
            _, mem_b, mem_w = paper_deltas(mem_f, m_w)
        for name, value in zip(("mem_f", "mem_b", "mem_w"), (mem_f, mem_b, mem_w)):
            samples[name].append(value)
    return samples


def pass_deltas(stage: nn.Module, x: torch.Tensor, tail: torch.Tensor, loss_fn: Callable | None,
                probe: Callable[[], float], saved: SavedBytes | None = None, *, split: bool) -> list[float]:
    """How much ``probe()`` changes over each of F, B and W (``run_passes``'s arguments)."""
    levels = [float(probe())]
    run_passes(stage, x, tail, loss_fn, lambda: levels.append(float(probe())), saved, split=split)
    return [after - before for before, after in itertools.pairwise(levels)]


def chain_inputs(modules: Sequence[nn.Module], make_batch: Batches, microbatch_size: int, device: torch.device,
                 seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``modules`` run one after the other on one microbatch: the inputs along the chain (the batch, then each
    module's output, the last one's included), and each module's tail: a random output gradient, or the target for
    the last module."""
    inputs, target = make_batch(microbatch_size, seed)
    xs = [inputs.to(device)]
    with torch.no_grad():
        for module in modules:
            xs.append(module(xs[-1]))
    gen = torch.Generator().manual_seed(seed)
    tails = [torch.randn(x.shape, generator=gen).to(device, x.dtype) for x in xs[1:-1]]
    return xs, tails + [target.to(device)]


def measure_chain(modules: Sequence[nn.Module], make_batch: Batches, loss_fn: Callable, options: ProfileOptions, *,
                  split_first: bool) -> tuple[list[dict[str, list[float]]], list[torch.Tensor], list[float]]:
    """Measure each of ``modules`` as ``chain_inputs`` runs them, the last one's output into ``loss_fn``: per module
    its samples (``measure_stage``), the chain's inputs and outputs, and (``options.latency``, more than one module)
    the one-way latency samples of the largest output passed on. A module splits its backward (``run_passes``)
    when its input is floating point, the first module only if ``split_first``."""
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device = {options.device!r} but CUDA is not available")
    dev = torch.device(options.device)
    modules = [module.to(dev) for module in modules]
    previous = torch.get_num_threads()
    torch.set_num_threads(options.threads if dev.type == "cpu" else previous)
    try:
        xs, tails = chain_inputs(modules, make_batch, options.microbatch_size, dev, options.seed)
        samples = [measure_stage(module, x, tail, loss_fn if i == len(modules) - 1 else None,
                                 split=(i > 0 or split_first) and x.is_floating_point(), repeats=options.repeats,
                                 warmup=options.warmup, memory_model=options.memory_model)
                   for i, (module, x, tail) in enumerate(zip(modules, xs, tails))]
    finally:
        torch.set_num_threads(previous)
    sent = max(xs[1:-1], key=lambda t: t.nbytes, default=None)
    lat = measure_latency(sent.numel(), sent.dtype, repeats=options.repeats) \
        if options.latency and sent is not None else []
    return samples, xs, lat


def measure(model: StagedModel, options: ProfileOptions = ProfileOptions()) -> Measurement:
    """Measure every stage of ``model`` on one microbatch, the first as torch's runtime runs it (B a no-op, W the
    whole backward), and (``options.latency``, more than one stage) the one-way latency of the largest activation
    passed between stages."""
    per_stage, _, lat = measure_chain(model.stages, model.make_batch, model.loss_fn, options, split_first=False)
    return Measurement({name: [m[name] for m in per_stage] for name in STAGE_FIELDS}, lat)


def measure_latency(numel: int, dtype: torch.dtype = torch.float32, *, repeats: int = 10, rounds: int = 20,
                    timeout: float = 120.0) -> list[float]:
    """One-way latency in µs of a ``numel``-element tensor between two gloo processes on this host: ``repeats``
    samples, each the mean over ``rounds`` round trips, halved."""
    if numel < 1 or repeats < 1 or rounds < 1:
        raise InputError(f"numel = {numel}, repeats = {repeats} and rounds = {rounds} must be >= 1")
    ctx = multiprocessing.get_context("spawn")
    answers = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_ping_pong, args=(rank, f"file://{tmp}/rendezvous", numel, dtype, repeats,
                                                      rounds, timeout, answers), daemon=True) for rank in (0, 1)]
        for p in procs:
            p.start()
        try:
            answer = answers.get(timeout=timeout)
        except queue.Empty:
            answer = f"no answer within {timeout:g} s"
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.terminate()
                    p.join()
    if isinstance(answer, str):
        raise ZbsolveError(f"latency measurement with 2 gloo processes failed: {answer}")
    return answer


def _ping_pong(rank: int, init_method: str, numel: int, dtype: torch.dtype, repeats: int, rounds: int,
               timeout: float, answers: multiprocessing.Queue) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2,
                                timeout=timedelta(seconds=timeout))
        buf = torch.zeros(numel, dtype=dtype)
        peer = 1 - rank

        def round_trips(n: int) -> None:
            for _ in range(n):
                if rank == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)

        round_trips(2)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            round_trips(rounds)
            samples.append((time.perf_counter() - start) * 1e6 / rounds / 2)
        dist.destroy_process_group()
        if rank == 0:
            answers.put(samples)
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        answers.put(f"rank {rank}: {type(exc).__name__}: {exc}")


def profile_header(spec: ModelSpec, num_stages: int | None, options: ProfileOptions) -> str:
    """One line saying what was measured and how (``num_stages`` None: per layer): the profile file's first
    comment."""
    return (f"zbsolve profile of {spec.name}: {'per layer' if num_stages is None else f'{num_stages} stages'}, "
            f"microbatch size {options.microbatch_size}, {options.repeats} repeats after {options.warmup} warm-up, "
            f"device {options.device}" + (f", {options.threads} threads" if options.device == "cpu" else "")
            + f", torch {torch.__version__}, memory model {options.memory_model}")


def write_profile(measurement: Measurement, path: Path, header: str) -> Profile:
    """Write the measured Profile to ``path``, whole or not at all: YAML with the Profile's fields at the top level
    (loadable by Profile.load, pastable under a problem's ``profile:``) and the noise in comments; JSON without
    them."""
    profile = measurement.profile
    if path.suffix not in (".yaml", ".yml"):
        profile.save(path)
        return profile
    lines = [f"# {header}", "# times in microseconds, memory in bytes",
             "# noise (interquartile range / median) per stage:"]
    lines += [f"#   {name}: " + " ".join(f"{v:.3f}" for v in values) for name, values in measurement.noise().items()]
    write_atomic(path, "\n".join(lines) + "\n" + yaml.safe_dump(profile.model_dump(), sort_keys=False))
    return profile


NOISE_COLUMNS = ("stage", *(f"{name} ({'µs' if name.startswith('t_') else 'B'})" for name in STAGE_FIELDS))
"""Columns of ``noise_table``."""


def noise_table(measurement: Measurement) -> list[list[str]]:
    """The Profile's figures per stage with their noise (interquartile range / median) in percent, as strings
    under ``NOISE_COLUMNS``."""
    profile, noise = measurement.profile, measurement.noise()
    return [[str(s), *(f"{profile.stage_value(name, s):,.{1 if name.startswith('t_') else 0}f} "
                       f"±{100 * noise[name][s]:.0f}%" for name in STAGE_FIELDS)]
            for s in range(profile.num_stages or 1)]


def latency_line(measurement: Measurement) -> str | None:
    """The measured one-way latency with its noise (None when not measured)."""
    if not measurement.latency:
        return None
    return f"t_comm (one-way) = {measurement.profile.t_comm:,.1f} µs ±{100 * measurement.noise()['t_comm'][0]:.0f}%"
