"""The Gantt chart: files written, boxes where the timeline puts them, labels, shades, memory panel."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from conftest import ROOT
from conftest import one_f_one_b as hand_1f1b
from zbsolve.base.errors import InputError
from zbsolve.core.placement import sequential, vshape
from zbsolve.present.plot import COLORS, plot_timeline, save_chart
from zbsolve.core.profile import UNIT, Profile
from zbsolve.core.schedule import B, BW, F, W, Pair, Pass, build, passes_of
from zbsolve.core.simulator import Timeline, simulate


def one_f_one_b(p: int, m: int, *, split: bool = False, mem_limit: float | None = None) -> Timeline:
    """1F1B (conftest's, simulated); ``split`` runs B then W."""
    return simulate(hand_1f1b(p, m, mem_limit=mem_limit, split=split))


def with_pairs(p: int, m: int) -> Timeline:
    """1F1B whose last device overlaps each F with the previous microbatch's BW."""
    devices = [list(ops) for ops in one_f_one_b(p, m).schedule.devices]
    last = p - 1
    devices[last] = [Pass(F, 0, last)] + [Pair(Pass(F, k + 1, last), Pass(BW, k, last)) for k in range(m - 1)] + [
        Pass(BW, m - 1, last)]
    profile = Profile(overlap_saving=0.25)
    return simulate(build("pairs", sequential(p), m, profile, devices))


def v_shape() -> Timeline:
    """p = 2, m = 2 on the V-shape placement: device 0 holds stages 0 and 3, device 1 stages 1 and 2."""
    devices = [
        "0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1 3W0 3W1 0W0 0W1",
        "1F0 1F1 2F0 2F1 2B0 1B0 2B1 1B1 2W0 1W0 2W1 1W1",
    ]
    ops = [[Pass.from_str(x) for x in line.split()] for line in devices]
    return simulate(build("v-hand", vshape(2), 2, UNIT, ops, mem_limit=4.0))


def boxes(fig: Figure) -> PolyCollection:
    (collection,) = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    return collection


def labels(fig: Figure) -> Counter:
    return Counter(t.get_text() for t in fig.axes[0].texts)


def test_png_and_svg_written(tmp_path):
    timeline = one_f_one_b(4, 8, mem_limit=4.0)
    png = save_chart(timeline, tmp_path / "chart.png", memory=True)
    svg = save_chart(timeline, tmp_path / "chart.SVG")
    assert png == tmp_path / "chart.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    text = svg.read_text()
    assert "<svg" in text[:2000] and len(text) > 20_000


@pytest.mark.parametrize("name", ["chart.pdf", "chart", "chart.png.txt"])
def test_bad_suffix(tmp_path, name):
    path = tmp_path / name
    with pytest.raises(InputError, match="suffix"):
        save_chart(one_f_one_b(2, 2), path)
    assert not path.exists()


def test_one_box_per_pass_at_its_time():
    timeline = one_f_one_b(4, 6, split=True)
    fig = plot_timeline(timeline)
    paths = boxes(fig).get_paths()
    assert len(paths) == 4 * 6 * 3, "one box per F, B and W of each microbatch on each stage"
    spans = sorted((round(v[:, 1].mean()), v[:, 0].min(), v[:, 0].max()) for v in (q.vertices for q in paths))
    want = sorted((d, s, e) for d in range(4) for s, e in zip(timeline.start[d], timeline.end[d]))
    assert np.allclose(spans, want)
    assert fig.axes[0].get_xlim() == (0.0, timeline.makespan)
    top, bottom = fig.axes[0].get_ylim()
    assert bottom < top, "device 0 is the top row"


def test_colours_by_kind():
    timeline = one_f_one_b(3, 4, split=True)
    faces = {tuple(np.round(c[:3], 3)) for c in boxes(plot_timeline(timeline)).get_facecolors()}
    assert faces == {tuple(np.round(to_rgb(COLORS[k]), 3)) for k in (F, B, W)}
    assert len(set(COLORS.values())) == 4


def test_labels_and_title_of_a_small_schedule():
    timeline = one_f_one_b(4, 8, split=True)
    fig = plot_timeline(timeline, title="my 1F1B")
    want = Counter(str(p.mb) for ops in timeline.schedule.devices for op in ops for p in passes_of(op))
    assert labels(fig) == want
    assert fig.axes[0].get_title(loc="left").startswith("my 1F1B\n")
    assert plot_timeline(timeline).axes[0].get_title(loc="left").startswith("1f1b\n")


def test_title_has_both_bubble_rates():
    timeline = with_pairs(3, 4)
    rates = f"{timeline.bubble_rate:.2%}", f"{timeline.paper_bubble:.2%}"
    assert rates[0] != rates[1]
    title = plot_timeline(timeline).axes[0].get_title(loc="left")
    assert title.startswith("pairs\n") and all(r in title for r in rates)


def test_labels_dropped_when_too_many():
    timeline = one_f_one_b(8, 256)
    fig = plot_timeline(timeline)
    assert len(boxes(fig).get_paths()) == 2 * 8 * 256
    assert not fig.axes[0].texts


def test_pair_drawn_as_two_halves():
    timeline = with_pairs(3, 4)
    fig = plot_timeline(timeline)
    pairs = [(d, i) for d, ops in enumerate(timeline.schedule.devices) for i, op in enumerate(ops)
             if isinstance(op, Pair)]
    assert len(pairs) == 3
    halves = [q.vertices for q in boxes(fig).get_paths()]
    faces = [tuple(c[:3]) for c in boxes(fig).get_facecolors()]
    d, i = pairs[0]
    start, end = timeline.start[d][i], timeline.end[d][i]
    at = [k for k, v in enumerate(halves) if np.isclose(v[:, 0].min(), start) and np.isclose(v[:, 0].max(), end)]
    assert len(at) == 2
    assert {faces[k] for k in at} == {to_rgb(COLORS[F]), to_rgb(COLORS[BW])}
    heights = {round(float(np.ptp(halves[k][:, 1])), 6) for k in at}
    assert len(heights) == 1
    assert labels(fig) == Counter(str(p.mb) for ops in timeline.schedule.devices for op in ops
                                  for p in passes_of(op))
    assert any("pair" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_vshape_chunks_shaded():
    timeline = v_shape()
    faces = boxes(plot_timeline(timeline)).get_facecolors()[:, :3]
    schedule = timeline.schedule
    order = [p for ops in schedule.devices for op in ops for p in passes_of(op)]
    for kind in (F, B, W):
        first = {tuple(faces[k]) for k, p in enumerate(order) if p.kind == kind and p.stage in (0, 1)}
        second = {tuple(faces[k]) for k, p in enumerate(order) if p.kind == kind and p.stage in (2, 3)}
        assert len(first) == len(second) == 1
        assert sum(second.pop()) > sum(first.pop()), f"{kind}: second stage is lighter"


def test_memory_panel():
    timeline = one_f_one_b(4, 8, mem_limit=4.0)
    assert len(plot_timeline(timeline).axes) == 1
    fig = plot_timeline(timeline, memory=True)
    assert len(fig.axes) == 2
    panel = fig.axes[1]
    dashed = [line for line in panel.get_lines() if line.get_linestyle() == "--"]
    assert [tuple(line.get_ydata()) for line in dashed] == [(4.0, 4.0)]
    steps = [line for line in panel.get_lines() if line.get_linestyle() != "--"]
    assert [max(line.get_ydata()) for line in steps] == [4.0, 3.0, 2.0, 1.0], "1F1B's peak: p - d microbatches"
    assert panel.get_xlim() == (0.0, timeline.makespan)


def test_memory_panel_per_device_limits():
    schedule = one_f_one_b(2, 3).schedule
    timeline = simulate(build("limits", schedule.placement, 3, UNIT, schedule.devices, mem_limit=[2.5, 1.0]))
    dashed = [line for line in plot_timeline(timeline, memory=True).axes[1].get_lines()
              if line.get_linestyle() == "--"]
    assert sorted(line.get_ydata()[0] for line in dashed) == [1.0, 2.5]


V_SHAPE_TIMES = {
    0: {"0F0": 0, "0F1": 1, "3F0": 4, "3B0": 5, "3F1": 6, "3B1": 7, "0B0": 8, "0B1": 10, "3W0": 11, "3W1": 12,
        "0W0": 13, "0W1": 14},
    1: {"1F0": 1, "1F1": 2, "2F0": 3, "2F1": 4, "2B0": 6, "1B0": 7, "2B1": 8, "1B1": 9, "2W0": 10, "1W0": 11,
        "2W1": 12, "1W1": 13},
}
"""``v_shape()``'s start times worked out by hand (unit passes, no communication): 1F waits for 0F, 2F for 1F on
its own device, 3F for 2F, 2B for 3B, 1B for 2B, 0B for 1B, and each W follows its B; the last pass, 0W1, ends
at 15."""


def test_into_given_axes():
    """Drawn into given axes, the chart shows one unit-wide box per pass of the V-shape, on its device's row, from
    its hand-worked start, labelled with its microbatch, over [0, 15]."""
    fig = Figure()
    ax = fig.subplots()
    timeline = v_shape()
    assert plot_timeline(timeline, ax=ax) is fig
    (collection,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    drawn = sorted((round(v[:, 1].mean()), v[:, 0].min(), v[:, 0].max()) for v in
                   (path.vertices for path in collection.get_paths()))
    want = sorted((d, start, start + 1) for d, starts in V_SHAPE_TIMES.items() for start in starts.values())
    assert len(drawn) == 24 and np.allclose(drawn, want)
    assert ax.get_xlim() == (0.0, 15.0)
    texts = sorted((round(t.get_position()[1]), t.get_position()[0], t.get_text()) for t in ax.texts)
    want_texts = sorted((d, start + 0.5, name[-1]) for d, starts in V_SHAPE_TIMES.items()
                        for name, start in starts.items())
    assert [(d, text) for d, _, text in texts] == [(d, text) for d, _, text in want_texts]
    assert np.allclose([x for _, x, _ in texts], [x for _, x, _ in want_texts])
    with pytest.raises(InputError, match="memory"):
        plot_timeline(timeline, ax=ax, memory=True)


def test_shows_itself_in_notebooks():
    fig = plot_timeline(one_f_one_b(2, 2), memory=True)
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_is_drawn_in_seconds_and_gib_with_its_module_names():
    """Llama-3-8B on four devices: rows named by the model's modules, the title and the memory panel in seconds and
    GiB, and no two legend entries in one colour."""
    from matplotlib.colors import to_hex

    from zbsolve.optimize.solve import solve

    result = solve(ROOT / "problems" / "models" / "llama3-8b.yaml", num_devices=4, num_microbatches=8,
                   solver="heuristic")
    fig = plot_timeline(result.timeline, memory=True, costs=result.costs)
    gantt, panel = fig.axes
    assert [t.get_text() for t in gantt.get_yticklabels()] == [
        "0: tok_embeddings, layers.0-7", "1: layers.8-15", "2: layers.16-23", "3: layers.24-31, norm, output"]
    title = gantt.get_title(loc="left")
    assert f"step time with barrier {result.step_time:.4g} s" in title
    assert f"peak activations {max(result.peak_memory) / 2**30:.2f} GiB" in title
    assert panel.get_xlabel() == "time (s)" and panel.get_ylabel() == "activation\nmemory (GiB)"
    assert max(max(line.get_ydata()) for line in panel.get_lines()) < 80  # GiB, not bytes
    for ax in (gantt, panel):
        legend = ax.get_legend()
        colours = [to_hex(h.get_facecolor() if hasattr(h, "get_facecolor") and not hasattr(h, "get_color")
                          else h.get_color()) for h in legend.legend_handles]
        assert len(set(colours)) == len(colours), [t.get_text() for t in legend.get_texts()]


def legend_colours(ax) -> dict[str, tuple[str, ...]]:
    """Each legend entry's text and the colours of everything its handle draws (every patch of a tuple handle)."""
    from matplotlib.colors import to_hex
    from matplotlib.offsetbox import DrawingArea, OffsetBox, TextArea
    from matplotlib.patches import Patch

    entries: dict[str, tuple[str, ...]] = {}

    def walk(box: OffsetBox) -> None:
        kids = box.get_children()
        if len(kids) == 2 and isinstance(kids[0], DrawingArea) and isinstance(kids[1], TextArea):
            entries[kids[1].get_text()] = tuple(to_hex(a.get_facecolor() if isinstance(a, Patch) else a.get_color())
                                                for a in kids[0].get_children())
        for kid in kids:
            if isinstance(kid, OffsetBox):
                walk(kid)

    walk(ax.get_legend().get_children()[0])
    return entries


def llama(placement: str, p: int, m: int):
    from zbsolve.optimize.solve import solve

    return solve(ROOT / "problems" / "models" / "llama3-8b.yaml", num_devices=p, num_microbatches=m,
                 placement=placement, solver="heuristic")


@pytest.mark.parametrize("case", ["vshape", "pairs", "16 devices"])
def test_no_two_legend_entries_draw_the_same_colours(case):
    """Every legend entry of the Gantt chart and of the memory panel is told apart by its colours: a device's later
    stages (lighter shades of every kind) against the kinds, the F&B pair against F, the devices and the limits."""
    if case == "pairs":
        fig = plot_timeline(with_pairs(3, 4), memory=True)
    else:
        result = llama("vshape", 8, 16) if case == "vshape" else llama("sequential", 16, 32)
        fig = plot_timeline(result.timeline, memory=True, costs=result.costs)
    for ax in fig.axes:
        entries = legend_colours(ax)
        assert len(set(entries.values())) == len(entries) > 2, entries


def test_the_plan_chart_names_modules_source_seconds_and_gib_and_cuts_no_label():
    """A plan of Llama-3-8B on the V-shape: rows by the model's module names, none cut off at the figure's left edge;
    the title names the placement, the partition and the source as the plan's table does (and the warm start CP-SAT
    kept), times in seconds and memory in GiB; no two legend entries alike."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from zbsolve.planning.baselines import baselines
    from zbsolve.planning.result import PlanResult
    from zbsolve.present.plot import plot_plan

    result = llama("vshape", 4, 8)
    plan = PlanResult("vshape", 2, result.costs, result.timeline, "cpsat", result.lower_bound,
                      tuple(baselines(result.costs.model, 4, 8, 80 * 2**30)), (), 1.0, "")
    fig = plot_plan(plan)
    gantt, bars = fig.axes
    rows = [t.get_text() for t in gantt.get_yticklabels()]
    assert rows == ["0: tok_embeddings, layers.0-3, layers.28-31, norm, output", "1: layers.4-7, layers.24-27",
                    "2: layers.8-11, layers.20-23", "3: layers.12-19"]
    summary = plan.summary()
    title = gantt.get_title(loc="left")
    kept = result.schedule.name
    assert kept != "cpsat" and title.startswith(
        f"llama3-8b: plan for the step time with barrier: vshape x2, no recomputation, partition "
        f"{summary['partition']}; the schedule kept is {kept}'s (cpsat found none shorter)\n")
    assert f"step time with barrier {plan.step_time:.4g} s" in title
    assert f"peak activations {max(result.peak_memory) / 2**30:.2f} GiB" in title
    renderer = FigureCanvasAgg(fig).get_renderer()
    for label in gantt.get_yticklabels() + bars.get_yticklabels():
        assert label.get_window_extent(renderer).x0 >= 0, label.get_text()
    entries = legend_colours(gantt)
    assert len(set(entries.values())) == len(entries), entries
