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
  configuration's Megatron command (``torchrun ... pretrain_gpt.py``) passes torch's torchrun parser, Megatron-LM's
  encoded rules and megatron-core's config classes (``export_refusal``: ``tests/launch_checks.py``, which the tests
  share); the table says whether each search completed or its choice is the best found, with its gap.
- The toy row: ``TOY`` (tiny-llama on 8 GPUs, memory so short that the fastest configurations pipeline) is small
  enough to time every configuration: each with a pipeline is planned (``plan``, recomputation chosen, short limits),
  each without predicted; target: ``configure``'s choice is the best of them all.

The recipe rows take up to their time limit each (default 600 s, ``--time-limit``); the toy row about a minute.

Run: .venv/bin/python benchmarks/configure.py [--only TEXT] [--time-limit SECONDS] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from launch_checks import megatron_command_refusal  # noqa: E402  (tests/launch_checks.py, shared with the tests)
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
    """Why the chosen configuration's Megatron command does not launch it (``export_refusal``), or why there is
    none; None where it does."""
    status: str = "-"
    """Whether the search completed (``search_status``)."""

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


def export_refusal(result: ConfigureResult) -> str | None:
    """Why the chosen configuration's Megatron command (``torchrun ... pretrain_gpt.py``) does not launch it
    (``launch_checks.megatron_command_refusal``: torch's torchrun parser, Megatron-LM's encoded rules and
    megatron-core's config classes) or there is none; None where it does."""
    try:
        text = result.export()
    except ZbsolveError as exc:
        return str(exc)
    c = result.chosen.configuration
    return megatron_command_refusal(text, c.config, c.gpus, result.chosen.prediction.num_microbatches, c.gpu)


def search_status(result: ConfigureResult) -> str:
    """Whether the search completed: "complete", or "best found" with its gap to the best bound among the untimed
    (``ConfigureResult.gap``; "unknown" where some configurations were not enumerated)."""
    if result.complete:
        return "complete"
    return "best found, gap " + ("unknown" if result.gap is None else f"{100 * result.gap:.1f}%")


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
               export=export_refusal(result), status=search_status(result))


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
            "counts": result.counts.line(), "export": export_refusal(result), "status": search_status(result)}


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
                   "chosen planned", "ratio", "fits ", "search", "wall s", "within limit",
                   "enum / invalid / pruned mem / pruned bound / timed / untimed / not enum"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r.recipe, r.recipe_config, _tokens(r.recipe_tokens), "yes" if r.recipe_fits else "NO",
                      r.chosen_config or "none chosen", _tokens(r.chosen_tokens), _tokens(r.chosen_planned),
                      "-" if r.ratio is None else f"{r.ratio:.3f}", "yes" if r.chosen_fits else "NO", r.status,
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
                  {"target": f"{r.recipe}: the chosen configuration's command passes torchrun's parser, Megatron-LM's "
                             "rules and megatron-core's config classes",
                   "met": r.ratio is not None and r.export is None,
                   "detail": "nothing chosen" if r.ratio is None else r.export or "taken"}]
    if toy is not None:
        found += [{"target": "toy: configure's choice is the best of every configuration planned or predicted",
                   "met": toy["met"], "detail": f"chosen {toy['chosen']} {toy['chosen_step_s']:.6g} s; best "
                                                f"{toy['best']} {toy['best_step_s']:.6g} s (best/chosen "
                                                f"{toy['ratio']:.4f}); {toy['planned']} plans, {toy['predicted']} "
                                                f"predictions of {toy['enumerated']} configurations"},
                  {"target": "toy: the chosen configuration's command passes torchrun's parser, Megatron-LM's rules "
                             "and megatron-core's config classes",
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
                      f"{toy['chosen_step_s']:.6g} s in {toy['wall_s']:.1f} s ({toy['status']}; {toy['counts']}); "
                      f"the best of {toy['planned']} plans and "
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
