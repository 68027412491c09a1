"""The balanced split (``partition(model, k, "balanced")``): against every split of small models, its slowest stage
is the fastest any split over the same boundaries achieves, it has k stages, each timed, and it never cuts inside
the layers Megatron's layout keeps together."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from zbsolve.costmodel.model import Layer, Model
from zbsolve.problem.partition import partition, untimed
from zbsolve.io.targets.megatron.layout import megatron_layout


def _layer(name: str, block: bool, f: float, b: float, w: float) -> Layer:
    return Layer(name=name, block=block, t_f=f, t_b=b, t_w=w, mem_f=10, mem_b=-6, mem_w=-4, static_bytes=100,
                 out_bytes=5)


def _model(times: list[tuple[float, float, float]], head: float) -> Model:
    """An embedding (no B), blocks of ``times``, a norm and a head of ``head`` seconds a pass."""
    layers = ([_layer("tok_embeddings", False, 0.01, 0.0, 0.01)]
              + [_layer(f"layers.{i}", True, *t) for i, t in enumerate(times)]
              + [_layer("norm", False, 0.001, 0.001, 0.0), _layer("output", False, head, head, head)])
    return Model(name="toy", layers=layers)


def _slowest(model: Model, ranges: list[tuple[int, int]]) -> float:
    return max(sum(x.t_f + x.t_b + x.t_w for x in model.layers[a:b]) for a, b in ranges)


def _best(model: Model, stages: int) -> float:
    """The least slowest stage over every split cut only at blocks' starts (the embedding with the first block,
    norm and head after the last block or alone), each stage timed."""
    n = len(model.layers)
    cuts = list(range(2, n - 2)) + [n - 2]  # a block's start, or the norm's
    best = float("inf")
    for chosen in itertools.combinations(cuts, stages - 1):
        ends = [0, *chosen, n]
        ranges = list(zip(ends, ends[1:]))
        if all(untimed(model.layers[a:b]) is None for a, b in ranges):
            best = min(best, _slowest(model, ranges))
    return best


times = st.tuples(*(st.floats(0.1, 3.0),) * 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(times, min_size=2, max_size=7), st.floats(0.05, 6.0), st.integers(1, 6))
def test_balanced_is_the_fastest_split(blocks: list, head: float, stages: int) -> None:
    model = _model(blocks, head)
    stages = min(stages, len(blocks) + 1)
    ranges = partition(model, stages, "balanced")
    assert len(ranges) == stages
    assert all(untimed(model.layers[a:b]) is None for a, b in ranges)
    assert _slowest(model, ranges) <= _best(model, stages) * (1 + 1e-12)
    megatron_layout(model, ranges, 1)  # no boundary inside the layers the layout keeps together


def test_balanced_gives_a_slow_head_a_stage_of_its_own() -> None:
    model = _model([(1.0, 1.0, 1.0)] * 6, head=2.0)  # norm and head: 6 s, two blocks' time
    assert [b - a for a, b in partition(model, 4, "balanced")] == [3, 2, 2, 2]
    assert [b - a for a, b in partition(model, 4, "uniform")] == [3, 2, 1, 3]  # its last stage 9 s
