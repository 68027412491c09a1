"""The configure table: for each published recipe, the configuration ``zbsolve configure`` chooses at the
recipe's GPUs, global batch, sequence length and dtype against the recipe's own, both predicted by ``zbsolve predict``
(``configure.predict``), and a toy model on which every configuration is planned; the targets printed met or missed.

- One row per recipe: its own configuration (its calibration file in ``problems/calibration/``, mapped as
  ``benchmarks/calibration.py`` maps it) predicted, and ``configure`` at the same GPUs, global batch, sequence length
  and dtype for Megatron, with the recipe's TP communication overlap and expert dispatcher: the chosen
  configuration, its predicted and planned tokens/s/GPU, chosen predicted over recipe predicted, whether it fits,
  the wall seconds against the time limit and the search's counts. Context parallelism is in every search's menu
  (``configurations.MAX_CP``), the 405B's included.
- Targets per recipe: the ratio at least 1.0 and the chosen configuration fits (the aim, 1.1, reported); the search
  returns within its time limit plus ``SLACK`` of it, at least ``SLACK_SECONDS`` (a plan may run past its share
  while it times its baselines: ``docs/configure.md``); and the chosen
  configuration's Megatron export is taken by megatron-core's own code (``megatron_core_refusal``).
- The toy row: ``TOY`` (tiny-llama on 8 GPUs, memory so short that the fastest configurations pipeline) is small
  enough to time every configuration: each with a pipeline is planned (``plan``, recomputation chosen, short limits),
  each without predicted; target: ``configure``'s choice is the best of them all.

The recipe rows take up to their time limit each (default 600 s, ``--time-limit``); the toy row about a minute.

Run: .venv/bin/python benchmarks/configure.py [--only TEXT] [--time-limit SECONDS] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from calibration import RUNS, load, mapped  # benchmarks/calibration.py (a script's folder is on its path)
from zbsolve.base.checks import slack
from zbsolve.base.errors import ZbsolveError
from zbsolve.base.units import MIB
from zbsolve.configure.space import Assessed, Group, Space, assess, groups
from zbsolve.configure.choose import configure
from zbsolve.configure.result import ConfigureResult, Counts
from zbsolve.configure.search import label
from zbsolve.planning.planner import plan
from zbsolve.configure.predict import Configuration, configured_model, degrees, predict
from zbsolve.costmodel.hf_config import architecture

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"Llama-3-70B": "llama3-70b-h100-64-fp8-gbs128", "Llama-3.1-405B": "llama3.1-405b-h100-1024-fp8-gbs512",
           "DeepSeek-V3": "deepseek-v3-h100-1024-fp8", "Qwen3-30B-A3B": "qwen3-30b-a3b-h100-16-fp8-dropless"}
"""Each published recipe by the calibration file of its run."""
TIME_LIMIT = 600.0
"""Seconds each recipe's search may take (the target's)."""
SLACK, SLACK_SECONDS = 0.05, 2.0
"""How far a search may run past its time limit and still count as within it: the share of the limit, at least the
seconds (the rule benchmarks/bounds.py's limits hold too)."""
AIM = 1.1
"""The ratio aimed at where the recipe leaves room."""
TOY = dict(config=ROOT / "tests" / "data" / "tiny-llama.json", gpus=8, global_batch=4, seq_len=256,
           device_memory=12 * MIB, reserve=0)
"""The toy: four blocks on 8 GPUs, so little memory that the fastest configurations pipeline."""
TOY_LIMIT = 60.0
"""Seconds of the toy's search."""
TOY_PLAN_LIMIT = 2.0
"""Seconds of each of the toy's exhaustive plans."""
TRANSFORMER_ENGINE = "2.8.0"
"""The Transformer Engine version megatron-core is told where none is installed (it installs only beside CUDA): the
export's FP8 products are Transformer Engine's, and megatron-core asks its version for FP8 with experts."""
MEGATRON_LM_FLAGS = ("--seq-length", "--micro-batch-size", "--global-batch-size", "--use-distributed-optimizer",
                     "--use-megatron-fsdp", "--data-parallel-sharding-strategy")
"""The export's flags that Megatron-LM declares outside megatron-core's ``TransformerConfig``
(``tests/test_export_setting.py``: ``MEGATRON_LM_FLAGS``)."""


@dataclass(frozen=True)
class Row:
    """One recipe's line of the table: the chosen fields None where the search chose nothing (``failure``)."""

    recipe: str
    """The model."""
    run: str
    """The calibration file's stem."""
    recipe_config: str
    """The recipe's degrees, micro-batch size, ZeRO and recomputation."""
    recipe_tokens: float
    """The recipe's predicted tokens/s/GPU."""
    recipe_fits: bool
    """Whether the recipe's configuration fits, predicted."""
    recipe_command: str
    """The recipe's ``zbsolve predict`` line."""
    wall_s: float
    """Wall seconds of the search."""
    limit_s: float
    """Its time limit."""
    failure: str | None = None
    """Why the search chose nothing (its one line, with its counts), or None."""
    counts: Counts | None = None
    """What became of every configuration enumerated."""
    chosen_config: str | None = None
    """The chosen configuration, as ``recipe_config``."""
    chosen_tokens: float | None = None
    """``predict`` of the chosen configuration: tokens/s/GPU."""
    chosen_planned: float | None = None
    """Its plan's tokens/s/GPU (None: not planned)."""
    chosen_fits: bool = False
    """Whether the chosen configuration fits, predicted."""
    chosen_command: str | None = None
    """The chosen configuration's ``zbsolve predict`` line."""
    export: str | None = None
    """Why megatron-core refuses the chosen configuration's export, or why there is none; None where it takes it."""

    @property
    def ratio(self) -> float | None:
        """Chosen predicted over recipe predicted (None: nothing chosen)."""
        return None if self.chosen_tokens is None else self.chosen_tokens / self.recipe_tokens

    @property
    def within(self) -> bool:
        """Whether the search returned within its limit and ``SLACK``."""
        return self.wall_s <= self.limit_s + max(SLACK_SECONDS, SLACK * self.limit_s)

    @property
    def met(self) -> bool:
        """The ratio at least 1 and the chosen configuration fits."""
        return self.ratio is not None and self.ratio >= 1.0 and self.chosen_fits


def _flags(args: list[str]) -> dict[str, str | list[str] | bool]:
    """Megatron's arguments by flag: a flag without a value True, one with several values their list."""
    flags: dict[str, str | list[str] | bool] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            values = []
            for value in args[i + 1:]:
                if value.startswith("--"):
                    break
                values.append(value)
            flags[arg] = True if not values else values[0] if len(values) == 1 else values
    return flags


def megatron_core_refusal(args: list[str], c: Configuration, num_microbatches: int) -> str | None:
    """Why megatron-core 0.16.1 does not take Megatron arguments ``args`` for configuration ``c``, or None: every
    flag is a field of its ``TransformerConfig`` (``MLATransformerConfig`` for latent attention), built with the
    model's own sizes and run through its checks (the layout over the model's blocks included), or one of
    ``MEGATRON_LM_FLAGS``; its microbatch calculator gives ``num_microbatches`` from the batch flags on the GPUs'
    data-parallel size; its ``DistributedDataParallelConfig`` takes the sharding flags; and expert x pipeline
    parallel divides the GPUs (``initialize_model_parallel``). Where Transformer Engine is not installed, megatron-core
    is told ``TRANSFORMER_ENGINE``."""
    import warnings

    import torch

    with warnings.catch_warnings():  # without Transformer Engine or Apex, megatron-core says it falls back
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from megatron.core import utils
    from packaging.version import Version

    if utils.get_te_version() is None:  # not installed: FP8 with experts asks its version
        utils._te_version = Version(TRANSFORMER_ENGINE)
    flags = _flags(args)
    arch = architecture(c.config)
    kind = MLATransformerConfig if arch.latent else TransformerConfig
    fields = {f.name: str(f.type) for f in dataclasses.fields(kind)}
    values: dict[str, object] = {}
    for flag, value in flags.items():
        name = "fp8" if flag == "--fp8-format" else flag[2:].replace("-", "_")  # Megatron-LM's dest="fp8"
        if flag in MEGATRON_LM_FLAGS:
            continue
        if name not in fields:
            return f"{flag} is neither a field of megatron-core's {kind.__name__} nor a Megatron-LM flag"
        if "List" in fields[name] and isinstance(value, str):  # Megatron-LM's nargs="+": one value is a list
            value = [value]
        values[name] = int(value) if isinstance(value, str) and value.isdigit() else value
    sizes: dict[str, object] = dict(num_layers=arch.layers, hidden_size=arch.hidden, num_attention_heads=arch.heads,
                                    num_query_groups=arch.kv_heads, ffn_hidden_size=arch.ffn,
                                    kv_channels=arch.head_dim, pipeline_dtype=torch.bfloat16,
                                    mtp_num_layers=arch.mtp or None)
    if arch.experts is not None:
        sizes |= dict(num_moe_experts=arch.experts.routed, moe_router_topk=arch.experts.top_k,
                      moe_ffn_hidden_size=arch.experts.ffn)
    if arch.latent is not None:
        sizes |= dict(multi_latent_attention=True, q_lora_rank=arch.latent.q_rank or None,
                      kv_lora_rank=arch.latent.kv_rank, qk_head_dim=arch.latent.nope,
                      qk_pos_emb_head_dim=arch.latent.rope, v_head_dim=arch.latent.v)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = kind(**sizes, **values)
    except (AssertionError, ValueError, TypeError) as exc:
        return f"megatron-core's {kind.__name__} refuses it: {exc}"
    replica = made.tensor_model_parallel_size * made.context_parallel_size * made.pipeline_model_parallel_size
    if c.gpus % replica:
        return f"{c.gpus} GPUs are not a multiple of tp x cp x pp = {replica}"
    if c.gpus % (made.expert_model_parallel_size * (made.expert_tensor_parallel_size or 1)
                 * made.pipeline_model_parallel_size):
        return "expert-tensor x expert x pipeline parallel does not divide the GPUs"
    calculator = ConstantNumMicroBatchesCalculator(int(flags["--global-batch-size"]), int(flags["--micro-batch-size"]),
                                                   c.gpus // replica, False, 0)
    if calculator.get() != num_microbatches:
        return f"megatron-core's calculator makes {calculator.get()} microbatches, the plan {num_microbatches}"
    try:
        DistributedDataParallelConfig(use_distributed_optimizer="--use-distributed-optimizer" in flags,
                                      use_megatron_fsdp="--use-megatron-fsdp" in flags,
                                      data_parallel_sharding_strategy=flags.get("--data-parallel-sharding-strategy",
                                                                                "no_shard"))
    except (AssertionError, ValueError, TypeError) as exc:
        return f"megatron-core's DistributedDataParallelConfig refuses it: {exc}"
    return None


def export_refusal(result: ConfigureResult) -> str | None:
    """Why the chosen configuration's Megatron export is not taken by megatron-core (``megatron_core_refusal``) or
    there is none; None where it is taken."""
    try:
        text = result.export()
    except ZbsolveError as exc:
        return str(exc)
    return megatron_core_refusal(shlex.split(text), result.chosen.configuration,
                                 result.chosen.prediction.num_microbatches)


def recipe_row(recipe: str, run: str, time_limit: float, console: Console) -> Row:
    """The recipe's configuration predicted, and configure's choice at its GPUs, batch, sequence and dtype."""
    own = mapped(load(RUNS / f"{run}.yaml")).configuration
    assert own is not None, run  # the four recipes map
    own = own.replace(config=ROOT / own.config)
    p = predict(own)
    said = [time.monotonic()]

    def progress(line: str) -> None:
        if time.monotonic() - said[0] >= 30 and line.startswith(("timed", "refining")):
            said[0] = time.monotonic()
            console.print(f"  {recipe}: {line}", markup=False, highlight=False)

    recipe_figures = dict(recipe=recipe, run=run, recipe_config=label(own, p.dp),
                          recipe_tokens=p.tokens_per_s_per_gpu, recipe_fits=p.fits,
                          recipe_command=own.replace(config=Path(own.config).relative_to(ROOT)).command())
    began = time.monotonic()
    try:
        result = configure(own.config, gpus=own.gpus, global_batch=own.global_batch, seq_len=own.seq_len,
                           gpu=own.gpu, dtype=own.dtype, target="megatron", time_limit=time_limit, progress=progress,
                           tp_comm_overlap=own.tp_comm_overlap, dispatcher=own.dispatcher)
    except ZbsolveError as exc:  # nothing timed that fits, within the limit
        return Row(**recipe_figures, wall_s=time.monotonic() - began, limit_s=time_limit, failure=str(exc))
    wall = time.monotonic() - began
    chosen = result.chosen
    q = predict(chosen.configuration)
    planned = None if chosen.planned_step_s is None else q.tokens_per_s_per_gpu * q.step_time_s / chosen.planned_step_s
    return Row(**recipe_figures, wall_s=wall, limit_s=time_limit, counts=result.counts,
               chosen_config=label(chosen.configuration, q.dp), chosen_tokens=q.tokens_per_s_per_gpu,
               chosen_planned=planned, chosen_fits=q.fits, chosen_command=chosen.command,
               export=export_refusal(result))


def toy_row() -> dict:
    """``configure`` on ``TOY`` against every configuration of it: those with a pipeline planned, the others
    predicted; whether configure's choice is the best of them."""
    began = time.monotonic()
    with cf.ThreadPoolExecutor(1) as pool:
        result = configure(**TOY, time_limit=TOY_LIMIT, executor=pool)
    wall = time.monotonic() - began
    space = Space.of(TOY["config"], gpus=TOY["gpus"], global_batch=TOY["global_batch"], seq_len=TOY["seq_len"])  # every configuration assessed
    every: list[Configuration] = []
    for group in groups(space):
        if isinstance(group, Group):
            every += [one.configuration.replace(device_memory=TOY["device_memory"], reserve=TOY["reserve"])
                      for one in assess(space, group) if isinstance(one, Assessed)]
    best: tuple[float, str] | None = None
    predicted = planned = 0
    for c in every:  # each recomputation choice predicted, with a pipeline or not
        try:
            p = predict(c)
        except ZbsolveError:  # predict's refusal: invalid, as configure counts it
            continue
        predicted += 1
        if p.fits and (best is None or p.step_time_s < best[0]):
            best = (p.step_time_s, f"{label(c, p.dp)} (predicted)")
    pipelines = {c.replace(recompute="none") for c in every if c.pp > 1}  # a plan chooses the recomputation
    with cf.ThreadPoolExecutor(1) as pool:
        for c in sorted(pipelines, key=lambda c: (c.tp, c.pp, c.vp, c.cp, c.microbatch_size, c.zero)):
            dp, m = degrees(c)
            try:
                done = plan(configured_model(c, dp), num_devices=c.pp, num_microbatches=m,
                            device_memory=TOY["device_memory"], reserve=TOY["reserve"],
                            placement="interleaved" if c.vp > 1 else "sequential", chunks=c.vp if c.vp > 1 else None,
                            time_limit=TOY_PLAN_LIMIT, executor=pool, recompute="auto", target="megatron")
            except ZbsolveError:  # nothing fits (InfeasibleError), or the target refuses it
                continue
            planned += 1
            if best is None or done.step_time < best[0]:
                best = (done.step_time, f"{label(c, dp)} (planned: {done.recompute})")
    assert best is not None  # the toy has configurations that fit
    chosen = result.chosen
    how = "planned" if chosen.planned else "predicted"
    return {"chosen": f"{label(chosen.configuration, chosen.prediction.dp)} ({how})",
            "chosen_step_s": chosen.step_s,
            "best": best[1], "best_step_s": best[0], "ratio": best[0] / chosen.step_s,
            "met": chosen.step_s <= best[0] + slack(best[0], floor=0.0), "enumerated": len(every),
            "predicted": predicted, "planned": planned, "wall_s": wall, "total_s": time.monotonic() - began,
            "counts": result.counts.line(), "export": export_refusal(result)}


def counts_text(counts: Counts | None) -> str:
    """enumerated / invalid / pruned memory / pruned bound / timed / untimed / not enumerated ("-" without
    counts)."""
    if counts is None:
        return "-"
    return " / ".join(str(n) for n in (counts.enumerated, counts.invalid, counts.pruned_memory, counts.pruned_bound,
                                       counts.timed, counts.untimed, counts.unenumerated))


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_rows(console: Console, rows: list[Row]) -> None:
    """The recipes' table, then each row's predict lines, or why its search chose nothing."""
    table = Table(title="zbsolve configure against the published recipes (predicted tokens/s/GPU)")
    for column in ("recipe", "recipe config", "recipe tok/s/GPU", "fits", "chosen config", "chosen predicted",
                   "chosen planned", "ratio", "fits ", "wall s", "within limit",
                   "enum / invalid / pruned mem / pruned bound / timed / untimed / not enum"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r.recipe, r.recipe_config, _tokens(r.recipe_tokens), "yes" if r.recipe_fits else "NO",
                      r.chosen_config or "none chosen", _tokens(r.chosen_tokens), _tokens(r.chosen_planned),
                      "-" if r.ratio is None else f"{r.ratio:.3f}", "yes" if r.chosen_fits else "NO",
                      f"{r.wall_s:.0f}", f"{'yes' if r.within else 'NO'} ({r.limit_s:g} s)", counts_text(r.counts))
    console.print(table)
    for r in rows:
        console.print(f"{r.recipe}: recipe  {r.recipe_command}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"{r.recipe}: chosen  {r.chosen_command or r.failure}", markup=False, highlight=False,
                      soft_wrap=True)


def targets(rows: list[Row], toy: dict | None) -> list[dict]:
    """The configure targets, met or missed."""
    found = []
    for r in rows:
        if r.ratio is None:
            detail = f"nothing chosen: {r.failure}"
        else:
            detail = f"ratio {r.ratio:.3f} (aim {AIM}: {'met' if r.ratio >= AIM else 'missed'}), fits {r.chosen_fits}"
        found += [{"target": f"{r.recipe}: chosen predicted / recipe predicted >= 1.0 and fits", "met": r.met,
                   "detail": detail},
                  {"target": f"{r.recipe}: returns within its time limit ({r.limit_s:g} s + max({SLACK_SECONDS:g} s, "
                             f"{SLACK:.0%}))",
                   "met": r.within, "detail": f"{r.wall_s:.1f} s" + (f"; {r.counts.line()}" if r.counts else "")},
                  {"target": f"{r.recipe}: megatron-core takes the chosen configuration's export",
                   "met": r.ratio is not None and r.export is None,
                   "detail": "nothing chosen" if r.ratio is None else r.export or "taken"}]
    if toy is not None:
        found += [{"target": "toy: configure's choice is the best of every configuration planned or predicted",
                   "met": toy["met"], "detail": f"chosen {toy['chosen']} {toy['chosen_step_s']:.6g} s; best "
                                                f"{toy['best']} {toy['best_step_s']:.6g} s (best/chosen "
                                                f"{toy['ratio']:.4f}); {toy['planned']} plans, {toy['predicted']} "
                                                f"predictions of {toy['enumerated']} configurations"},
                  {"target": "toy: megatron-core takes the chosen configuration's export",
                   "met": toy["export"] is None, "detail": toy["export"] or "taken"}]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only the recipes whose name holds this text, or 'toy'")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="seconds of each recipe's search")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and targets as JSON here")
    args = parser.parse_args()
    console = Console(width=200)
    selected = {recipe: run for recipe, run in RECIPES.items() if args.only is None or args.only in recipe}
    rows = [recipe_row(recipe, run, args.time_limit, console) for recipe, run in selected.items()]
    if rows:
        print_rows(console, rows)
    toy = toy_row() if args.only in (None, "toy") else None
    if toy is not None:
        console.print(f"toy ({Path(TOY['config']).name} on {TOY['gpus']} GPUs, global batch {TOY['global_batch']}, "
                      f"{TOY['device_memory'] // MIB} MiB): configure chose {toy['chosen']}, "
                      f"{toy['chosen_step_s']:.6g} s "
                      f"in {toy['wall_s']:.1f} s ({toy['counts']}); the best of {toy['planned']} plans and "
                      f"{toy['predicted']} predictions: {toy['best']}, {toy['best_step_s']:.6g} s "
                      f"({toy['total_s']:.0f} s in all)", markup=False, highlight=False, soft_wrap=True)
    result = targets(rows, toy)
    for t in result:
        console.print(f"{'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['detail']}", markup=False,
                      highlight=False, soft_wrap=True)
    if args.json:
        records = [{**asdict(r), "ratio": r.ratio, "within": r.within, "met": r.met} for r in rows]
        args.json.write_text(json.dumps({"rows": records, "toy": toy, "targets": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
