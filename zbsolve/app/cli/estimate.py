"""zbsolve estimate: a model's per-layer costs from its Hugging Face config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import JSON, QUIET, app, cli_errors, out, output_option
from zbsolve.app.cli.options import setup_options
from zbsolve.base.files import check_output
from zbsolve.base.units import mib
from zbsolve.costmodel.model import Model
from zbsolve.costmodel.setup import Setup
from zbsolve.present.tables import text_table

FIELDS = ("gpu", "seq_len", "microbatch_size", "tp", "dp", "zero", "cp", "dtype", "efficiency", "flash_attention",
          "link", "ep", "dispatcher", "a2a_link", "tp_comm_overlap", "method", "calibration")
"""The setup's fields ``zbsolve estimate`` takes as options, in the order its model's source writes them."""
EXPERTS = ("ep", "dispatcher", "a2a_link")
"""The fields the source writes for a model with experts alone."""
ALWAYS = ("gpu", "tp", "dp", "zero", "dtype", "flash_attention", "link", "ep", "method")
"""The fields the source writes even at their defaults."""


@app.command()
@cli_errors
@setup_options(Setup, FIELDS)
def estimate(
    config: Path = typer.Argument(..., metavar="CONFIG",
                                  help="Hugging Face config.json of a dense decoder (Llama, Mistral, Qwen2, GPT-2, "
                                       "GPT-NeoX) or a mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, "
                                       "DeepSeek-V2/V3)."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                       help="Model name (default: the config file's name)."),
    output: Path = output_option(..., "Model description to write (.yaml or .json).", metavar="FILE"),
    as_json: bool = JSON, quiet: bool = QUIET,
    knobs: dict[str, Any] = {},  # noqa: B006 (set by setup_options)
) -> None:
    """Estimate a model's per-layer costs from its config (docs/cost-model.md) and write the model description;
    FLOPs and activation bytes from the closed form, or with --method count counted by torch on the transformers model.

    Example: zbsolve estimate problems/models/configs/llama3-8b.json --gpu h100 --seq-len 8192 -b 1 -o llama3-8b.yaml
    """
    from zbsolve.costmodel.estimate import estimate as estimate_model
    from zbsolve.costmodel.hf_config import architecture
    from zbsolve.costmodel.notes import flops_note

    check_output(output, "--output", [config])
    setup = Setup(**knobs)
    model = estimate_model(config, setup, name=name, source=_source(config, setup, name, output,
                                                                     architecture(config).experts is not None))
    model.save(output)
    note = flops_note(model, config, setup.flash_attention)
    if quiet:
        return
    if as_json:
        print(json.dumps({"model": model.model_dump(exclude_none=True), "flops_per_token": model.flops_per_token(),
                          "method": setup.method, "note": note}, indent=1))
        return
    _print(model, setup, note, output)


def _source(config: Path, setup: Setup, name: Optional[str], output: Path, experts: bool) -> str:
    """The command line that writes this model (its ``source``): the setup's options (``FIELDS``: those of
    ``ALWAYS`` and those off their defaults; ``EXPERTS`` for a model with experts alone), its name, its file."""
    fields = FIELDS if experts else tuple(f for f in FIELDS if f not in EXPERTS)
    return " ".join(["zbsolve", "estimate", str(config), *setup.arguments(fields, ALWAYS),
                     *(["--name", name] if name else []), "-o", str(output)])


def _print(model: Model, setup: Setup, note: str, output: Path) -> None:
    """The table of the model's layers, under a title of its setting, and the notes on how it was counted."""
    from zbsolve.costmodel.notes import method_note
    from zbsolve.present.layers import LAYER_HEADERS, layer_rows

    s, link = model.setting, model.link
    assert s is not None and link is not None  # an estimate records both
    title = (f"{escape(model.name)}: {s.gpu}, seq_len {s.seq_len}, microbatch {s.microbatch_size}, tp {s.tp}, "
             + (f"ep {s.ep}, " if s.ep is not None else "")
             + f"dp {s.dp}, zero {s.zero}, {s.dtype}, "
             + (f"efficiency {s.efficiency:g}" if s.efficiency is not None else "kernel model")
             + "; per device, one microbatch")
    block = next(layer for layer in model.layers if layer.block)
    comm = (f"t_comm after a block: {1e3 * link.time(block.out_bytes):.3f} ms ({mib(block.out_bytes):.1f} "
            f"MiB over {link.name})")
    exchange = next((layer.comm_f for layer in model.layers if layer.comm_f is not None), None)
    if exchange is not None:
        where = (f"over {setup.a2a_link}" if setup.a2a_link
                 else "within the node over NVLink, across nodes over the network")
        comm += (f"; all-to-all of a block with experts: {1e3 * exchange:.3f} ms in F and in B (2 of ep {setup.ep}, "
                 f"{where}, {setup.dispatcher} dispatcher, in t_f and t_b)")
    out.print(text_table(LAYER_HEADERS, layer_rows(model), title), highlight=False)
    for line in (method_note(setup.method), comm, note, f"wrote {output}"):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
