"""The model description: its partitions into stages, the per-stage profile (exact sums of the layers'), static
bytes with tied weights, and one-line errors for bad partitions and bad model files."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import ROOT, TOY_LAYERS, toy
from zbsolve.base.errors import InputError
from zbsolve.costmodel.model import Layer, Link, Model
from zbsolve.problem.partition import check_ranges, comm_time, held_static_bytes, partition, stage_profile
from zbsolve.core.profile import MEM_FIELDS, TIME_FIELDS

MODELS = sorted((ROOT / "problems" / "models").glob("*.yaml"))


# -- partitions ------------------------------------------------------------------------------------------------
def test_uniform_puts_the_embedding_first_and_the_head_last():
    model = toy()
    assert partition(model, 1) == [(0, 8)]
    # Five blocks on two stages: three on the first (with the embedding), two on the last (with norm and head).
    assert partition(model, 2) == [(0, 4), (4, 8)]
    assert partition(model, 5) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 8)]
    names = [[model.layers[i].name for i in range(a, b)] for a, b in partition(model, 3)]
    assert names == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3"],
                     ["layers.4", "norm", "output"]]


def test_counts_as_text_or_list():
    model = toy()
    assert partition(model, 3, "2,3,3") == partition(model, 3, [2, 3, 3]) == [(0, 2), (2, 5), (5, 8)]
    assert partition(model, 2, " 1, 7 ") == [(0, 1), (1, 8)]


def test_stage_profile_is_the_exact_sum_of_its_layers():
    model = toy(t_comm=0.25)
    for ranges in (partition(model, 3), partition(model, 2, [2, 6]), partition(model, 6, [2, 1, 1, 1, 1, 2])):
        profile = stage_profile(model, ranges)
        assert profile.num_stages == len(ranges) and profile.t_comm == 0.25
        for name in TIME_FIELDS + MEM_FIELDS:
            assert getattr(profile, name) == [sum(getattr(model.layers[i], name) for i in range(a, b))
                                              for a, b in ranges]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_model_files_give_profiles_of_exact_sums(path):
    model = Model.load(path)
    for stages in (2, 4, 8):
        ranges = partition(model, stages)
        profile = stage_profile(model, ranges)
        for name in MEM_FIELDS:
            assert getattr(profile, name) == [sum(getattr(model.layers[i], name) for i in range(a, b))
                                              for a, b in ranges]
        assert profile.t_f == [sum(model.layers[i].t_f for i in range(a, b)) for a, b in ranges]
        boundary = model.layers[ranges[0][1] - 1].out_bytes
        assert profile.t_comm == pytest.approx(boundary / model.link.bytes_per_s + model.link.latency_s)


def test_comm_time_from_the_link_at_the_largest_boundary():
    link = Link(name="test", bytes_per_s=1000.0, latency_s=0.5)
    model = toy(link=link)
    # Boundaries after layers.0 (out 501 bytes) and layers.3 (504 bytes): the larger counts.
    assert comm_time(model, [(0, 2), (2, 5), (5, 8)]) == 504 / 1000 + 0.5
    assert comm_time(model, [(0, 8)]) == 0.0
    assert comm_time(toy(), [(0, 2), (2, 8)]) == 0.0
    assert comm_time(toy(t_comm=0.125), [(0, 2), (2, 8)]) == 0.125


def test_tied_weights_held_once_per_stage():
    model = toy()
    static = [layer["static_bytes"] for layer in TOY_LAYERS]
    assert held_static_bytes(model.layers) == sum(static) - static[-1]
    assert [held_static_bytes(model.layers[a:b]) for a, b in ((0, 4), (4, 8))] == [sum(static[:4]), sum(static[4:])]


def test_flops_per_token_needs_flops_and_a_setting():
    with pytest.raises(InputError, match="^model toy: layer tok_embeddings has no FLOPs"):
        toy().total_flops()
    with pytest.raises(InputError, match="^model toy has no setting"):
        toy().flops_per_token()


@pytest.mark.parametrize("spec, stages, message", [
    ("2,3", 3, "partition = '2,3': 2 stages, but num_stages = 3"),
    ([2, 3, 2], 3, "partition = [2, 3, 2]: the counts sum to 7, but toy has 8 layers"),
    ("4,0,4", 3, "partition = '4,0,4': stage 1 has 0 layers; each stage needs a whole number >= 1"),
    ([4, 2.0, 2], 3, "partition = [4, 2.0, 2]: stage 1 has 2.0 layers"),
    ("4;4", 2, "partition = '4;4': should be 'uniform', 'balanced' or comma-separated layer counts per stage"),
    ("even", 2, "partition = 'even': should be 'uniform', 'balanced' or comma-separated"),
    ("uniform", 6, "partition = 'uniform': toy has 5 blocks, fewer than num_stages = 6"),
    ("uniform", 0, "num_stages = 0 must be an integer >= 1"),
])
def test_bad_partitions(spec, stages, message):
    with pytest.raises(InputError, match="^" + re.escape(message)) as exc:
        partition(toy(), stages, spec)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("ranges, message", [
    ([(0, 3), (4, 8)], "stage 1 = [4, 8): should start at layer 3 (every layer once, in order)"),
    ([(0, 4), (3, 8)], "stage 1 = [3, 8): should start at layer 4"),
    ([(1, 8)], "stage 0 = [1, 8): should start at layer 0"),
    ([(0, 4), (4, 4), (4, 8)], "stage 1 = [4, 4) is empty; every stage needs at least one layer"),
    ([(0, 4), (4, 9)], "stage 1 = [4, 9) ends past the last layer: toy has 8 layers"),
    ([(0, 4), (4, 7)], "stages cover layers [0, 7), but toy has 8 layers"),
    ([], "stages cover layers [0, 0), but toy has 8 layers"),
    ([(0, 4, 8)], "stage 0 = (0, 4, 8): should be a pair of layer indices [first, end)"),
])
def test_bad_ranges(ranges, message):
    with pytest.raises(InputError, match="^" + re.escape(message)):
        check_ranges(toy(), ranges)
    with pytest.raises(InputError, match="^" + re.escape(message)):
        stage_profile(toy(), ranges)


def test_a_stage_without_b_time_is_named():
    with pytest.raises(InputError, match=re.escape("stage 0 (tok_embeddings) has t_b = 0: every stage "
                                                   "needs positive F, B and W times")):
        stage_profile(toy(), [(0, 1), (1, 8)])


# -- files -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_save_and_load(tmp_path, suffix):
    model = toy(link=Link(name="nvlink", bytes_per_s=450e9, latency_s=1e-5), source="by hand")
    model.save(tmp_path / f"m{suffix}")
    assert Model.load(tmp_path / f"m{suffix}") == model


def bad_file(tmp_path, edit) -> str:
    """The error line of loading the toy model's file after ``edit`` (a function of its data)."""
    data = toy().model_dump(exclude_none=True)
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InputError) as exc:
        Model.load(path)
    assert "\n" not in str(exc.value)
    return str(exc.value).removeprefix(f"{path}: ")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["layers"][2].update(t_f=-1.0), "layers.2.t_f = -1.0: should be greater than or equal to 0"),
    (lambda d: d["layers"][2].update(t_w=float("nan")), "layers.2.t_w = nan: should be a finite number"),
    (lambda d: d["layers"][1].update(mem_f=1.5), "layers.1.mem_f = 1.5: should be a valid integer"),
    (lambda d: d["layers"][1].update(mem_w=5, mem_b=-1006), "layers.1.mem_w = 5: should be less than or equal to 0"),
    (lambda d: d["layers"][1].update(mem_b=0), "layers.1: mem_f + mem_b + mem_w = 1001 + 0 + -400 = 601, must be 0"),
    (lambda d: d["layers"][1].update(static_bytes="1 GB"), "layers.1.static_bytes = '1 GB': should be a valid integer"),
    (lambda d: d["layers"][1].update(colour="red"), "layers.1.colour = 'red': unknown key"),
    (lambda d: d["layers"][1].pop("t_b"), "layers.1.t_b is missing"),
    (lambda d: d["layers"][3].update(name="layers.0"), "layer names must be unique: layers.0 appear more than once"),
    (lambda d: d["layers"][7].update(shares="embedding"),
     "layer output: shares = 'embedding' must name another layer"),
    (lambda d: d.update(layers=[]), "layers = []: list should have at least 1 item after validation, not 0"),
    (lambda d: d.update(t_comm=0.1, link={"bytes_per_s": 1e9}), "give t_comm or link, not both"),
    (lambda d: d.update(link={"bytes_per_s": 0}), "link.bytes_per_s = 0: should be greater than 0"),
    (lambda d: d.update(setting={"seq_len": 1024, "microbatch_size": 1, "zero": 2}),
     "setting.zero = 2: should be 0, 1 or 3"),
])
def test_bad_model_files(tmp_path, edit, message):
    assert bad_file(tmp_path, edit) == message


def test_whole_floats_are_bytes(tmp_path):
    path = tmp_path / "m.yaml"
    data = toy().model_dump(exclude_none=True)
    data["layers"][1]["static_bytes"] = 1e9
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert Model.load(path).layers[1].static_bytes == 10**9


def test_layer_error_without_a_file():
    with pytest.raises(InputError, match=r"^layer: mem_f \+ mem_b \+ mem_w = 1 \+ 0 \+ 0 = 1, must be 0$"):
        Layer(name="x", t_f=1.0, t_b=1.0, t_w=1.0, mem_f=1, mem_b=0, mem_w=0, static_bytes=0, out_bytes=0)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_model_files_give_problems_the_optimizer_takes(path):
    """F allocates and B and W only free, so every stage's profile formulates and the heuristic schedules it."""
    from zbsolve.optimize.formulation import formulate
    from zbsolve.schedulers.heuristic import heuristic
    from zbsolve.core.placement import sequential

    model = Model.load(path)
    profile = stage_profile(model, partition(model, 4))
    assert all(f >= 0 and b <= 0 and w <= 0 for f, b, w in zip(profile.mem_f, profile.mem_b, profile.mem_w))
    form = formulate(profile, sequential(4), 8)
    assert len(form.passes) == 3 * 4 * 8
    heuristic(profile, sequential(4), 8)
