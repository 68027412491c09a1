"""Megatron-LM's recomputed modules (``--recompute-modules``): the estimate's figures for each module a block has,
the grammar ``modules:M,M,...``, the costs they give a block, documents that record them, Megatron's auto menu and
its export, checked with megatron-core's own ``TransformerConfig``."""

from __future__ import annotations

import json
import re

import pytest
from conftest import DEEPSEEK, LLAMA, MIXTRAL, QWEN2_MOE
from typer.testing import CliRunner

from zbsolve import solve
from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.base.units import GIB
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.estimate import estimate
from zbsolve.costmodel.hf_config import architecture
from zbsolve.costmodel.model import OP_POLICY, RECOMPUTE_MODULES, Layer, ModuleCost
from zbsolve.io.targets.megatron import megatron_recompute
from zbsolve.io.targets.plan import read_plan
from zbsolve.io.targets.zbsolve import ZBSOLVE
from zbsolve.planning.targets import may_take, recompute_choices
from zbsolve.problem.costs import check_fits
from zbsolve.problem.recompute import Recompute, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs, stage_costs

S, B, TP = 64, 2, 2
NESTED_IN_MOE = ("moe_act", "shared_experts")


def small(config: dict, **options):
    return estimate(config, seq_len=S, microbatch_size=B, tp=TP, **options)


def test_the_grammar_reads_writes_and_refuses_modules_by_name():
    choice = parse_recompute("modules:mlp, mla_up_proj")
    assert choice == Recompute("none", modules=("mla_up_proj", "mlp")) and str(choice) == "modules:mla_up_proj,mlp"
    assert parse_recompute(str(choice)) == choice and not choice.selective and choice.mode == "none"
    for text in ("modules:" + name for name in RECOMPUTE_MODULES):
        assert str(parse_recompute(text)) == text
    with pytest.raises(InputError, match=re.escape("recompute = 'modules:mlp,attn': module 'attn' should be one of "
                                                   + ", ".join(RECOMPUTE_MODULES))):
        parse_recompute("modules:mlp,attn")
    with pytest.raises(InputError, match="module moe_act runs inside moe"):
        parse_recompute("modules:moe,moe_act")
    with pytest.raises(InputError, match="module '' should be one of"):
        parse_recompute("modules:")


@pytest.mark.parametrize("config, dense, experts", [
    (LLAMA, {"core_attn", "mlp"}, set()),
    (MIXTRAL, set(), {"core_attn", "layernorm", "moe", "moe_act"}),
    (QWEN2_MOE, {"core_attn", "mlp"}, {"core_attn", "layernorm", "moe", "moe_act", "shared_experts"}),
    (DEEPSEEK, {"core_attn", "layernorm", "mla_up_proj", "mlp"},
     {"core_attn", "layernorm", "mla_up_proj", "moe", "moe_act", "shared_experts"}),
], ids=["llama", "mixtral", "qwen2-moe", "deepseek-v3"])
def test_each_block_has_the_modules_megatron_builds_it_with(config, dense, experts):
    """Transformer Engine's specs fuse grouped-query attention's and a dense MLP's norms into the next matmul:
    ``layernorm`` only where latent attention or experts keep a norm of their own; the ``mlp`` of dense blocks, the
    ``moe`` modules of expert blocks, ``mla_up_proj`` with latent attention. Layers that are no block have none."""
    model = small(config)
    found = {frozenset(set(layer.recompute_modules) - {OP_POLICY}) for layer in model.layers if layer.block}
    assert found == {frozenset(s) for s in (dense, experts) if s}
    assert all((OP_POLICY in layer.recompute_modules) == (not layer.experts and not config.get("q_lora_rank"))
               for layer in model.layers if layer.block)
    assert all(layer.recompute_modules is None for layer in model.layers if not layer.block)


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL, QWEN2_MOE, DEEPSEEK], ids=["llama", "mixtral", "qwen2-moe",
                                                                          "deepseek-v3"])
@pytest.mark.parametrize("flash", [True, False])
def test_every_module_adds_time_and_all_of_them_cost_less_than_the_whole_forward(config, flash):
    """Each module adds time to B; each saves bytes but the attention core under flash attention (its probabilities
    are not kept); every module of a block together (``moe`` for what it contains) adds less time than the block's
    forward and saves less than all it keeps but its input, as whole recomputation does; a module inside ``moe``
    saves less than it."""
    model = small(config, flash_attention=flash)
    for index, layer in enumerate(model.layers):
        if not layer.block:
            continue
        mods = {name: cost for name, cost in layer.recompute_modules.items() if name != OP_POLICY}
        assert all(cost.t > 0 for cost in mods.values())
        assert all(cost.mem > 0 for name, cost in mods.items() if name != "core_attn")
        assert (mods["core_attn"].mem == 0) == flash
        chosen = [name for name in mods if name not in NESTED_IN_MOE]
        whole = layer_costs(model, index, recomputes=True)
        every = layer_costs(model, index, recomputes=False, modules=chosen)
        assert every["t_b"] < whole["t_b"] and every["mem_f"] > whole["mem_f"]
        assert every["t_b"] == pytest.approx(layer.t_b + sum(mods[n].t for n in chosen))
        assert every["mem_f"] == layer.mem_f - sum(mods[n].mem for n in chosen)
        assert every["mem_f"] + every["mem_b"] + every["mem_w"] == 0
        assert every["mem_r"] == layer.mem_f - every["mem_f"]
        for inner in set(NESTED_IN_MOE) & set(mods):
            assert mods[inner].mem < mods["moe"].mem


def test_the_closed_forms_of_a_dense_block():
    """Per token over tp: ``mlp`` drops the fused norm's output and the SwiGLU's 3·f, and runs the MLP's F again
    (its 2·3·h·f FLOPs and two collectives); the attention core without flash attention drops its probabilities."""
    model, arch = small(LLAMA, flash_attention=False), architecture(LLAMA)
    h, f, a, e, tokens = arch.hidden, arch.ffn, arch.heads, 2, S * B
    mods = model.layers[1].recompute_modules
    assert mods["mlp"].mem == tokens * e * (h + 3 * f) // TP
    assert mods["core_attn"].mem == tokens * e * a * S // TP
    no_tp = estimate(LLAMA, seq_len=S, microbatch_size=B, flash_attention=False, efficiency=0.4)
    mlp_flops = tokens * 2 * 3 * h * f
    assert no_tp.layers[1].recompute_modules["mlp"].t == pytest.approx(mlp_flops / no_tp.layers[1].flops_f
                                                                       * no_tp.layers[1].t_f)


def test_moe_runs_the_all_to_all_again():
    model = small(DEEPSEEK, ep=2)
    index = next(i for i, layer in enumerate(model.layers) if layer.block and layer.experts)
    layer = model.layers[index]
    assert layer_costs(model, index, False, modules=("moe",))["comm_b"] == layer.comm_b + layer.comm_f
    assert layer_costs(model, index, False, modules=("moe_act",))["comm_b"] == layer.comm_b


def test_a_choice_needs_the_figures_and_a_block_with_the_module():
    model = small(LLAMA)
    with pytest.raises(InputError, match="recompute = 'modules:mla_up_proj': no block of model .* has module "
                                         "mla_up_proj \\(its blocks have core_attn, mlp\\)"):
        parse_recompute("modules:mla_up_proj").module_names(model)
    bare = model.model_copy(update={"layers": [layer.model_copy(update={"recompute_modules": None})
                                               for layer in model.layers]})
    with pytest.raises(InputError, match="layer layers.0 has no recompute_modules"):
        parse_recompute("modules:mlp").module_names(bare)
    with pytest.raises(ValueError, match="recompute_modules: 'attn' should be one of"):
        Layer(name="x", t_f=1, t_b=1, t_w=1, mem_f=2, mem_b=0, mem_w=-2, static_bytes=0, out_bytes=0,
              recompute_modules={"attn": ModuleCost(t=0.1, mem=1)})
    with pytest.raises(ValueError, match="recompute_modules.mlp.mem = 3 must be at most mem_f = 2"):
        Layer(name="x", t_f=1, t_b=1, t_w=1, mem_f=2, mem_b=0, mem_w=-2, static_bytes=0, out_bytes=0,
              recompute_modules={"mlp": {"t": 0.1, "mem": 3}})


def test_a_document_records_the_modules_and_is_checked(tmp_path):
    model = small(DEEPSEEK, ep=2)
    result = solve(model, num_devices=2, num_microbatches=4, recompute="modules:mla_up_proj,mlp", solver="heuristic",
                   device_memory=80 * GIB, reserve=0)
    assert result.costs.modules == ("mla_up_proj", "mlp") and not result.costs.recomputed
    ranges = result.costs.ranges
    assert result.schedule.profile.t_b == pytest.approx(
        [stage_costs(model, a, b, (), (), ("mla_up_proj", "mlp"))["t_b"] for a, b in ranges])
    check_fits(result.costs, simulate(result.schedule))
    path = tmp_path / "plan.json"
    result.to_json(path)
    data = json.loads(path.read_text())
    assert data["partition"]["modules"] == ["mla_up_proj", "mlp"]
    run = CliRunner().invoke(app, ["check", str(path)])
    assert run.exit_code == 0, run.output
    for modules, message in ((["mlp"], "profile.t_b[0] = "),
                             (["mla"], "partition.modules: recompute = 'modules:mla': module 'mla' should be one of")):
        path.write_text(json.dumps({**data, "partition": {**data["partition"], "modules": modules}}))
        run = CliRunner().invoke(app, ["check", str(path)])
        assert run.exit_code == 2 and message in " ".join(run.output.split()), run.output


def test_megatrons_auto_menu_keeps_the_recipes_the_model_has_and_that_save_bytes():
    """Llama's blocks have no latent attention nor experts, and its attention core saves nothing under flash
    attention; DeepSeek-V3's have the recipes' modules. The other targets time no module choice and refuse one."""
    llama, deepseek = small(LLAMA), small(DEEPSEEK, ep=2)
    assert [c for c in recompute_choices("megatron", "auto", llama) if c.startswith("modules:")] == ["modules:mlp"]
    assert [c for c in recompute_choices("megatron", "auto", deepseek) if c.startswith("modules:")] == [
        "modules:mlp", "modules:mla_up_proj,mlp", "modules:layernorm,moe_act"]
    assert "modules:core_attn" in recompute_choices("megatron", "auto", small(LLAMA, flash_attention=False))
    for target in ("zbsolve", "torchtitan"):
        assert not any(c.startswith("modules:") for c in recompute_choices(target, "auto", deepseek))
        with pytest.raises(InputError, match=rf"runtime table: {target}.modules\); use --target megatron"):
            recompute_choices(target, "modules:mlp", deepseek)
    assert may_take("megatron", "auto", "modules:mlp") and not may_take("zbsolve", "auto", "modules:mlp")


def _exported(tmp_path, model, recompute: str) -> list[str]:
    """Megatron's recomputation arguments of a two-device plan of ``model`` that recomputes as ``recompute``."""
    result = solve(model, num_devices=2, num_microbatches=4, recompute=recompute, solver="heuristic")
    path = tmp_path / "plan.json"
    result.to_json(path)
    plan = read_plan(path, "megatron")
    with pytest.raises(InputError, match=r"partition.modules = .*runtime table: zbsolve.modules"):
        plan.check(ZBSOLVE)
    return megatron_recompute(plan)


# megatron-core 0.16.1 warns of its own default cuda_graph_scope and of core_attn with fused attention.
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("config, choices", [
    (LLAMA, ["modules:core_attn", "modules:mlp", "modules:core_attn,mlp"]),
    (DEEPSEEK, ["modules:mla_up_proj,mlp", "modules:layernorm,moe_act", "modules:moe,layernorm",
                "modules:shared_experts,core_attn"]),
], ids=["llama", "deepseek-v3"])
def test_megatron_core_takes_the_exported_modules_and_refuses_what_zbsolve_refuses(tmp_path, config, choices):
    """The export writes exactly --recompute-granularity selective --recompute-modules (and --moe-grouped-gemm with
    moe_act), which megatron-core's TransformerConfig takes for the model's kind; a module zbsolve refuses for the
    model (latent attention's, the experts') is one TransformerConfig refuses too, as it does an unknown name."""
    core = pytest.importorskip("megatron.core.transformer.transformer_config",
                               reason="megatron-core is not installed (the dev extra pins 0.16.1)")
    model = small(config, **({"ep": 2} if "n_routed_experts" in config else {}))
    kind = {"multi_latent_attention": "q_lora_rank" in config,
            **({"num_moe_experts": 8} if "n_routed_experts" in config else {})}

    def made(flags: list[str]):
        modules = flags[flags.index("--recompute-modules") + 1:]
        grouped = "--moe-grouped-gemm" in modules
        modules = [name for name in modules if name != "--moe-grouped-gemm"]
        return core.TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, moe_grouped_gemm=grouped,
                                      recompute_granularity=flags[flags.index("--recompute-granularity") + 1],
                                      recompute_modules=modules, **kind)

    for choice in choices:
        flags = _exported(tmp_path, model, choice)
        names = list(parse_recompute(choice).modules)
        assert flags == ["--recompute-granularity", "selective", "--recompute-modules", *names,
                         *(["--moe-grouped-gemm"] if "moe_act" in names else [])]
        assert made(flags).recompute_modules == names
    for refused_choice in (["mla_up_proj"] if not kind["multi_latent_attention"] else []) + (
            ["moe_act"] if "num_moe_experts" not in kind else []):
        with pytest.raises(InputError, match=f"has module {refused_choice}"):
            parse_recompute(f"modules:{refused_choice}").module_names(model)
        with pytest.raises(ValueError, match=refused_choice):
            core.TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, recompute_granularity="selective",
                                   recompute_modules=[refused_choice], **kind)
    with pytest.raises(AssertionError, match="Invalid choices for recompute_modules"):
        core.TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, recompute_granularity="selective",
                               recompute_modules=["attn"], **kind)
