"""A zbsolve plan's per-block recomputation applied to torchtitan 0.3.0's own llama3 (its "debugmodel" flavor, on
CPU): exactly the plan's blocks are wrapped (whole: torch's checkpoint wrapper, as torchtitan's FullAC; selective:
the norms' and the SwiGLU product's outputs), the gradients are those of the model without it, the backward
recomputes what the plan says and nothing else, and torchtitan's own ``--override.imports`` puts the policy in
place of its ``activation_checkpoint``."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_llama3

from zbsolve.base.errors import InputError
from zbsolve.core.profile import UNIT
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.model import Layer, Model
from zbsolve.io.document import write_document
from zbsolve.io.targets.plan import read_plan
from zbsolve.optimize.solve import solve
from zbsolve.schedulers.families import make_schedule

pytest.importorskip("torchtitan", reason="torchtitan is not installed (the dev extra pins 0.3.0)")
import torch  # noqa: E402  (torchtitan needs torch)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.config.override import apply_overrides  # noqa: E402
from torchtitan.distributed.activation_checkpoint import FullAC  # noqa: E402
from torchtitan.distributed.pipeline_parallel import _split_module  # noqa: E402

from zbsolve.execute import torchtitan_recompute as tr  # noqa: E402
from zbsolve.execute.memory import SavedBytes  # noqa: E402

BATCH, SEQ_LEN, VOCAB = 2, 16, 2048
"""The debugmodel's vocabulary, and a small batch."""
CHOICES = ("full", "selective", "selective+per-stage:1,2")
"""Every block whole, every block selective, and the first block(s) of each stage whole with the others selective."""


LLAMA3 = import_llama3()
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402


def _toy() -> Model:
    """torchtitan's debugmodel as a partition names it: an embedding, six blocks ``layers.0``..., the final norm and
    the head, the blocks with selective recomputation's figures."""
    def layer(name: str, block: bool) -> Layer:
        return Layer(name=name, block=block, t_f=1.0, t_b=1.0, t_w=0.5, mem_f=4, mem_b=-2, mem_w=-2, static_bytes=10,
                     out_bytes=1, **({"t_sel": 0.1, "mem_sel": 2} if block else {}))

    blocks = [layer(f"layers.{i}", True) for i in range(6)]
    return Model(name="debugmodel", layers=[layer("tok_embeddings", False), *blocks, layer("norm", False),
                                            layer("output", False)])


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A plan of the debugmodel on 2 devices (3 blocks a stage) per recomputation choice of ``CHOICES``."""
    folder = tmp_path_factory.mktemp("plans")
    paths = {}
    for choice in CHOICES:
        paths[choice] = folder / f"{choice.replace(':', '').replace(',', '')}.json"
        solve(_toy(), num_devices=2, num_microbatches=4, solver="heuristic", partition="uniform",
              recompute=choice).to_json(paths[choice])
    return paths


def _build(layers: int = 6) -> torch.nn.Module:
    """torchtitan's llama3 "debugmodel" (its first ``layers`` blocks) on CPU, its weights from seed 0. Its attention
    kernel is torch's SDPA (causal): FlexAttention, the flavor's kernel, has no backward on CPU."""
    config = LLAMA3.model_registry("debugmodel").model
    config.layers = config.layers[:layers]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=SEQ_LEN)
    torch.manual_seed(0)
    model = config.build()
    model.init_weights(buffer_device=None)
    return model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _build()


def _parts(model: torch.nn.Module, doc: Path) -> list[torch.nn.Module]:
    """The model cut into the plan's stages by torchtitan's own ``_split_module``, the head named ``lm_head`` (as
    the export's default rename does)."""
    plan = read_plan(doc, "torchtitan")
    names = [layer.name.replace("output", "lm_head") for layer in plan.model.layers]
    return [_split_module(model, names[a:b]) for a, b in plan.stages]


def _kinds(doc: Path) -> dict[str, str]:
    """The recomputed blocks the document lists, with their kind."""
    data = json.loads(Path(doc).read_text())["partition"]
    names = [layer["name"] for layer in data["layers"]]
    return {**{names[i]: tr.FULL for i in data.get("recompute", [])},
            **{names[i]: tr.SELECTIVE for i in data.get("selective", [])}}


def _blocks(parts: list[torch.nn.Module]) -> dict[str, torch.nn.Module]:
    return {f"layers.{key}": block for part in parts for key, block in part.layers.items()}


@pytest.mark.parametrize("choice", CHOICES)
def test_wraps_exactly_the_plans_blocks(model: torch.nn.Module, documents: dict[str, Path], choice: str) -> None:
    """The plan's blocks, and only those, are wrapped, each as its kind says; parameters and state-dict keys do not
    change, and the parts' other modules are the same objects."""
    kinds = _kinds(documents[choice])
    assert set(kinds.values()) == ({tr.FULL, tr.SELECTIVE} if "+" in choice else {choice})
    parts = _parts(model, documents[choice])
    before = [(dict(part.named_children()), set(part.state_dict()), sum(p.numel() for p in part.parameters()))
              for part in parts]
    plain = _blocks(parts)
    done = tr.apply_recompute(parts, documents[choice])
    assert done == kinds and list(done) == sorted(done, key=lambda n: int(n.split(".")[1]))
    for name, block in _blocks(parts).items():
        kind = kinds.get(name)
        assert isinstance(block, CheckpointWrapper) == (kind == tr.FULL), name
        assert isinstance(block, tr._SelectiveForward) == (kind == tr.SELECTIVE), name
        inner = block._checkpoint_wrapped_module if kind == tr.FULL else block
        assert inner is plain[name] and isinstance(inner, LLAMA3.Llama3TransformerBlock)
    for part, (children, keys, count) in zip(parts, before):
        assert {n: c for n, c in part.named_children() if n != "layers"} == \
               {n: c for n, c in children.items() if n != "layers"}
        assert set(part.state_dict()) == keys and sum(p.numel() for p in part.parameters()) == count


def _step(model: torch.nn.Module, calls: dict[str, int] | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss of one forward and backward of ``model`` on a fixed batch, and every parameter's gradient; with
    ``calls``, how often each block's submodules ran during the backward, by name."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
    target = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
    handles = []
    if calls is not None:
        for name, module in model.named_modules():
            short = name.replace("._checkpoint_wrapped_module", "")
            if short.count(".") == 2 and short.startswith("layers."):
                calls[short] = 0
                handles.append(module.register_forward_hook(
                    lambda *_, key=short: calls.__setitem__(key, calls[key] + 1)))
    loss.backward()
    for handle in handles:
        handle.remove()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("choice", CHOICES)
def test_gradients_are_the_plain_models(model: torch.nn.Module, documents: dict[str, Path], choice: str) -> None:
    """A forward and backward of the model with the plan applied gives the plain model's loss and gradients; in the
    backward a whole block runs its forward again, a selective one only its two norms (and its SwiGLU product, no
    module), and the others nothing."""
    loss, grads = _step(model)
    wrapped = copy.deepcopy(model)
    kinds = tr.apply_recompute(wrapped, documents[choice])
    calls: dict[str, int] = {}
    got_loss, got_grads = _step(wrapped, calls)
    assert torch.allclose(got_loss, loss)
    assert len(got_grads) == len(grads)
    assert all(torch.allclose(got, want, rtol=1e-5, atol=1e-7) for got, want in zip(got_grads, grads))
    for name, count in calls.items():
        block, module = name.rsplit(".", 1)
        kind = kinds.get(block)
        again = kind == tr.FULL or (kind == tr.SELECTIVE and module in ("attention_norm", "ffn_norm"))
        assert count == int(again), (name, kind)


def test_selective_keeps_less_by_the_norms_and_the_product(model: torch.nn.Module) -> None:
    """A selective block's forward keeps (2·dim + hidden)·4 bytes a token fewer for backward (float32): the two
    norms' outputs and the SwiGLU product, as the cost model's ``mem_sel`` has it; a whole one keeps its input."""
    block = model.layers["0"]
    x = model.tok_embeddings(torch.zeros(BATCH, SEQ_LEN, dtype=torch.long)).detach().requires_grad_()

    def kept(module: torch.nn.Module) -> int:
        counter = SavedBytes(exclude=[*module.parameters(), *module.buffers()])
        with counter.hooks():
            out = module(x, None, None)  # its graph holds what the forward kept
        assert out.requires_grad
        return counter.current

    parts = [copy.deepcopy(block) for _ in range(3)]
    plain, selective, full = kept(parts[0]), kept(tr._selective(parts[1])), kept(tr._checkpointed(
        parts[2], True, "default", False))
    dim, hidden = block.ffn_norm.weight.numel(), block.feed_forward.w1.weight.shape[0]
    assert plain - selective == BATCH * SEQ_LEN * (2 * dim + hidden) * 4
    assert full == x.numel() * 4


def test_a_compiled_selective_block_is_the_same(model: torch.nn.Module) -> None:
    """Compiled as torchtitan's ``apply_compile`` compiles a block (``fullgraph=True``; here with the AOT-autograd
    backend that needs no C++ compiler), a selective block gives the plain block's gradients and keeps the bytes
    the eager selective block keeps."""
    x = model.tok_embeddings(torch.zeros(BATCH, SEQ_LEN, dtype=torch.long)).detach().requires_grad_()

    def run(block: torch.nn.Module) -> tuple[int, list[torch.Tensor]]:
        x.grad = None
        counter = SavedBytes(exclude=[*block.parameters(), *block.buffers()])
        with counter.hooks():
            out = block(x, None, None)
        kept = counter.current
        out.pow(2).sum().backward()
        return kept, [x.grad, *(p.grad for p in block.parameters())]

    plain, eager, compiled = (copy.deepcopy(model.layers["0"]) for _ in range(3))
    tr._selective(compiled).compile(backend="aot_eager", fullgraph=True)
    try:
        (_, want), (kept, _), (got_kept, got) = run(plain), run(tr._selective(eager)), run(compiled)
    finally:
        torch._dynamo.reset()
    assert got_kept == kept
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))


def test_a_rank_applies_its_own_parts(model: torch.nn.Module, documents: dict[str, Path]) -> None:
    """With ``all_stages=False`` each part (a pipeline rank's) recomputes the plan's blocks it holds; a part cut
    across the plan's stages is refused, naming the block it lacks."""
    doc = documents["selective+per-stage:1,2"]
    kinds = _kinds(doc)
    for part in _parts(model, doc):
        done = tr.apply_recompute(part, doc, all_stages=False)
        assert done == {name: kind for name, kind in kinds.items() if name in _blocks([part])}
    crossing = _split_module(model, ["layers.2", "layers.3"])
    with pytest.raises(InputError, match=r"^partition: block 'layers\.0' \(full\) of stage 0 is not in the model "
                                         r"parts, which hold layers\.2; cut the parts as the plan's stages"):
        tr.apply_recompute(crossing, doc, all_stages=False)


def test_refusals_name_the_block(model: torch.nn.Module, documents: dict[str, Path]) -> None:
    """A planned block the parts lack, a block the plan does not know, a block recomputed already and a part
    without blocks are refused in one line naming it, before anything is wrapped."""
    doc = documents["full"]
    short = _build(layers=4)
    with pytest.raises(InputError) as error:
        tr.apply_recompute([short], doc)
    assert str(error.value) == ("partition: block 'layers.4' (full) of stage 1 is not in the model parts, which hold "
                                "layers.3; cut the parts as the plan's stages (module_fqns_per_model_part)")
    assert not any(isinstance(block, CheckpointWrapper) for block in short.layers.values())
    extra = copy.deepcopy(model)
    extra.layers["6"] = copy.deepcopy(extra.layers["5"])
    with pytest.raises(InputError, match=r"^model parts: block 'layers\.6' is not a block of the plan's partition "
                                         r"\(layers\.0, layers\.1, layers\.2, \.\.\. \(6 blocks\)\)$"):
        tr.apply_recompute(extra, doc)
    twice = copy.deepcopy(model)
    tr.apply_recompute(twice, doc)
    with pytest.raises(InputError, match=r"^block 'layers\.0' is already recomputed \(CheckpointWrapper\); apply "
                                         r"the plan instead of torchtitan's activation_checkpoint policy"):
        tr.apply_recompute(twice, doc)
    with pytest.raises(InputError, match=r"^model part 0 \(Linear\) has no 'layers'"):
        tr.apply_recompute(torch.nn.Linear(2, 2), doc)


def test_selective_refuses_other_blocks(documents: dict[str, Path]) -> None:
    """Selective recomputation rewrites llama3's block; another block class is refused, naming it."""
    class Other(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    part = torch.nn.Module()
    part.layers = torch.nn.ModuleDict({str(i): Other() for i in range(6)})
    with pytest.raises(InputError, match=r"^partition\.selective: block 'layers\.0' is Other with feed_forward "
                                         r"NoneType; selective recomputation .* Llama3TransformerBlock"):
        tr.apply_recompute(part, documents["selective"])
    done = tr.apply_recompute(part, documents["full"])
    assert set(done.values()) == {tr.FULL} and all(isinstance(b, CheckpointWrapper) for b in part.layers.values())


def test_torchtitans_override_puts_the_policy_in_place(model: torch.nn.Module, documents: dict[str, Path]) -> None:
    """torchtitan's own command line (``--override.imports`` with the plan's path, then a policy for it to
    replace) and override mechanism give ``PlannedAC``, which torchtitan builds and applies to each model part as
    ``parallelize_llama`` does."""
    doc = documents["selective+per-stage:1,2"]
    config = ConfigManager().parse_args([
        "--module", "llama3", "--config", "llama3_debugmodel",
        "--override.imports", f"{tr.OVERRIDE}={json.dumps({'plan': str(doc)})}", "activation-checkpoint:full"])
    apply_overrides(config.override, config)
    policy = config.activation_checkpoint
    assert isinstance(policy, tr.PlannedAC.Config) and policy.plan == str(doc) and policy.preserve_rng_state
    parts = _parts(model, doc)
    for part in parts:
        policy.build(dump_folder="").apply(part)
    kinds = _kinds(doc)
    assert {name: (tr.FULL if isinstance(block, CheckpointWrapper) else tr.SELECTIVE)
            for name, block in _blocks(parts).items() if name in kinds} == kinds
    assert all(type(block) is LLAMA3.Llama3TransformerBlock for name, block in _blocks(parts).items()
               if name not in kinds)


def test_the_override_reads_the_plan_first(tmp_path: Path) -> None:
    """A document without a partition stops the override before torchtitan builds anything."""
    doc = tmp_path / "zbv.json"
    write_document(simulate(make_schedule("zb-v", UNIT, 2, 4)), doc)
    with pytest.raises(InputError, match=r"partition is missing; format 'torchtitan' needs the model's layers"):
        tr.planned_recompute(FullAC.Config(), plan=str(doc))


def test_the_module_imports_without_torch(documents: dict[str, Path]) -> None:
    """Without torch and torchtitan the module imports (registering no policy) and reads a plan's blocks."""
    code = ("import sys; sys.modules['torch'] = sys.modules['torchtitan'] = None\n"
            "import zbsolve.execute.torchtitan_recompute as tr\n"
            "assert not hasattr(tr, 'PlannedAC')\n"
            f"print(tr.planned_blocks({str(documents['selective+per-stage:1,2'])!r}))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == str([(["layers.0", "layers.1", "layers.2"],
                                       {"layers.0": "full", "layers.1": "selective", "layers.2": "selective"}),
                                      (["layers.3", "layers.4", "layers.5"],
                                       {"layers.3": "full", "layers.4": "full", "layers.5": "selective"})])
