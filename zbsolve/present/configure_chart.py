"""``zbsolve configure``'s candidates as a chart: each configuration timed, its predicted tokens/s/GPU against its
largest device's memory (``predict``'s, the reserve included), those that do not fit apart, the ranked ones and the
chosen one marked, the device memory drawn as a line (``ConfigureResult.plot``, ``configure --chart``)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from zbsolve.configure.result import ConfigureResult
from zbsolve.present.plot import Chart


def _columns(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The x and the y values of ``points``."""
    return [x for x, _ in points], [y for _, y in points]


def plot_configure(result: ConfigureResult) -> Figure:
    """Tokens/s/GPU against peak memory per device (GiB): every configuration timed (``ConfigureResult.timed``,
    predicted figures), those that do not fit as crosses, the ranked candidates ringed and the chosen one a star at
    the ranked table's figures (a plan's step where it is taken, an arrow from the predicted one); the device memory
    a solid line; the title says whether the search finished, with its counts."""
    fig = Chart(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    fitting = [(t.memory_gib, t.tokens_per_s_per_gpu) for t in result.timed if t.fits]
    unfit = [(t.memory_gib, t.tokens_per_s_per_gpu) for t in result.timed if not t.fits]
    if fitting:
        ax.scatter(*_columns(fitting), s=14, color="#4c72b0", alpha=0.6, label=f"timed, fits ({len(fitting)})")
    if unfit:
        ax.scatter(*_columns(unfit), s=18, marker="x", color="#c44e52", alpha=0.7,
                   label=f"timed, does not fit ({len(unfit)})")
    ranked = [(r.memory_gib, r.tokens_per_s_per_gpu) for r in result.candidates[1:]]
    if ranked:
        ax.scatter(*_columns(ranked), s=70, facecolors="none", edgecolors="#dd8452", linewidths=1.4,
                   label=f"ranked ({len(ranked)} besides the chosen)")
    chosen = result.chosen
    shown = "planned" if chosen.planned else "predicted"
    named = "chosen" if result.complete else "best found"
    ax.scatter([chosen.memory_gib], [chosen.tokens_per_s_per_gpu], s=220, marker="*", color="#55a868",
               edgecolors="black", linewidths=0.8, zorder=3, label=f"{named} ({chosen.degrees()}, {shown})")
    if chosen.planned:  # from its predicted figures to its plan's
        ax.annotate("", xy=(chosen.memory_gib, chosen.tokens_per_s_per_gpu),
                    xytext=(chosen.memory_gib, chosen.prediction.tokens_per_s_per_gpu),
                    arrowprops=dict(arrowstyle="->", color="#55a868", linewidth=1.2))
    device = chosen.prediction.device_memory_gib
    ax.axvline(device, color="black", linewidth=1.2, label=f"device memory ({device:.4g} GiB)")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("tokens/s/GPU")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    c = chosen.configuration
    done = "complete" if result.complete else "incomplete, best found"
    gap = "" if result.complete or result.gap is None else f", gap {100 * result.gap:.1f}%"
    counts = result.counts
    ax.set_title(f"{Path(c.config).stem} on {c.gpus} x {c.gpu}, global batch {c.global_batch} ({done}{gap}):\n"
                 f"{counts.timed} timed, {counts.untimed + counts.unenumerated} untimed, "
                 f"{counts.pruned_memory + counts.pruned_bound} pruned", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig
