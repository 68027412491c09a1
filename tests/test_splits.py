"""torchtitan's and Megatron's default stage splits and Megatron's layout string: hand-computed expectations, the
frameworks' own code where it is installed, and one-line errors for what they refuse or cannot express."""

from __future__ import annotations

import re

import pytest

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Layer, Model
from zbsolve.problem.partition import check_ranges
from zbsolve.io.targets.megatron.layout import megatron_layout
from zbsolve.problem.splits import (
    megatron_blocks_per_stage,
    megatron_split,
    torchtitan_blocks_per_stage,
    torchtitan_split,
)


def layer(name: str, block: bool = True) -> Layer:
    return Layer(name=name, block=block, t_f=1.0, t_b=1.0, t_w=1.0, mem_f=1, mem_b=0, mem_w=-1, static_bytes=0,
                 out_bytes=0)


def llm(num_blocks: int, head: tuple[str, ...] = ("tok_embeddings",), tail: tuple[str, ...] = ("norm", "output"),
        name: str = "llm") -> Model:
    """``head`` non-block layers, ``num_blocks`` blocks ``layers.0``..., then ``tail`` non-block layers."""
    return Model(name=name, layers=[layer(n, False) for n in head] + [layer(f"layers.{i}") for i in range(num_blocks)]
                 + [layer(n, False) for n in tail])


def blocks_per_stage(model: Model, ranges: list[tuple[int, int]]) -> list[int]:
    return [sum(x.block for x in model.layers[a:b]) for a, b in ranges]


def megatron_counts(layout: str) -> list[tuple[int, int, int]]:
    """(E, t, L) counts per stage of a layout string, parsed as Megatron's ``parse_str_to_list`` does: commas
    dropped, ``(...)*n`` then ``x*n`` unrolled, stages split at ``|``, only E, L, t, m known."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    assert set(text) <= set("ELtm|"), text
    return [(stage.count("E"), stage.count("t"), stage.count("L")) for stage in text.split("|")]


# -- torchtitan ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stages, blocks, first, last, expected", [
    # 34 effective layers over 8: 4 each and 2 over, to stages 0 and 1; stage 0 less 1, stage 7 less 1.
    (8, 32, 1, 1, [4, 5, 4, 4, 4, 4, 4, 3]),
    # 24 effective over 4: 6 each.
    (4, 22, 1, 1, [5, 6, 6, 5]),
    # 25 over 4: 6 each, stage 0 takes the extra one.
    (4, 23, 1, 1, [6, 6, 6, 5]),
    # 23 over 4: 5 each, stages 0-2 take one more.
    (4, 21, 1, 1, [5, 6, 6, 4]),
    # 36 over 8: 4 each, stages 0-3 take one more; 2 off each end.
    (8, 32, 2, 2, [3, 5, 5, 5, 4, 4, 4, 2]),
    (8, 32, 0, 0, [4] * 8),
    # 7 over 7: the first and the last stage hold only the embedding and only norm + head.
    (7, 5, 1, 1, [0, 1, 1, 1, 1, 1, 0]),
    # 5 over 2: 2 each, stage 0 takes the extra one.
    (2, 3, 1, 1, [2, 1]),
    (1, 32, 5, 5, [32]),
])
def test_torchtitan_blocks_per_stage(stages, blocks, first, last, expected):
    assert torchtitan_blocks_per_stage(stages, blocks, first, last) == expected
    assert sum(expected) == blocks


def test_torchtitan_split_ranges():
    model = llm(32)  # tok_embeddings, layers.0..31 (indices 1..32), norm, output: 35 layers
    ranges = torchtitan_split(model, 8)
    assert ranges == [(0, 5), (5, 10), (10, 14), (14, 18), (18, 22), (22, 26), (26, 30), (30, 35)]
    assert [model.layers[a].name for a, _ in ranges] == ["tok_embeddings", "layers.4", "layers.9", "layers.13",
                                                        "layers.17", "layers.21", "layers.25", "layers.29"]
    assert check_ranges(model, ranges) == ranges
    assert torchtitan_split(llm(22), 4) == [(0, 6), (6, 12), (12, 18), (18, 25)]
    assert torchtitan_split(model, 1) == [(0, 35)]


def test_torchtitan_split_stage_of_the_embedding_alone():
    model = llm(5)
    assert torchtitan_split(model, 7) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 8)]
    with pytest.raises(InputError, match=r"^torchtitan's split gives stage 0 no blocks, and model bare has no "
                                         r"layer before its first block$"):
        torchtitan_split(llm(5, head=(), name="bare"), 7)
    with pytest.raises(InputError, match=r"^torchtitan's split gives stage 6 no blocks, and model bare has no "
                                         r"layer after its last block$"):
        torchtitan_split(llm(5, tail=(), name="bare"), 7)


def test_torchtitan_refuses_what_torchtitan_refuses():
    with pytest.raises(InputError, match=r"^num_stages = 8 exceeds torchtitan's 6 effective layers \(4 blocks"):
        torchtitan_split(llm(4), 8)
    with pytest.raises(InputError, match=r"^first_stage_less_layers = 2 exceeds the 1 effective layers per stage"):
        torchtitan_split(llm(5), 7, first_stage_less_layers=2)
    with pytest.raises(InputError, match=r"^last_stage_less_layers = 5 exceeds the 4 effective layers per stage"):
        torchtitan_split(llm(27), 8, last_stage_less_layers=5)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_stages": 0}, "num_stages = 0 must be an integer >= 1"),
    ({"num_stages": True}, "num_stages = True must be an integer >= 1"),
    ({"num_stages": 2.0}, "num_stages = 2.0 must be an integer >= 1"),
    ({"num_stages": 2, "first_stage_less_layers": -1}, "first_stage_less_layers = -1 must be an integer >= 0"),
    ({"num_stages": 2, "last_stage_less_layers": 1.5}, "last_stage_less_layers = 1.5 must be an integer >= 0"),
])
def test_torchtitan_bad_input(kwargs, message):
    with pytest.raises(InputError, match="^" + re.escape(message)) as exc:
        torchtitan_split(llm(8), **kwargs)
    assert "\n" not in str(exc.value)


def test_torchtitan_matches_torchtitan():
    """Where torchtitan is installed, its own generator gives the same blocks per stage."""
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel",
                             reason="torchtitan is not installed (the dev extra pins 0.3.0)")
    generate = getattr(pp, "_generate_llm_fqn_per_model_part", None) or pp.generate_llm_fqn_per_model_part
    for stages in range(1, 13):
        for blocks in range(1, 40):
            for first in range(3):
                for last in range(3):
                    try:
                        theirs = generate(stages, blocks, first, last)
                    except ValueError:
                        with pytest.raises(InputError):
                            torchtitan_blocks_per_stage(stages, blocks, first, last)
                        continue
                    ours = torchtitan_blocks_per_stage(stages, blocks, first, last)
                    assert ours == [sum(m.startswith("layers.") for m in part) for part in theirs]


# -- Megatron --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stages, blocks, embedding, loss, expected", [
    # 30 + 2 = 32 over 8: 4 each, one fewer on the first (embedding) and the last (loss).
    (8, 30, True, True, [3, 4, 4, 4, 4, 4, 4, 3]),
    (4, 22, True, True, [5, 6, 6, 5]),
    (8, 32, False, False, [4] * 8),
    (8, 31, True, False, [3] + [4] * 7),
    (8, 31, False, True, [4] * 7 + [3]),
    # 6 over 6: the first and the last stage hold only the embedding and only the loss.
    (6, 4, True, True, [0, 1, 1, 1, 1, 0]),
    (1, 32, True, True, [32]),
])
def test_megatron_blocks_per_stage(stages, blocks, embedding, loss, expected):
    assert megatron_blocks_per_stage(stages, blocks, embedding, loss) == expected


def test_megatron_matches_megatron():
    """Where megatron-core is installed, its ``get_num_layers_to_build`` gives the same layers per stage (pp ranks
    x virtual stages, stage s = vp_stage * pp + pp_rank) and refuses the same totals."""
    block = pytest.importorskip("megatron.core.transformer.transformer_block",
                                reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from types import SimpleNamespace

    for pp in range(2, 7):
        for vp in (None, 2, 3):
            for blocks in range(1, 30):
                for embedding in (False, True):
                    for loss in (False, True):
                        config = SimpleNamespace(
                            pipeline_model_parallel_layout=None, num_layers_in_first_pipeline_stage=None,
                            num_layers_in_last_pipeline_stage=None, account_for_embedding_in_pipeline_split=embedding,
                            account_for_loss_in_pipeline_split=loss, num_layers=blocks,
                            pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp)
                        stages = pp * (vp or 1)
                        try:
                            theirs = [block.get_num_layers_to_build(config, vp_stage=s // pp if vp else None,
                                                                    pp_rank=s % pp) for s in range(stages)]
                        except AssertionError:
                            with pytest.raises(InputError):
                                megatron_blocks_per_stage(stages, blocks, embedding, loss)
                            continue
                        assert megatron_blocks_per_stage(stages, blocks, embedding, loss) == theirs


def test_megatron_split_ranges():
    model = llm(30)  # 33 layers
    assert megatron_split(model, 8) == [(0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 24), (24, 28), (28, 33)]
    assert megatron_split(llm(22), 4) == [(0, 6), (6, 12), (12, 18), (18, 25)]
    assert megatron_split(llm(4), 6) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 7)]


def test_megatron_refuses_an_uneven_split():
    with pytest.raises(InputError, match=re.escape("num_stages = 8 does not divide Megatron's 34 layers (32 blocks + "
                                                   "embedding + loss)")):
        megatron_split(llm(32), 8)
    with pytest.raises(InputError, match=re.escape("num_stages = 4 does not divide Megatron's 22 layers (22 blocks)")):
        megatron_split(llm(22), 4, account_for_embedding=False, account_for_loss=False)
    with pytest.raises(InputError, match=r"^account_for_loss = 'yes' must be true or false$"):
        megatron_split(llm(22), 4, account_for_loss="yes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^model flat has no blocks"):
        megatron_split(Model(name="flat", layers=[layer("a", False), layer("b", False)]), 2)


# -- Megatron's layout string ----------------------------------------------------------------------------------

def test_megatron_layout_strings():
    model = llm(32)
    ranges = torchtitan_split(model, 8)
    assert megatron_layout(model, ranges, 8) == "Et*4|t*5|t*4|t*4|t*4|t*4|t*4|t*3L"
    assert megatron_layout(model, ranges, 4) == "Et*4|t*5|t*4|t*4|t*4|t*4|t*4|t*3L"  # 2 virtual stages each
    assert megatron_layout(model, [(0, 35)], 1) == "Et*32L"
    small = llm(5)
    assert megatron_layout(small, torchtitan_split(small, 7), 7) == "E|t|t|t|t|t|L"
    # Without an embedding or head layer in the model, E and L still open and close the layout.
    bare = llm(4, head=(), tail=())
    assert megatron_layout(bare, [(0, 1), (1, 4)], 2) == "Et|t*3L"
    for layout, cut, m in (("Et*4|t*5|t*4|t*4|t*4|t*4|t*4|t*3L", ranges, model),
                           ("E|t|t|t|t|t|L", torchtitan_split(small, 7), small)):
        counts = megatron_counts(layout)
        assert [t for _, t, _ in counts] == blocks_per_stage(m, cut)
        assert [e for e, _, _ in counts] == [1] + [0] * (len(cut) - 1)
        assert [x for _, _, x in counts] == [0] * (len(cut) - 1) + [1]


def test_megatron_layout_of_megatron_split_round_trips():
    model = llm(30)
    ranges = megatron_split(model, 8)
    layout = megatron_layout(model, ranges, 4)
    assert layout == "Et*3|t*4|t*4|t*4|t*4|t*4|t*4|t*3L"
    assert [t for _, t, _ in megatron_counts(layout)] == megatron_blocks_per_stage(8, 30)


def test_megatron_layout_refuses_what_it_cannot_express():
    model = llm(32)
    with pytest.raises(InputError, match=r"^num_devices = 3 does not divide the 8 stages"):
        megatron_layout(model, torchtitan_split(model, 8), 3)
    with pytest.raises(InputError, match=r"^num_devices = 0 must be an integer >= 1"):
        megatron_layout(model, torchtitan_split(model, 8), 0)
    # norm on one stage, the head on the next: the L is one symbol.
    with pytest.raises(InputError, match=r"^stage 2 starts at layer output, splitting the layers after the last "
                                         r"block \(one L\)"):
        megatron_layout(model, [(0, 20), (20, 34), (34, 35)], 3)
    two_heads = llm(4, head=("tok_embeddings", "pos_embeddings"))
    with pytest.raises(InputError, match=r"^stage 1 starts at layer pos_embeddings, splitting the layers before the "
                                         r"first block \(one E\)"):
        megatron_layout(two_heads, [(0, 1), (1, 8)], 2)
    assert megatron_layout(two_heads, [(0, 2), (2, 8)], 2) == "E|t*4L"
    middle = Model(name="mid", layers=[layer("tok_embeddings", False), layer("layers.0"), layer("adapter", False),
                                       layer("layers.1"), layer("norm", False)])
    with pytest.raises(InputError, match=r"^layer adapter \(block = false\) lies between blocks"):
        megatron_layout(middle, [(0, 2), (2, 5)], 2)
    with pytest.raises(InputError, match=r"^stage 1 = \[3, 9\) ends past the last layer"):
        megatron_layout(llm(4), [(0, 3), (3, 9)], 2)


MEGATRON_CASES = [
    (llm(32), torchtitan_split(llm(32), 8), 4),
    (llm(32), torchtitan_split(llm(32), 8), 8),
    (llm(30), megatron_split(llm(30), 8), 2),
    (llm(5), torchtitan_split(llm(5), 7), 7),
    (llm(22), torchtitan_split(llm(22), 4), 1),
]


@pytest.mark.parametrize("model, ranges, devices", MEGATRON_CASES)
def test_megatron_parses_the_layout(model, ranges, devices):
    """Where megatron-core is installed, its parser accepts the string and reads the same blocks per stage."""
    layout_module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout",
                                        reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from megatron.core.transformer.enums import LayerType

    text = megatron_layout(model, ranges, devices)
    layout = layout_module.PipelineParallelLayerLayout(text, devices)
    layout.validate_layer_layout(num_layers=sum(x.block for x in model.layers), mtp_num_layers=None)
    assert layout.virtual_pipeline_model_parallel_size == len(ranges) // devices
    # layout.layout[pp_rank][vpp_rank]: stage s = vpp_rank * pp + pp_rank, the looped placement.
    per_stage = [layout.layout[s % devices][s // devices].count(LayerType.decoder) for s in range(len(ranges))]
    assert per_stage == blocks_per_stage(model, ranges)
