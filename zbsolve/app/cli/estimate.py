"""zbsolve estimate: a model's per-layer costs from its Hugging Face config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from zbsolve.app.cli.common import DISPATCHER, JSON, QUIET, TP_COMM_OVERLAP, app, cli_errors, out
from zbsolve.base.errors import InputError
from zbsolve.base.files import check_output
from zbsolve.base.units import mib
from zbsolve.present.tables import text_table


@app.command()
@cli_errors
def estimate(
    config: Path = typer.Argument(..., help="Hugging Face config.json of a dense decoder (Llama, Mistral, Qwen2, "
                                            "GPT-2, GPT-NeoX) or a mixture of experts (Mixtral, Qwen2-MoE, "
                                            "Qwen3-MoE, DeepSeek-V2/V3)."),
    gpu: str = typer.Option("h100", "--gpu", metavar="GPU", help="GPU preset: h100, h200, a100 or b200."),
    seq_len: int = typer.Option(..., "--seq-len", min=1, metavar="N", help="Tokens per sequence."),
    microbatch_size: int = typer.Option(..., "--microbatch-size", "-b", min=1, metavar="N",
                                       help="Sequences per microbatch."),
    tp: int = typer.Option(1, "--tp", min=1, metavar="N", help="Tensor-parallel degree (with sequence parallelism)."),
    dp: int = typer.Option(1, "--dp", min=1, metavar="N",
                           help="Data-parallel degree (shards the optimizer under --zero 1)."),
    zero: int = typer.Option(0, "--zero", metavar="N",
                             help="0; 1 shards the optimizer states over --dp x --cp; 3 (FSDP) also the weights and "
                                  "gradients."),
    cp: int = typer.Option(1, "--cp", min=1, metavar="N", help="Context-parallel degree (ring attention)."),
    dtype: str = typer.Option("bf16", "--dtype", metavar="DTYPE",
                              help="bf16, fp16 or fp8 (Transformer Engine's FP8 linear layers)."),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", metavar="SHARE",
                                               help="Time FLOPs at this fraction of the GPU's BF16 peak instead of "
                                                    "the kernel model (default)."),
    eager_attention: bool = typer.Option(False, "--no-flash-attention", metavar="",
                                         help="Keep the s x s attention probabilities (default: flash attention "
                                              "keeps none)."),
    flash: bool = typer.Option(False, "--flash-attention", hidden=True, help="The default (flash attention)."),
    link: str = typer.Option("nvlink", "--link", metavar="LINK", help="Link between stages: nvlink or network."),
    ep: int = typer.Option(1, "--ep", min=1, metavar="N", help="Expert-parallel degree (routed experts whole, not "
                                                               "split by --tp)."),
    a2a_link: Optional[str] = typer.Option(None, "--a2a-link", metavar="LINK",
                                           help="Link of every byte of the experts' all-to-all: nvlink or "
                                                "network (default: the copies within the node over NVLink, the others "
                                                "over the network)."),
    dispatcher: str = DISPATCHER,
    tp_comm_overlap: bool = TP_COMM_OVERLAP,
    method: str = typer.Option("formula", "--method", metavar="METHOD",
                               help="formula (the closed form: fused kernels) or count (torch on transformers' "
                                    "eager modules: an upper bound)."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                       help="Model name (default: the config file's name)."),
    output: Path = typer.Option(..., "--output", "-o", metavar="FILE",
                                help="Model description to write (.yaml or .json)."),
    as_json: bool = JSON, quiet: bool = QUIET,
) -> None:
    """Estimate a model's per-layer costs from its config (docs/cost-model.md) and write the model description;
    FLOPs and activation bytes from the closed form, or with --method count counted by torch on the transformers model.

    Example: zbsolve estimate problems/models/configs/llama3-8b.json --gpu h100 --seq-len 8192 -b 1 -o llama3-8b.yaml
    """
    from zbsolve.costmodel.estimate import estimate as estimate_model
    from zbsolve.costmodel.notes import flops_note, method_note
    from zbsolve.costmodel.hf_config import architecture
    from zbsolve.present.layers import LAYER_HEADERS, layer_rows

    check_output(output, "--output", [config])
    if flash and eager_attention:
        raise InputError("--flash-attention and --no-flash-attention: give one (flash attention is the default)")
    flash_attention = not eager_attention
    experts = architecture(config).experts is not None
    command = (f"zbsolve estimate {config} --gpu {gpu} --seq-len {seq_len} --microbatch-size {microbatch_size} "
               f"--tp {tp} --dp {dp} --zero {zero} " + (f"--cp {cp} " if cp > 1 else "") + f"--dtype {dtype} "
               + (f"--efficiency {efficiency:g} " if efficiency is not None else "")
               + f"--{'' if flash_attention else 'no-'}flash-attention --link {link}"
               + (f" --ep {ep}" if experts else "")
               + (f" --dispatcher {dispatcher}" if experts and dispatcher != "alltoall" else "")
               + (f" --a2a-link {a2a_link}" if experts and a2a_link else "")
               + (" --tp-comm-overlap" if tp_comm_overlap else "")
               + f" --method {method}" + (f" --name {name}" if name else "") + f" -o {output}")
    model = estimate_model(config, gpu=gpu, seq_len=seq_len, microbatch_size=microbatch_size, tp=tp, dp=dp, cp=cp,
                           zero=zero, dtype=dtype, efficiency=efficiency, flash_attention=flash_attention, link=link,
                           name=name, source=command, method=method, ep=ep, a2a_link=a2a_link,
                           dispatcher=dispatcher, tp_comm_overlap=tp_comm_overlap)
    model.save(output)
    note = flops_note(model, config, flash_attention)
    if quiet:
        return
    if as_json:
        print(json.dumps({"model": model.model_dump(exclude_none=True), "flops_per_token": model.flops_per_token(),
                          "method": method, "note": note}, indent=1))
        return
    s = model.setting
    title = (f"{escape(model.name)}: {s.gpu}, seq_len {s.seq_len}, microbatch {s.microbatch_size}, tp {s.tp}, "
             + (f"ep {ep}, " if experts else "")
             + f"dp {s.dp}, zero {s.zero}, {s.dtype}, "
             + (f"efficiency {s.efficiency:g}" if s.efficiency is not None else "kernel model")
             + "; per device, one microbatch")
    block = next(layer for layer in model.layers if layer.block)
    comm = (f"t_comm after a block: {1e3 * model.link.time(block.out_bytes):.3f} ms ({mib(block.out_bytes):.1f} "
            f"MiB over {model.link.name})")
    exchange = next((layer.comm_f for layer in model.layers if layer.comm_f is not None), None)
    if exchange is not None:
        where = f"over {a2a_link}" if a2a_link else "within the node over NVLink, across nodes over the network"
        comm += (f"; all-to-all of a block with experts: {1e3 * exchange:.3f} ms in F and in B (2 of ep {ep}, {where}, "
                 f"{dispatcher} dispatcher, in t_f and t_b)")
    out.print(text_table(LAYER_HEADERS, layer_rows(model), title), highlight=False)
    for line in (method_note(method), comm, note, f"wrote {output}"):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
