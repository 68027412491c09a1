"""Tests of selective recomputation in the runtime's GPT (``Block(selective=True)``, built on
``zbsolve.execute.recompute.recompute_output``): F keeps neither of a block's norm outputs nor its GELU output, the
first backward (B) recomputes each once and keeps it until the graph is freed, W recomputes nothing, and torch's
split backward gives the gradients of the stage without recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")

from zbsolve.base.errors import InputError
from zbsolve.core import torch_compat
from zbsolve.execute.memory import SavedBytes
from zbsolve.execute.modules import GPTSizes, GPTStage, ModelSpec, build_partitioned, build_stages, load_model

HIDDEN, HEADS, SEQ_LEN, BATCH = 32, 2, 8, 2
SIZES = GPTSizes(hidden=HIDDEN, heads=HEADS, vocab=64, seq_len=SEQ_LEN)
PARTITION = (("embed",), ("blocks.0", "blocks.1"), ("norm", "head"))
"""A middle stage of two blocks: its input takes a gradient, so B and W both compute."""
SELECTIVE = ("blocks.0", "blocks.1")
RECOMPUTED = ("ln1", "ln2", "mlp.1")
"""The modules whose outputs a selective block recomputes."""


def _stage(selective: tuple[str, ...]) -> torch.nn.Module:
    return build_partitioned(PARTITION, SIZES, layers=None, seed=0, selective=selective)[1]


def _inputs() -> list[torch.Tensor]:
    """Two microbatches of the middle stage's input."""
    return [torch.randn(BATCH, SEQ_LEN, HIDDEN, generator=torch.Generator().manual_seed(s)).requires_grad_()
            for s in (1, 2)]


def _run(selective: tuple[str, ...]) -> dict:
    """F, F, then B and W of each microbatch (torch's split backward) under the saved-tensor accounting: the bytes
    held after each phase, the calls of the recomputed modules after each phase, and the gradients."""
    stage = _stage(selective)
    assert stage.selective == (bool(selective),) * 2 and stage.recompute == (False, False)
    calls = dict.fromkeys(((i, name) for i in range(2) for name in RECOMPUTED), 0)
    for i, block in enumerate(stage.blocks):
        for name in RECOMPUTED:
            block.get_submodule(name).register_forward_hook(
                lambda *_, key=(i, name): calls.__setitem__(key, calls[key] + 1))
    saved = SavedBytes(stage.parameters())
    xs = _inputs()
    result: dict = {}
    with saved.hooks():
        outs = [stage(x) for x in xs]
    result["F"] = saved.current, dict(calls)
    groups = []
    for x, out in zip(xs, outs):
        with saved.hooks():
            groups.append(torch_compat.backward_input([out], [torch.ones_like(out)], [x], stage.parameters()))
    result["B"] = saved.current, dict(calls)
    for group in groups:
        with saved.hooks():
            torch_compat.backward_weight(stage.parameters(), group)
    del outs, groups
    result["W"] = saved.current, dict(calls)
    result["grads"] = [*(x.grad for x in xs), *(p.grad for p in stage.parameters())]
    return result


@pytest.fixture(scope="module")
def runs() -> dict[bool, dict]:
    return {False: _run(()), True: _run(SELECTIVE)}


def test_selective_gradients_are_the_plain_stages(runs: dict[bool, dict]) -> None:
    plain, selective = runs[False]["grads"], runs[True]["grads"]
    assert len(plain) == len(selective) == 2 + len(list(_stage(()).parameters()))
    for got, want in zip(selective, plain):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want)


def test_f_keeps_neither_norm_outputs_nor_gelu_output(runs: dict[bool, dict]) -> None:
    """Per block and microbatch, F saves two (tokens, hidden) norm outputs and one (tokens, 4 hidden) GELU output
    fewer; B holds what the plain stage holds, and the graph's end frees everything."""
    block = _stage(()).blocks[0]
    tokens = BATCH * SEQ_LEN
    per_block = (2 * block.ln1.normalized_shape[0] + block.mlp[0].out_features) * tokens * 4  # fp32
    microbatches, blocks = len(_inputs()), 2
    assert runs[False]["F"][0] - runs[True]["F"][0] == microbatches * blocks * per_block
    assert runs[True]["B"][0] == runs[False]["B"][0] == runs[False]["F"][0]
    assert runs[True]["W"][0] == runs[False]["W"][0] == 0


def test_each_output_is_recomputed_once_by_b_and_not_by_w(runs: dict[bool, dict]) -> None:
    microbatches = len(_inputs())
    for phase, again in (("F", 0), ("B", 1), ("W", 1)):
        assert set(runs[True][phase][1].values()) == {microbatches * (1 + again)}, phase
        assert set(runs[False][phase][1].values()) == {microbatches}, phase


def test_selective_names_blocks_of_the_gpt_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match=r"^selective names layer 'norm', which is not one of the GPT's 2 blocks"):
        build_partitioned(PARTITION, SIZES, layers=None, seed=0, selective=("norm",))
    with pytest.raises(InputError, match=r"^selective names layer 'blocks\.2', which is not one of the GPT's 2 "):
        build_stages(2, SIZES, layers=2, seed=0, selective=("blocks.2",))
    with pytest.raises(InputError, match=r"^blocks\.1 named by both recompute and selective"):
        build_partitioned(PARTITION, SIZES, layers=None, seed=0, recompute=("blocks.1",), selective=SELECTIVE)
    with pytest.raises(InputError, match=r"^blocks at positions \[0\] are both recomputed and selective"):
        GPTStage(1, embed=False, norm=False, head=False, sizes=SIZES, recompute={0}, selective={0})
    (tmp_path / "zbsolve_test_selective_user.py").write_text("def stages(n):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match=r"selective = blocks\.0, but only the built-in gpt's blocks can be "):
        load_model(ModelSpec("zbsolve_test_selective_user:stages", selective=("blocks.0",)), 2)
    stages = load_model(ModelSpec(partition=PARTITION, selective=("blocks.1",), hidden=HIDDEN, seq_len=SEQ_LEN), 3)
    assert stages.stages[1].selective == (False, True)
