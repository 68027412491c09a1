"""Plans of models with experts: small DeepSeek-V3- and Qwen3-MoE-shaped models planned end to end, the MTP layer
placed by the plan and written as Megatron's ``m``, and V-shape plans whose pairs the simulator times."""

from __future__ import annotations

import concurrent.futures as cf
import shlex

import pytest
from conftest import DEEPSEEK as SMALL_DEEPSEEK

import zbsolve
from zbsolve.core.schedule import Pair, pair_count
from zbsolve.core.simulator import simulate
from zbsolve.costmodel.estimate import estimate
from zbsolve.io.targets import export_document

DEEPSEEK = {**SMALL_DEEPSEEK, "num_hidden_layers": 5}
"""DeepSeek-V3-shaped (tests/test_moe_estimate.py's): five blocks (the first dense), one MTP layer."""
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 128, "tie_word_embeddings": False}
"""Qwen3-MoE-shaped: four blocks of eight experts."""


def model(config: dict) -> zbsolve.Model:
    return estimate(config, seq_len=256, microbatch_size=2, ep=8, a2a_link="network")


def test_a_megatron_plan_places_the_mtp_layer_and_exports_it_as_m(tmp_path):
    """The plan for Megatron puts mtp.0 where its layout can say so, and the export writes it as m before L."""
    with cf.ThreadPoolExecutor(1) as pool:  # candidates timed in this process: a worker's start costs more
        result = zbsolve.plan(model(DEEPSEEK), num_devices=2, num_microbatches=4, device_memory="80GiB",
                              target="megatron", time_limit=10, executor=pool)
    names = [layer.name for layer in result.costs.model.layers]
    last = result.costs.ranges[-1]
    assert "mtp.0" in names[last[0]:last[1]]
    assert simulate(result.timeline.schedule).makespan == pytest.approx(result.timeline.makespan)
    path = tmp_path / "plan.json"
    result.to_json(path)
    args = shlex.split(export_document(path, "megatron", None)[1])
    layout = dict(zip(args[::2], args[1::2]))["--pipeline-model-parallel-layout"]
    assert layout.endswith("mL") and layout.count("m") == 1 and layout.startswith("E")


@pytest.mark.parametrize("config", [DEEPSEEK, QWEN3_MOE], ids=["deepseek_v3", "qwen3_moe"])
def test_a_vshape_plan_of_experts_is_timed_with_its_pairs_and_beats_no_baseline_that_fits(config):
    """Nearly all of an expert block's F and B is all-to-all, so an F&BW pair of two such stages hides the W and the
    computation beside it: the plan runs some F and B as pairs, each of two different stages."""
    with cf.ThreadPoolExecutor(1) as pool:  # the search ends long before its limit: every baseline is timed
        result = zbsolve.plan(model(config), num_devices=2, num_microbatches=6, device_memory="80GiB",
                              placement="vshape", time_limit=300, executor=pool)
    timeline = simulate(result.timeline.schedule)
    assert timeline.makespan == pytest.approx(result.step_time)
    assert result.timeline.schedule.profile.communicates()
    fitting = [b.step_time for b in result.baselines if b.fits and b.step_time is not None]
    assert fitting and result.step_time <= min(fitting) * (1 + 1e-9)
    assert 0 <= result.lower_bound <= result.step_time
    schedule = result.timeline.schedule
    assert pair_count(schedule) > 0
    assert all(op.f.stage != op.b.stage for ops in schedule.devices for op in ops if isinstance(op, Pair))
