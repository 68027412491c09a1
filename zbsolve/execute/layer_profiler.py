"""Measure a model's per-layer costs, the ``zbsolve.costmodel.model.Model`` that ``zbsolve profile --per-layer`` writes.

Each layer runs alone on one microbatch, on the previous layer's output as a fresh leaf; the last layer (the head)
takes the loss. F, B and W are timed and their memory counted as ``profiler.measure_stage`` does for a stage, with
the same split and the same memory models. A layer whose input is not differentiable (token ids) has no input
gradient: its B is a no-op (t_b is the measured time of that no-op) and its W runs its whole backward.

A layer's costs cannot depend on the stage it lands in, so one difference from a per-stage profile remains: torch's
runtime defers the whole backward of the first stage to W, while the layers of a first stage after the embedding
keep their B. Summed over a partition, the layers give the per-stage F, B + W and mem_f; B, W and, under "paper",
mem_b of the first stage split differently.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from zbsolve.costmodel.model import Layer, Model, Setting
from zbsolve.execute.modules import LayeredModel, NamedLayer
from zbsolve.execute.profiler import ProfileOptions, measure_chain

STATE_COPIES = 4
"""Static bytes per byte of weights: the weights, their gradients and Adam's two moments, each as large as the
weights (fp32 training without a separate master copy)."""
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
"""Setting.dtype of a parameter type."""


def static_bytes(module: nn.Module) -> int:
    """Bytes ``module`` holds for the whole step: ``STATE_COPIES`` times the bytes of its parameters."""
    return STATE_COPIES * sum(p.nbytes for p in module.parameters())


def profile_layers(model: LayeredModel, options: ProfileOptions, *, name: str = "model", source: str = "",
                   seq_len: int | None = None) -> Model:
    """Measure every layer of ``model`` on one microbatch and describe it as a ``Model`` named ``name``, made by
    ``source``: per layer the medians of ``options.repeats`` measurements in seconds and bytes, mem_w set to
    -(mem_f + mem_b) so the deltas sum to exactly 0; t_comm the median one-way latency of the largest output a
    layer passes on (``options.latency``, more than one layer); a setting when ``seq_len`` is known."""
    modules = [layer.module for layer in model.layers]
    samples, xs, latency = measure_chain(modules, model.make_batch, model.loss_fn, options, split_first=True)
    layers = [_layer(layer, s, out) for layer, s, out in zip(model.layers, samples, xs[1:])]
    dtype = next((p.dtype for m in modules for p in m.parameters()), xs[-1].dtype)
    setting = None if seq_len is None else Setting(
        seq_len=seq_len, microbatch_size=options.microbatch_size,
        dtype=DTYPES.get(dtype, str(dtype).removeprefix("torch.")),
        gpu=torch.cuda.get_device_name(xs[0].device) if xs[0].is_cuda else None)
    return Model(name=name, source=source, t_comm=1e-6 * statistics.median(latency) if latency else None,
                 setting=setting, layers=layers)


def _layer(layer: NamedLayer, samples: dict[str, list[float]], out: torch.Tensor) -> Layer:
    """The layer's medians (µs and bytes measured) in seconds and whole bytes."""
    med = {key: statistics.median(values) for key, values in samples.items()}
    mem_f, mem_b = round(med["mem_f"]), round(med["mem_b"])
    return Layer(name=layer.name, block=layer.block, t_f=1e-6 * med["t_f"], t_b=1e-6 * med["t_b"],
                 t_w=1e-6 * med["t_w"], mem_f=mem_f, mem_b=mem_b, mem_w=-(mem_f + mem_b),
                 static_bytes=static_bytes(layer.module), out_bytes=out.nbytes)
