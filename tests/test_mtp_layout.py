"""Megatron's layout symbol m (a multi-token prediction layer) over DeepSeek-V3's model file: layouts read into
layers per stage and written back (zbsolve.io.targets.megatron.layout), megatron-core 0.16.1's
``validate_layer_layout`` rules on m as one-line errors, and Megatron's own validator where it is installed."""

from __future__ import annotations

from itertools import accumulate

import pytest
from conftest import ROOT

from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Layer, Model
from zbsolve.io.targets.megatron.layout import layer_symbols, layout_counts, megatron_layout
from zbsolve.problem.splits import torchtitan_split

DEEPSEEK = Model.load(ROOT / "problems" / "models" / "deepseek-v3.yaml")
"""tok_embeddings, layers.0..60 (61 blocks), mtp.0, norm, output: 65 layers."""
LLAMA = Model.load(ROOT / "problems" / "models" / "llama3-8b.yaml")
SIXTEEN = "Et*4|(t*4|)*14,tmL"
"""16 stages: E + 4 blocks, 14 x 4 blocks, then 1 block + the MTP layer + the loss (61 t)."""
INTERLEAVED = "Et|(tt|)*30mL"
"""32 stages (4 virtual stages on 8 devices): E + 1 block, 30 x 2 blocks, then a stage of the MTP layer and the loss;
1 + 60 = 61 t, as DeepSeek-V3 has."""


def layer(name: str, block: bool = False) -> Layer:
    return Layer(name=name, block=block, t_f=1.0, t_b=1.0, t_w=1.0, mem_f=1, mem_b=0, mem_w=-1, static_bytes=0,
                 out_bytes=0)


def toy(*names: str) -> Model:
    """Layers of the given names; those named ``layers.*`` are blocks."""
    return Model(name="toy", layers=[layer(n, n.startswith("layers.")) for n in names])


TWO_MTP = toy("tok_embeddings", *(f"layers.{i}" for i in range(4)), "mtp.0", "mtp.1", "norm", "output")


def ranges_of(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    ends = list(accumulate(counts))
    return list(zip([0] + ends[:-1], ends))


def test_deepseek_v3_model_file_has_one_mtp_layer_after_its_blocks():
    assert layer_symbols(DEEPSEEK) == "E" + "t" * 61 + "m" + "LL"
    assert [x.name for x in DEEPSEEK.layers[-3:]] == ["mtp.0", "norm", "output"]


@pytest.mark.parametrize("text, p, counts, chunks", [
    # The first stage holds the embedding and 4 blocks, the last 1 block, mtp.0, norm and output.
    (SIXTEEN, 16, (5,) + (4,) * 14 + (4,), 1),
    # The embedding and one block, 30 stages of two blocks, then mtp.0 + norm + output: stage 31 is device 7's
    # fourth virtual stage, the last, where Megatron keeps the MTP layers.
    (INTERLEAVED, 8, (2,) + (2,) * 30 + (3,), 4),
    # A standalone MTP stage (Megatron's mtp_standalone): device 6's last virtual stage, the loss on device 7.
    ("Et|(tt|)*29,ttm|L", 8, (2,) + (2,) * 29 + (3, 2), 4),
])
def test_layout_counts_with_m(text, p, counts, chunks):
    layout = layout_counts(DEEPSEEK, text, p)
    assert layout == (counts, chunks) and sum(counts) == len(DEEPSEEK.layers)
    a, b = ranges_of(counts)[-1 if "mL" in text else -2]
    assert "mtp.0" in [x.name for x in DEEPSEEK.layers[a:b]]


@pytest.mark.parametrize("text, p, written", [
    (SIXTEEN, 16, "Et*4|" + "t*4|" * 14 + "tmL"),
    (INTERLEAVED, 8, "Et|" + "t*2|" * 30 + "mL"),
    ("Et|(tt|)*29,ttm|L", 8, "Et|" + "t*2|" * 29 + "t*2m|L"),
])
def test_megatron_layout_writes_m_and_reads_back(text, p, written):
    counts, chunks = layout_counts(DEEPSEEK, text, p)
    assert megatron_layout(DEEPSEEK, ranges_of(counts), p) == written
    assert layout_counts(DEEPSEEK, written, p) == (counts, chunks)


def test_default_splits_export_the_mtp_layer_with_the_loss():
    """torchtitan's split of 61 blocks on 16 stages (63 effective layers: 4, 3 less the embedding, 4 x 14, 3 less
    the loss) leaves mtp.0 with norm and output on the last stage."""
    text = megatron_layout(DEEPSEEK, torchtitan_split(DEEPSEEK, 16), 16)
    assert text == "Et*3|" + "t*4|" * 14 + "t*2mL"
    assert layout_counts(DEEPSEEK, text, 16).counts == (4,) + (4,) * 14 + (5,)


@pytest.mark.parametrize("model, text, p, message", [
    (LLAMA, "Et*4|(t*4|)*6,t*4mL", 8, r"^model llama3-8b has no MTP layers \(mtp\.\*\) for the m of layout = "
                                      r"'Et\*4\|\(t\*4\|\)\*6,t\*4mL'$"),
    (DEEPSEEK, "Et*4|(t*4|)*14,tL", 16, r"^layout = '.*' has 0 m, but model deepseek-v3 has 1 MTP layers \(mtp\.\*\); "
                                        r"Megatron needs one m each$"),
    (DEEPSEEK, "Et*4|(t*4|)*14,tmmL", 16, r"^layout = '.*' has 2 m, but model deepseek-v3 has 1 MTP layers"),
    (DEEPSEEK, "Et*4|(t*4|)*14,mtL", 16, r"^layout = '.*': a t follows an m; Megatron places the MTP layers \(m\) "
                                         r"after every decoder layer \(t\)$"),
    (DEEPSEEK, "Et*4|(t*4|)*13,t*3m|t*2L", 16, r"a t follows an m"),
    # Two stages on one device: the m in virtual stage 0, not the device's last.
    (DEEPSEEK, "Et*61m|L", 1, r"^layout = 'Et\*61m\|L': stage 0 holds an m but is not the last virtual stage of "
                              r"device 0; Megatron keeps the MTP layers there$"),
    (TWO_MTP, "Et*4m|mL", 2, r"^layout = 'Et\*4m\|mL': the m lie in stages 0, 1; Megatron keeps all MTP layers in "
                             r"one virtual stage$"),
    (DEEPSEEK, "Et*60|tmL", 3, r"has 2 stages, not a multiple of num_devices = 3"),
])
def test_layout_counts_refuses_m_in_one_line(model, text, p, message):
    with pytest.raises(InputError, match=message) as err:
        layout_counts(model, text, p)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model, message", [
    (toy("tok_embeddings", "layers.0", "mtp.0", "layers.1", "norm"),
     r"^MTP layer mtp\.0 comes before block layers\.1: Megatron places the MTP layers \(m\) after every decoder "
     r"layer \(t\)$"),
    (toy("tok_embeddings", "layers.0", "layers.1", "adapter", "mtp.0", "norm"),
     r"^layer adapter \(block = false\) lies between the last block and the last MTP layer: Megatron's layout has no "
     r"symbol for it \(E, t, m and L only\)$"),
    (toy("tok_embeddings", "layers.0", "mtp.0", "adapter", "mtp.1", "norm"),
     r"^layer adapter \(block = false\) lies between the last block and the last MTP layer"),
    (toy("tok_embeddings", "mtp.0", "norm"), r"^model toy has no blocks \(layers with block = true\)"),
])
def test_layers_out_of_megatron_order_are_refused(model, message):
    for call in (lambda: layer_symbols(model), lambda: megatron_layout(model, [(0, len(model.layers))], 1)):
        with pytest.raises(InputError, match=message) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("model, ranges, p, message", [
    # norm on the MTP stage, output alone: the L is one symbol.
    (DEEPSEEK, [(0, 33), (33, 64), (64, 65)], 3, r"^stage 2 starts at layer output, splitting the layers after the "
                                                 r"last MTP layer \(one L\): Megatron's layout cannot express that"),
    (TWO_MTP, [(0, 6), (6, 9)], 2, r"^stage 1 starts at layer mtp\.1, splitting the MTP layers \(one virtual "
                                   r"stage\): Megatron's layout cannot express that boundary$"),
    # Three stages on one device: the MTP stage is virtual stage 1 of 3.
    (DEEPSEEK, [(0, 62), (62, 63), (63, 65)], 1, r"^stage 1 holds MTP layer mtp\.0 but is not the last virtual "
                                                 r"stage of device 0: Megatron keeps the MTP layers there$"),
])
def test_megatron_layout_refuses_splits_it_cannot_write(model, ranges, p, message):
    with pytest.raises(InputError, match=message) as err:
        megatron_layout(model, ranges, p)
    assert "\n" not in str(err.value)


def test_megatron_validates_the_same_layouts():
    """Where megatron-core is installed, its validator (61 decoder layers, mtp_num_layers = 1) takes every layout
    read and written above and refuses those refused for the m."""
    layout_module = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout",
                                        reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    from megatron.core.transformer.enums import LayerType

    def validate(text: str, p: int, mtp: int | None = 1, blocks: int = 61) -> bool:
        layout = layout_module.PipelineParallelLayerLayout(text, p)
        return layout.validate_layer_layout(num_layers=blocks, mtp_num_layers=mtp)

    for text, p in ((SIXTEEN, 16), (INTERLEAVED, 8), ("Et|(tt|)*29,ttm|L", 8)):
        written = megatron_layout(DEEPSEEK, ranges_of(layout_counts(DEEPSEEK, text, p).counts), p)
        standalone = validate(text, p)
        assert validate(written, p) == standalone == ("m|" in text)
        flat = layout_module.PipelineParallelLayerLayout(text, p).flatten_layout
        assert flat.count(LayerType.mtp) == 1
    for text, p in (("Et*4|(t*4|)*14,tL", 16), ("Et*4|(t*4|)*14,tmmL", 16), ("Et*4|(t*4|)*14,mtL", 16),
                    ("Et*61m|L", 1)):
        with pytest.raises(AssertionError):
            validate(text, p)
    with pytest.raises(AssertionError):
        validate("Et*4m|mL", 2, mtp=2, blocks=4)
    with pytest.raises(AssertionError):
        validate("Et*4|(t*4|)*6,t*4mL", 8, mtp=None, blocks=32)
