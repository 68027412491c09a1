"""The forms of results in the terminal and in Jupyter: each a table of its headline figures."""

from __future__ import annotations

from rich.table import Table

from zbsolve.base.shown import FORMS, Forms
from zbsolve.optimize.result import SolveResult
from zbsolve.planning.result import PlanResult
from zbsolve.present.tables import figures_html, figures_table


def solve_figures(result: SolveResult) -> dict[str, object]:
    """A solve's summary as its table shows it: the status as ``status_text`` reads it."""
    return {**result.summary(), "status": result.status_text}


def solve_table(result: SolveResult) -> Table:
    """A solve's figures as a terminal table."""
    return figures_table(solve_figures(result), f"zbsolve {result.solver}")


def plan_table(result: PlanResult) -> Table:
    """A plan's figures as a terminal table."""
    return figures_table(result.summary(), "zbsolve plan")


FORMS[SolveResult] = Forms(solve_table, lambda result: figures_html(solve_figures(result)))
FORMS[PlanResult] = Forms(plan_table, lambda result: figures_html(result.summary()))
