"""Megatron's --pipeline-model-parallel-layout read over a model (zbsolve.io.targets.megatron.layout), its uneven
first and last pipeline ranks (splits.megatron_uneven_blocks_per_stage), and Megatron's baselines
(planning.baselines): counts worked by hand from megatron-core 0.16.1's rules, one-line errors, and every fitting row
judged again by the simulator."""

from __future__ import annotations

import pytest

from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core import torch_compat
from zbsolve.core.placement import interleaved, make_placement
from zbsolve.core.profile import UNIT
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Layer, Model, ModuleCost
from zbsolve.io.targets.megatron import megatron_schedule
from zbsolve.io.targets.megatron.layout import layout_counts, megatron_layout, parse_layout
from zbsolve.planning.baselines import baseline_plan, baselines
from zbsolve.problem.costs import check_fits, model_costs
from zbsolve.problem.recompute import FULL, Recompute, parse_recompute
from zbsolve.problem.splits import megatron_blocks_per_stage, megatron_uneven_blocks_per_stage
from zbsolve.schedulers.builtins import builtin_schedule
from zbsolve.schedulers.families.classic import interleaved_1f1b

RECIPE_70B = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
RECIPE_MTP = "Et|(tt|)*30mL"


def llm(blocks: int, head: tuple[str, ...] = ("tok_embeddings",), tail: tuple[str, ...] = ("norm", "output"),
        activations: int = 1) -> Model:
    """``head`` layers, ``blocks`` blocks, ``tail`` layers: F = B = W = 1 s; each F allocates ``activations`` bytes,
    half freed by B and half by W; 1/8 GiB of weights each, 16 MiB outputs."""
    def layer(name: str, block: bool) -> Layer:
        return Layer(name=name, block=block, t_f=1.0, t_b=1.0, t_w=1.0, mem_f=activations,
                     mem_b=-(activations // 2), mem_w=-(activations - activations // 2), static_bytes=GIB // 8,
                     out_bytes=GIB // 64)
    return Model(name="llm", layers=[layer(n, False) for n in head]
                 + [layer(f"layers.{i}", True) for i in range(blocks)] + [layer(n, False) for n in tail])


# -- the parser ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, stages", [
    # Megatron-Bridge's Llama-3-70B layout: Et*2 | 34 x t*2 | t*3 | 3 x t*2 | tL (the commas are cosmetic):
    # 40 stages, 80 t.
    (RECIPE_70B, ["Ett"] + ["tt"] * 34 + ["ttt"] + ["tt"] * 3 + ["tL"]),
    # (tt|)*30 ends with a |, so mL is a stage of its own: 1 + 30 + 1 = 32 stages.
    (RECIPE_MTP, ["Et"] + ["tt"] * 30 + ["mL"]),
    # parse_str_to_list's docstring: [["E","t","t","t"]]+[["t","t"]]*29+[["m"],["L"]].
    ("Ettt|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),
    # (t|tt|)*2 -> t|tt|t|tt|, then t*2 -> tt: Ett|t|tt|t|tt|tL.
    ("Et*2|(t|tt|)*2,tL", ["Ett", "t", "tt", "t", "tt", "tL"]),
    # Megatron's comment "(|ab)*2,cd -> |ab|abcd": a group may open with |, so the first stage is empty.
    ("(|tt)*2,tL", ["", "tt", "tttL"]),
    # The group is unrolled first, then each x*n: (t*2)*2 -> t*2t*2 -> tttt.
    ("E(t*2)*2L", ["EttttL"]),
    # x*n repeats any one character, a | too: |*2 -> ||, an empty stage between.
    ("Et|*2tL", ["Et", "", "tL"]),
    ("Et*12|t*0L", ["E" + "t" * 12, "L"]),
])
def test_parse_layout_unrolls_as_megatron(text, stages):
    assert parse_layout(text) == stages


@pytest.mark.parametrize("text, message", [
    ("Ex|tL", r"^layout = 'Ex\|tL': stage 0 \('Ex' unrolled\) has the symbol 'x'; Megatron knows E, t, m and L"),
    ("E(tt|tL", r"stage 0 \('E\(tt' unrolled\) has the symbol '\('"),
    ("Et*|tL", r"has the symbol '\*'"),
    ("Et\n|tL", r"has the symbol '\\n'"),
    ("t*2000000", r"^layout = 't\*2000000' unrolls to more than 1,000,000 symbols$"),
])
def test_parse_layout_refuses_unknown_symbols_in_one_line(text, message):
    with pytest.raises(InputError, match=message) as err:
        parse_layout(text)
    assert "\n" not in str(err.value)


def test_megatron_core_parses_the_same_stages():
    """Where megatron-core is installed, its own parser reads every string above the same way."""
    layout_module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout",
                                        reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from megatron.core.transformer.enums import LayerType

    symbol = {LayerType.embedding: "E", LayerType.decoder: "t", LayerType.mtp: "m", LayerType.loss: "L"}
    for text in (RECIPE_70B, RECIPE_MTP, "Ettt|(tt|)*29,m|L", "Et*2|(t|tt|)*2,tL", "(|tt)*2,tL", "Et|*2tL"):
        theirs = layout_module.PipelineParallelLayerLayout.parse_str_to_list(text)
        assert ["".join(symbol[x] for x in stage) for stage in theirs] == parse_layout(text)


# -- a layout over a model -------------------------------------------------------------------------------------

def test_the_70b_recipe_layout_over_an_80_block_model():
    model = llm(80)
    layout = layout_counts(model, RECIPE_70B, 8)
    # 40 stages on 8 devices: 5 virtual stages each. Stage 0 is E (the embedding, one layer) + 2 blocks; stage 35
    # holds 3 blocks; stage 39 one block + L (norm and head, two layers).
    assert layout.chunks == 5
    assert layout.counts == (3,) + (2,) * 34 + (3,) + (2,) * 3 + (3,)
    assert sum(layout.counts) == len(model.layers)
    # Megatron runs stage i on rank i % pp as virtual stage i // pp: zbsolve's interleaved placement.
    assert interleaved(8, 5).routes[0] == tuple(i % 8 for i in range(40))


@pytest.mark.parametrize("model, text, p, counts, chunks", [
    # One stage per device: E + 3 blocks, then 4 blocks, then 1 block + norm + head.
    (llm(8), "Et*3|t*4|tL", 3, (4, 4, 3), 1),
    # Four stages on two devices (two virtual stages each): Et | t*3 | t*2 | t*2L.
    (llm(8), "Et|t*3|(t*2|)*1,t*2L", 2, (2, 3, 2, 4), 2),
    # A stage of only E and one of only L: the embedding alone, the norm and head alone.
    (llm(4), "E|t*4|L", 3, (1, 4, 2), 1),
    # Two layers before the first block are both the E.
    (llm(4, head=("tok_embeddings", "pos_embeddings")), "Et|t*3L", 2, (3, 5), 1),
    # A model without embedding or head layers: E and L stand for nothing.
    (llm(4, head=(), tail=()), "Et|t*3L", 2, (1, 3), 1),
])
def test_layout_counts_by_hand(model, text, p, counts, chunks):
    assert layout_counts(model, text, p) == (counts, chunks)


def test_layout_counts_reads_back_megatron_layout():
    model = llm(30)
    counts = (4, 4, 4, 4, 4, 4, 4, 5)  # E + 3 blocks first, 2 blocks + norm + head last
    ranges, start = [], 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    text = megatron_layout(model, ranges, 4)
    assert layout_counts(model, text, 4) == (counts, 2)


@pytest.mark.parametrize("model, text, p, message", [
    (llm(80), RECIPE_70B, 3, r"^layout = '.*' has 40 stages, not a multiple of num_devices = 3 \(Megatron places "
                            r"stage i on device i % num_devices\)$"),
    (llm(61), RECIPE_MTP, 8, r"^model llm has no MTP layers \(mtp\.\*\) for the m of layout = 'Et\|\(tt\|\)\*30mL'$"),
    (llm(79), RECIPE_70B, 8, r"^layout = '.*' has 80 t, but model llm has 79 blocks$"),
    (llm(4), "t*4L", 1, r"^layout = 't\*4L': the embedding E must appear once, but appears 0 times$"),
    (llm(4), "EEt*4L", 1, r"the embedding E must appear once, but appears 2 times$"),
    (llm(4), "tEt*3L", 1, r"^layout = 'tEt\*3L': the embedding E must be the first layer, but t is$"),
    (llm(4), "Et*4", 1, r"the loss L must appear once, but appears 0 times$"),
    (llm(4), "Et*3Lt", 1, r"the loss L must be the last layer, but t is$"),
    (llm(4), "Et|*2t*3L", 1, r"^layout = 'Et\|\*2t\*3L': stage 1 is empty; zbsolve times every stage's F, B and W$"),
    (llm(4, head=()), "E|t*4L", 2, r"^layout = 'E\|t\*4L': stage 0 holds only E, for which model llm has no layer; "),
    (llm(4, tail=()), "Et*4|L", 2, r"stage 1 holds only L, for which model llm has no layer"),
    (Model(name="mid", layers=[*llm(1).layers[:2], llm(1).layers[2].model_copy(update={"name": "adapter"}),
                               llm(1).layers[1].model_copy(update={"name": "layers.1"})]),
     "Et|tL", 2, r"^layer adapter \(block = false\) lies between blocks: Megatron's layout has no symbol for it"),
    (llm(4), 7, 1, r"^layout = 7 must be a string"),
    (llm(4), "Et*4L", 0, r"^num_devices = 0 must be an integer >= 1"),
])
def test_layout_counts_refuses_in_one_line(model, text, p, message):
    with pytest.raises(InputError, match=message) as err:
        layout_counts(model, text, p)
    assert "\n" not in str(err.value)


# -- uneven first and last pipeline ranks ----------------------------------------------------------------------

@pytest.mark.parametrize("p, blocks, first, last, chunks, expected", [
    # 40 layers on PP = 4 with 5 first and 5 last: (40 - 5 - 5) / 2 = 15 on each middle rank.
    (4, 40, 5, 5, 1, [5, 15, 15, 5]),
    # 78 layers on PP = 8, first 14, last 16: (78 - 14 - 16) / 6 = 8 on each middle rank.
    (8, 78, 14, 16, 1, [14, 8, 8, 8, 8, 8, 8, 16]),
    # Only the first: 5 - 3 = 2 for the one other rank.
    (2, 5, 3, None, 1, [3, 2]),
    # Only the last: (10 - 1) / 3 = 3 on ranks 0-2.
    (4, 10, None, 1, 1, [3, 3, 3, 1]),
    # Two virtual stages: rank 0 holds 4 = 2 + 2; (22 - 4) / 3 = 6 per middle rank = 3 + 3. Stage s on rank s % 4.
    (4, 22, 4, None, 2, [2, 3, 3, 3, 2, 3, 3, 3]),
    # Three virtual stages, both ends: rank 0 holds 3 (1 each), rank 2 holds 6 (2 each), rank 1 (15 - 9) = 6.
    (3, 15, 3, 6, 3, [1, 2, 2, 1, 2, 2, 1, 2, 2]),
    # The whole model on the first rank of one.
    (1, 7, 7, None, 1, [7]),
])
def test_uneven_first_and_last_ranks_by_hand(p, blocks, first, last, chunks, expected):
    counts = megatron_uneven_blocks_per_stage(p, blocks, first, last, chunks)
    assert counts == expected and sum(counts) == blocks


def test_uneven_without_first_or_last_is_the_even_split():
    assert megatron_uneven_blocks_per_stage(4, 32, chunks=2) == megatron_blocks_per_stage(8, 32, False, False)


@pytest.mark.parametrize("args, message", [
    ((4, 40, 0, 5), r"^num_layers_in_first_pipeline_stage = 0 must be an integer >= 1"),
    ((4, 40, 3, None, 2), r"^num_layers_in_first_pipeline_stage = 3 is not a multiple of chunks = 2"),
    ((4, 40, None, 5, 2), r"^num_layers_in_last_pipeline_stage = 5 is not a multiple of chunks = 2"),
    ((4, 40, 5, 6), r"^num_blocks = 40 leaves 29 blocks besides the first and last ranks' for 2 middle ranks of 1 "
                    r"virtual stages: Megatron needs the same whole number \(> 0\) on each$"),
    ((4, 10, 5, 5), r"leaves 0 blocks besides the first and last ranks' for 2 middle ranks"),
    ((2, 10, 5, 4), r"leaves 1 blocks besides the first and last ranks' for 0 middle ranks"),
    ((3, 8, 6, 6), r"leaves -4 blocks"),
    ((4, 22, 4, None, 3), r"^num_layers_in_first_pipeline_stage = 4 is not a multiple of chunks = 3"),
    # 12 blocks over 3 middle ranks is 4 per rank, which 3 virtual stages do not divide.
    ((4, 15, 3, None, 3), r"leaves 12 blocks besides the first and last ranks' for 3 middle ranks of 3 virtual"),
    ((1, 8, 4, 4), r"^num_devices = 1 cannot hold both a first and a last pipeline rank$"),
])
def test_uneven_refuses_what_megatron_refuses(args, message):
    with pytest.raises(InputError, match=message) as err:
        megatron_uneven_blocks_per_stage(*args)
    assert "\n" not in str(err.value)


# -- Megatron's baselines --------------------------------------------------------------------------------------

SMALL = "Et*3|t*2|t*2|tL"
"""Four stages of llm(8) on two devices: two virtual stages each, 4, 2, 2 and 3 layers."""


@pytest.mark.parametrize("memory", [8, 12, 20])
def test_every_fitting_baseline_is_judged_again_by_the_simulator(memory):
    model = llm(8, activations=GIB)
    p, m, device_memory = 2, 4, memory * GIB
    rows = baselines(model, p, m, device_memory, reserve=0, layout=SMALL)
    assert {("layout", "none"), ("layout", "best"), ("megatron", "best")} <= {
        (r.split, "none" if r.recompute == "none" else "best") for r in rows if r.split in ("layout", "megatron")}
    for row in rows:
        if not row.fits:
            continue
        assert row.step_time is not None and row.memory_gib is not None and row.recomputed is not None
        placement = make_placement(row.placement, p, row.chunks)
        profile, costs = model_costs(model, placement, row.counts, device_memory, 0, parse_recompute(row.recompute))
        timeline = simulate(builtin_schedule(row.schedule, profile, p, m, row.chunks))
        assert timeline.makespan == row.step_time
        assert all(s + a <= device_memory for s, a in zip(costs.static_bytes, timeline.peak_memory))
        assert tuple(sum(a <= i < b for i in costs.recomputed) for a, b in costs.ranges) == row.recomputed
        # Taken as the plan, under the activation budgets, it runs as fast and fits.
        planned, planned_costs, (name, chunks) = baseline_plan(model, p, m, device_memory, 0, row)
        assert (name, chunks) == (row.placement, row.chunks) and planned.makespan == pytest.approx(row.step_time)
        check_fits(planned_costs, planned)


def test_the_best_recompute_num_layers_is_the_fastest_that_fits():
    """At 12 GiB the layout fits neither without recomputation nor with one block per stage; two fit (and every
    block does, slower)."""
    model = llm(8, activations=GIB)
    p, m, device_memory = 2, 4, 12 * GIB
    rows = {(r.split, r.recompute != "none"): r for r in baselines(model, p, m, device_memory, reserve=0,
                                                                   layout=SMALL)}
    plain, best = rows["layout", False], rows["layout", True]
    assert (plain.schedule, plain.chunks, plain.counts) == ("Interleaved1F1B", 2, (4, 2, 2, 3)) and not plain.fits
    assert best.recompute == "uniform:2" and best.fits
    # The first N blocks of every virtual stage: 2, 2, 2 and the last stage's one block.
    assert best.recomputed == (2, 2, 2, 1) and best.row()["recomputed"] == "2*3,1"
    tried = {}
    for recompute in (Recompute("uniform", 1), Recompute("uniform", 2), FULL):
        profile, costs = model_costs(model, interleaved(p, 2), best.counts, device_memory, 0, recompute)
        timeline = simulate(builtin_schedule("Interleaved1F1B", profile, p, m, 2))
        tried[str(recompute)] = (timeline.makespan, costs.first_over(timeline.peak_memory) is None)
    assert not tried["uniform:1"][1] and tried["full"][1]
    assert best.step_time == min(t for t, fits in tried.values() if fits) < tried["full"][0]


def test_the_layouts_best_recomputation_takes_megatrons_modules_too():
    """With an ``mlp`` module that keeps 3/4 of a block's bytes out of F for a tenth of its F, the layout fits at
    12 GiB with it, faster than with the first two blocks of every stage recomputed: the row is the module choice,
    and it is the fastest fitting row of all of Megatron's menu."""
    plain = llm(8, activations=GIB)
    mlp = {"mlp": ModuleCost(t=0.1, mem=3 * GIB // 4)}
    model = Model(name=plain.name, layers=[layer.model_copy(update={"recompute_modules": mlp}) if layer.block
                                           else layer for layer in plain.layers])
    p, m, device_memory = 2, 4, 12 * GIB
    best = [r for r in baselines(model, p, m, device_memory, reserve=0, layout=SMALL) if r.split == "layout"][-1]
    assert best.recompute == "modules:mlp" and best.fits
    rows = [r for r in baselines(plain, p, m, device_memory, reserve=0, layout=SMALL) if r.split == "layout"]
    assert rows[-1].recompute == "uniform:2" and rows[-1].fits and best.step_time < rows[-1].step_time
    # Judged again: Megatron's order on the layout with the module choice, simulated.
    profile, costs = model_costs(model, interleaved(p, 2), best.counts, device_memory, 0,
                                 parse_recompute("modules:mlp"))
    timeline = simulate(builtin_schedule("Interleaved1F1B", profile, p, m, 2))
    assert timeline.makespan == best.step_time and costs.first_over(timeline.peak_memory) is None


def test_megatron_baselines_say_why_they_do_not_run():
    model = llm(8, activations=GIB)
    # m = 3 is not a multiple of p = 2: Megatron's interleaved schedule refuses it.
    rows = [r for r in baselines(model, 2, 3, 80 * GIB, reserve=0, layout=SMALL) if r.split == "layout"]
    assert rows and all(not r.fits and r.step_time is None for r in rows)
    assert all(r.note.startswith("num_microbatches = 3 is not a multiple of num_devices = 2: Megatron (megatron-core "
                                 "0.16.1)'s interleaved schedule") and "(runtime table: megatron.grouped_microbatches)"
               in r.note for r in rows)
    # Nothing fits 1 GiB: the row of every block recomputed, with a note.
    best = [r for r in baselines(model, 2, 4, GIB, reserve=0, layout=SMALL) if r.split == "layout"][-1]
    assert best.recompute == "full" and not best.fits and best.note == "no --recompute-num-layers from 1 to 3 fits"
    with pytest.raises(InputError, match=r"^layout = 'Et\*3\|t\*2\|t\|tL' has 7 t, but model llm has 8 blocks$"):
        baselines(model, 2, 4, 80 * GIB, layout="Et*3|t*2|t|tL")


def test_megatron_schedules_are_torch_builtins_of_megatron_order():
    """torch's Interleaved1F1B with five stages per rank runs Megatron's order pass for pass (m a multiple of p)."""
    assert megatron_schedule(1) == "1F1B" and megatron_schedule(5) == "Interleaved1F1B"
    if not torch_compat.has_pipelining():
        pytest.skip("torch is not installed: nothing to compare with")
    profile, _ = model_costs(llm(15), interleaved(3, 5), "uniform")
    for m in (3, 6, 9):
        assert builtin_schedule("Interleaved1F1B", profile, 3, m, 5).devices == \
            interleaved_1f1b(profile, 3, m, 5).devices


def test_interleaved_with_any_chunks_runs_without_torch(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch_compat, "has_pipelining", lambda: False)
    profile, _ = model_costs(llm(15), interleaved(3, 5), "uniform")
    schedule = builtin_schedule("Interleaved1F1B", profile, 3, 6, 5)
    assert schedule.name == "Interleaved1F1B" and schedule.devices == interleaved_1f1b(profile, 3, 6, 5).devices
    with pytest.raises(InputError, match=r"^schedule = 'ZBVZeroBubble' with 4 stages per device needs torch"):
        builtin_schedule("ZBVZeroBubble", UNIT, 3, 6, 4)


def test_megatron_uneven_split_is_a_baseline_when_its_ends_are_given():
    from conftest import export_toy

    from zbsolve.core.simulator import simulate as sim
    from zbsolve.planning.baselines import baseline_plan
    from zbsolve.planning.baselines import baselines as rows_of

    # 6 blocks on 2 ranks, 4 on the first and 2 on the last: with the embedding and the norm and head, 5 and 4
    # layers; with two virtual stages per rank, 2 + 1 blocks per stage in rank order (stage s on rank s % 2).
    rows = [b for b in rows_of(export_toy(), 2, 4, 10**6, 0, megatron_ends=(4, 2)) if b.split == "megatron-uneven"]
    by_chunks = {b.chunks: b for b in rows if b.recompute == "none"}
    assert by_chunks[1].counts == (5, 4) and by_chunks[2].counts == (3, 1, 2, 3)
    for b in rows:
        if b.fits:
            timeline, costs, _ = baseline_plan(export_toy(), 2, 4, 10**6, 0, b)
            assert sim(timeline.schedule).makespan == timeline.makespan == b.step_time
    bad = [b for b in rows_of(export_toy(), 2, 4, 10**6, 0, megatron_ends=(3, 2)) if b.split == "megatron-uneven"]
    notes = {b.chunks: b.note for b in bad if not b.fits and b.step_time is None}
    assert "leaves 1 blocks" in notes[1] and "3 is not a multiple of chunks = 2" in notes[2]
