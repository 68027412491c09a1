"""The forms of results in the terminal and in Jupyter: each a table of its headline figures, named and with their
units as the command line's tables show them (``present.figures``); and their charts (``result.plot()``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from zbsolve.base.shown import CHARTS, FORMS, Forms
from zbsolve.configure.predict import Prediction
from zbsolve.configure.result import ConfigureResult
from zbsolve.optimize.result import SolveResult
from zbsolve.planning.result import PlanResult
from zbsolve.present.configure_table import configure_html, configure_rich
from zbsolve.present.figures import Units, shown
from zbsolve.present.tables import figures_html, figures_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def solve_figures(result: SolveResult) -> dict[str, object]:
    """A solve's summary as its table shows it: each figure by its name with its unit, the status as
    ``status_text`` reads it."""
    return shown({**result.summary(), "status": result.status_text}, Units.of(result.costs))


def plan_figures(result: PlanResult) -> dict[str, object]:
    """A plan's summary as its table shows it: each figure by its name with its unit."""
    return shown(result.summary(), Units.of(result.costs))


def prediction_figures(result: Prediction) -> dict[str, object]:
    """A prediction's headline figures as ``zbsolve predict`` shows them, its step's breakdown and its warnings."""
    short = max(result.shortfall_gib, default=0.0)
    return {"step time (s)": result.step_time_s, "tokens/s/GPU": result.tokens_per_s_per_gpu,
            "model TFLOP/s/GPU": result.model_tflops_per_gpu, "MFU": result.mfu,
            "peak memory (GiB)": max(result.peak_memory_gib, default=0.0),
            "device memory (GiB)": result.device_memory_gib, "fits": result.fits,
            **({"short (GiB)": short} if short else {}), "schedule": result.schedule, "dp": result.dp,
            "microbatches": result.num_microbatches, **{f"{part} (s)": t for part, t in result.breakdown.items()},
            **{f"warning {k}": w for k, w in enumerate(result.warnings, 1)}}


def solve_table(result: SolveResult) -> Table:
    """A solve's figures as a terminal table."""
    return figures_table(solve_figures(result), f"zbsolve {result.solver}")


def plan_table(result: PlanResult) -> Table:
    """A plan's figures as a terminal table."""
    return figures_table(plan_figures(result), "zbsolve plan")


FORMS[SolveResult] = Forms(solve_table, lambda result: figures_html(solve_figures(result)))
FORMS[PlanResult] = Forms(plan_table, lambda result: figures_html(plan_figures(result)))
FORMS[ConfigureResult] = Forms(configure_rich, configure_html)
FORMS[Prediction] = Forms(lambda result: figures_table(prediction_figures(result), "zbsolve predict"),
                          lambda result: figures_html(prediction_figures(result)))


def _drawn(draw: Callable[[], Figure], path: str | Path | None) -> Figure:
    """The figure ``draw`` makes, written to ``path`` (.png or .svg, checked before drawing) when given."""
    from zbsolve.present.plot import check_chart_path, save_figure  # matplotlib, when first drawn

    if path is not None:
        check_chart_path(path, "path")
    fig = draw()
    if path is not None:
        save_figure(fig, path)
    return fig


def solve_chart(result: SolveResult, path: str | Path | None = None) -> Figure:
    """A solve's Gantt chart with its memory panel, titled as ``zbsolve solve --chart`` titles it
    (``SolveResult.title``: the model's name, else "solve"), in its units; written to ``path`` (.png or .svg) when
    given."""
    from zbsolve.present.plot import plot_timeline

    model = result.costs.model if result.costs is not None else None
    return _drawn(lambda: plot_timeline(result, memory=True,
                                        title=result.title(model.name if model is not None else "solve")), path)


def plan_chart(result: PlanResult, path: str | Path | None = None) -> Figure:
    """A plan's chart (``present.plot.plot_plan``), as ``zbsolve plan --chart`` draws it; written to ``path`` (.png or
    .svg) when given."""
    from zbsolve.present.plot import plot_plan

    return _drawn(lambda: plot_plan(result), path)


def configure_chart(result: ConfigureResult, path: str | Path | None = None) -> Figure:
    """The candidates' tokens/s/GPU against their peak memory per device (``present.configure_chart``), as
    ``zbsolve configure --chart`` draws it; written to ``path`` (.png or .svg) when given."""
    from zbsolve.present.configure_chart import plot_configure

    return _drawn(lambda: plot_configure(result), path)


CHARTS[SolveResult] = solve_chart
CHARTS[PlanResult] = plan_chart
CHARTS[ConfigureResult] = configure_chart
