"""Fingerprints of everything deterministic zbsolve computes, to show a refactoring changed no figure: the
schedules of every family, the heuristic and ZB-V's greedy generator, the formulation's integer data, the lower
bounds, torch's built-in orders, the default splits and the costs of every model under problems/models.

Run: .venv/bin/python benchmarks/fingerprints.py [--json out.json] [--against before.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zbsolve.schedulers.builtins import BUILTINS, builtin_schedule
from zbsolve.optimize.bound import lower_bound
from zbsolve.io.costs_section import costs_section
from zbsolve.problem.costs import memory_figures, model_costs
from zbsolve.base.errors import ZbsolveError
from zbsolve.base.units import GIB
from zbsolve.costmodel.estimate import estimate
from zbsolve.schedulers.families import FAMILIES, make_schedule
from zbsolve.optimize.formulation import formulate
from zbsolve.schedulers.heuristic import heuristic
from zbsolve.problem.memory_factor import factor_limit
from zbsolve.costmodel.model import Model
from zbsolve.core.placement import sequential, vshape
from zbsolve.problem.problem_file import Problem
from zbsolve.core.simulator import simulate
from zbsolve.planning.split_bound import split_bound
from zbsolve.problem.splits import megatron_split, torchtitan_split
from zbsolve.io.targets.megatron.layout import megatron_layout
from zbsolve.core.step_time import step_times
from zbsolve.schedulers.vgreedy import v_greedy

ROOT = Path(__file__).resolve().parent.parent


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _timed(schedule: object) -> str:
    """The schedule's orders and its simulated times, peaks and step times."""
    timeline = simulate(schedule)
    return _digest(str(schedule), timeline.start, timeline.end, timeline.peak_memory,
                   step_times(timeline).figures())


def _try(fn, *args, **kwargs) -> str:
    try:
        return fn(*args, **kwargs)
    except ZbsolveError as exc:
        return f"refused: {exc}"


def problem_prints(path: Path) -> dict[str, str]:
    problem = Problem.load(path)
    p, m = problem.num_devices, problem.num_microbatches
    chunks = 2 if path.parent.name == "vshape" else 1
    profile = problem.profile
    limit = problem.mem_limit if problem.mem_factor is None else factor_limit(profile, p, m, problem.mem_factor, chunks)
    out = {}
    for name in FAMILIES:
        out[f"family {name}"] = _try(lambda n=name: _timed(make_schedule(n, profile, p, m)))
    placement = vshape(p) if chunks == 2 else sequential(p)
    staged = profile.expand(placement.num_stages)
    out["heuristic"] = _try(lambda: _timed(heuristic(staged, placement, m, limit)))
    if chunks == 2:
        out["v_greedy"] = _try(lambda: _timed(v_greedy(staged, p, m, limit)))
    for objective in ("span", "makespan"):
        form = formulate(staged, placement, m, limit, objective)
        out[f"formulation {objective}"] = _digest(form.passes, form.device, form.duration, form.mem_delta,
                                                   form.limit, form.edges, form.chains, form.earliest, form.first,
                                                   form.last)
        out[f"lower bound {objective}"] = str(lower_bound(form))
    for name in BUILTINS:
        out[f"builtin {name}"] = _try(lambda n=name: _timed(builtin_schedule(n, profile, p, m)))
    return out


def model_prints(path: Path) -> dict[str, str]:
    model = Model.load(path)
    out = {}
    for p in (4, 8):
        for name, ranges in (("torchtitan", _try(torchtitan_split, model, p)),
                             ("megatron", _try(megatron_split, model, p))):
            out[f"p{p} {name} split"] = str(ranges)
            if isinstance(ranges, list):
                out[f"p{p} {name} layout"] = _try(megatron_layout, model, ranges, p)
        profile, costs = model_costs(model, sequential(p), device_memory=80 * GIB)
        one = make_schedule("1f1b", profile, p, 2 * p)
        out[f"p{p} costs"] = _try(lambda: _digest(profile.model_dump(), costs_section(costs), costs.limits(),
                                                   memory_figures(costs, simulate(one))))
        bound = split_bound(model, sequential(p), 2 * p, time_limit=30, workers=1)
        out[f"p{p} split bound"] = _digest(bound)
    return out


def config_prints(path: Path) -> dict[str, str]:
    out = {}
    for tp, seq in ((1, 2048), (4, 8192)):
        model = _try(estimate, path, seq_len=seq, microbatch_size=1, tp=tp)
        out[f"tp{tp} estimate"] = model if isinstance(model, str) else _digest(model.model_dump(exclude={"source"}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the fingerprints here")
    parser.add_argument("--against", type=Path, help="compare with fingerprints written before")
    args = parser.parse_args()
    prints = {}
    for path in sorted((ROOT / "problems").glob("*/*.yaml")):
        if path.parent.name in ("iclr", "vshape"):
            prints.update({f"{path.parent.name}/{path.stem}: {k}": v for k, v in problem_prints(path).items()})
        elif path.parent.name == "models":
            prints.update({f"models/{path.stem}: {k}": v for k, v in model_prints(path).items()})
    for path in sorted((ROOT / "problems" / "models" / "configs").glob("*.json")):
        prints.update({f"configs/{path.stem}: {k}": v for k, v in config_prints(path).items()})
    if args.json:
        args.json.write_text(json.dumps(prints, indent=1, sort_keys=True))
    table = Table(title="fingerprints")
    for column in ("group", "items", "same as before"):
        table.add_column(column)
    before = json.loads(args.against.read_text()) if args.against else {}
    groups: dict[str, list[str]] = {}
    for key in prints:
        words = key.split(":", 1)[1].split()
        groups.setdefault(words[-1] if re.fullmatch(r"t?p\d+", words[0]) else words[0], []).append(key)
    for group, keys in sorted(groups.items()):
        same = sum(before.get(k) == prints[k] for k in keys) if before else None
        table.add_row(group, str(len(keys)), "-" if same is None else f"{same}/{len(keys)}")
    Console().print(table)
    if before:
        changed = sorted(k for k in set(before) | set(prints) if before.get(k) != prints.get(k))
        for key in changed:
            print(f"changed: {key}")
        print(f"{len(prints) - len(changed)} of {len(prints)} fingerprints unchanged")


if __name__ == "__main__":
    main()
