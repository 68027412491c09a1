"""A model solved in real units: device memory in bytes around the static bytes, step times in the result, the
schedule document's "partition" and "device_memory" sections, and what `zbsolve check` verifies of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT, TOY_LAYERS, check_result, toy
from zbsolve.app.cli import app
from zbsolve.io.costs_section import document_costs
from zbsolve.problem.costs import check_fits, device_static_bytes
from zbsolve.costmodel.estimate import estimate
from zbsolve.io.document import from_document
from zbsolve.base.errors import InfeasibleError, InputError, MemoryLimitError
from zbsolve.costmodel.model import Model
from zbsolve.problem.partition import partition
from zbsolve.core.placement import sequential, vshape
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.optimize.solve import solve
from zbsolve.core.step_time import steady_period
from zbsolve.core.transforms import repeat
from zbsolve.base.units import GIB

runner = CliRunner()
LLAMA = ROOT / "problems" / "models" / "llama3-8b.yaml"


def llama_at_a_share(tmp_path) -> Path:
    """Llama-3-8B's estimate timed at an explicit efficiency of 0.4 (H100, s = 8192, b = 1), a file in ``tmp_path``:
    costs on which ZB-H1 over 8 devices of 96 GiB meets the makespan bound up to the rounding of times (on 80 GiB
    the loss's fp32 gradients of the logits leave the last device short of it)."""
    path = tmp_path / "llama3-8b.yaml"
    estimate(ROOT / "problems" / "models" / "configs" / "llama3-8b.json", gpu="h100", seq_len=8192,
             microbatch_size=1, efficiency=0.4, name="llama3-8b").save(path)
    return path
STATIC = [layer["static_bytes"] for layer in TOY_LAYERS]


def test_static_bytes_per_device_count_a_tied_weight_once():
    model = toy()
    ranges = partition(model, 4)
    seq = device_static_bytes(model.layers, ranges, sequential(4))
    assert seq == tuple(sum(STATIC[a:b]) for a, b in ranges)  # the head is not beside the embedding it is tied to
    # On a V-shape over two devices, device 0 holds stages 0 and 3: the embedding and the head it is tied to.
    v = device_static_bytes(model.layers, ranges, vshape(2))
    held0 = set(range(*ranges[0])) | set(range(*ranges[3]))
    assert v[0] == sum(STATIC[i] for i in held0 if model.layers[i].name != "output")
    assert v[1] == sum(STATIC[i] for i in set(range(*ranges[1])) | set(range(*ranges[2])))


def test_device_memory_is_the_activation_budget_after_static_bytes_and_reserve():
    """The toy's five blocks on two devices: layers 0-3 (embedding, three blocks) and 4-7 (two blocks, norm, head).
    Layer i holds 10**9 + i static bytes, and the head, tied to an embedding on the other device, holds its own:
    4 * 10**9 + (0+1+2+3) = 4_000_000_006 and 4 * 10**9 + (4+5+6+7) = 4_000_000_022 bytes. Each device's activation
    budget is 6 GiB less the 1 GiB reserve less these."""
    model = toy()
    result = solve(model, num_devices=2, num_microbatches=4, device_memory=6 * GIB, reserve="1GiB",
                   solver="heuristic")
    static = (4_000_000_006, 4_000_000_022)
    assert result.costs.static_bytes == static
    limits = (5 * 2**30 - 4_000_000_006, 5 * 2**30 - 4_000_000_022)
    assert limits == (1_368_709_114, 1_368_709_098)
    assert tuple(result.schedule.mem_limit) == limits
    check_result(result, limits)
    # The activations: each device's peak as an independent simulation of the schedule has it, far below its budget
    # (a microbatch's F on device 0 keeps 1000+1001+1002+1003 = 4006 bytes).
    peaks = simulate(result.schedule).peak_memory
    assert all(0 < peak < 10**5 for peak in peaks)
    summary = result.summary()
    assert summary["memory_gib"] == pytest.approx([(s + a) / 2**30 for s, a in zip(static, peaks)], rel=1e-12)
    assert summary["device_memory_gib"] == 6 and "peak_memory" not in summary


def test_step_times_are_the_makespan_and_the_period_of_back_to_back_steps():
    """The toy on three devices: layers 0-2, 3-4 and 5-7. Layer i's F + B + W takes 0.35 i + 0.06 s (the
    embedding, with no B: 0.04 s), so a microbatch costs 0.04 + 0.41 + 0.76 = 1.21 s on device 0, 1.11 + 1.46 = 2.57 s
    on device 1 and 1.81 + 2.16 + 2.51 = 6.48 s on device 2; six microbatches: 7.26, 15.42 and 38.88 s, 20.52 s a
    device on average. The span's optimum is the last device's work, 38.88 s (met by the floor, so proven without
    search). Device 2's first F can start only after device 0's (0.01 + 0.11 + 0.21 = 0.33 s) and device 1's
    (0.31 + 0.41 = 0.72 s), each sent in 0.05 s: at 1.15 s; busy from then on, it ends the step at 1.15 + 38.88 =
    40.03 s. Back to back, steps overlap and device 2's 38.88 s of work a step is the period."""
    result = solve(toy(t_comm=0.05), num_devices=3, num_microbatches=6, solver="heuristic", objective="span")
    check_result(result, status="optimal")
    assert result.timeline.work == pytest.approx((7.26, 15.42, 38.88))
    assert result.objective == pytest.approx(38.88) and result.lower_bound == pytest.approx(38.88)
    assert result.step_time == result.timeline.makespan == pytest.approx(40.03)
    assert result.step_time_no_barrier == pytest.approx(38.88)
    many = [simulate(repeat(result.schedule, k)).makespan for k in (6, 7)]
    assert result.step_time_no_barrier == pytest.approx(many[1] - many[0], rel=1e-9)
    assert result.step_time_no_barrier == steady_period(result.timeline) <= result.step_time + 1e-9
    figures = result.summary()
    assert figures["bubble_no_barrier"] == pytest.approx(1 - 20.52 / 38.88)
    assert figures["bubble_rate"] == pytest.approx(1 - 20.52 / 40.03)
    assert figures["paper_bubble"] == pytest.approx(0, abs=1e-12)


def test_the_default_objective_is_the_step_time_with_a_barrier():
    result = solve(toy(), num_devices=3, num_microbatches=6, time_limit=5, workers=1)
    assert result.objective_kind == "makespan" and result.objective == result.step_time


def test_static_bytes_that_do_not_fit_name_the_device_and_the_shortfall():
    # Device 0 holds the embedding and three blocks: 4e9 + 6 bytes, 3.73 GiB.
    with pytest.raises(InfeasibleError, match=r"device 0 does not fit: static 3\.73 GiB \+ reserve 0\.00 GiB exceed "
                                              r"device_memory 2\.00 GiB by 1\.73 GiB"):
        solve(toy(), num_devices=2, num_microbatches=4, device_memory="2GiB", reserve=0)


def test_activations_that_do_not_fit_name_the_device_and_the_shortfall():
    model = Model.load(LLAMA)
    # The first stage holds 20.83 GiB and one microbatch's activations need 4.31 GiB there: the first device that
    # does not fit is named, with its shortfall.
    with pytest.raises(InfeasibleError, match=r"device 0 does not fit: static 20\.83 GiB \+ one microbatch's "
                                              r"activations 4\.31 GiB \+ reserve 0\.00 GiB exceed device_memory "
                                              r"24\.00 GiB by 1\.14 GiB"):
        solve(model, num_devices=8, num_microbatches=8, device_memory="24GiB", reserve=0)


def test_bad_memory_arguments_are_one_line_errors():
    with pytest.raises(InputError, match="give mem_limit or device_memory, not both"):
        solve(toy(), 10.0, num_devices=2, num_microbatches=4, device_memory="80GiB")
    with pytest.raises(InputError, match=r"device_memory = '80 parsecs' is not a size"):
        solve(toy(), num_devices=2, num_microbatches=4, device_memory="80 parsecs")
    with pytest.raises(InputError, match="num_devices = None: give num_devices to cut a model"):
        solve(toy(), num_microbatches=4)
    with pytest.raises(InputError, match="a partition cuts a model"):
        solve(Profile(), num_devices=2, num_microbatches=4, partition="1,1")


def test_a_bare_profile_takes_device_memory_in_bytes():
    profile = Profile(mem_f=GIB, mem_b=-GIB // 2, mem_w=-GIB // 2)
    result = solve(profile, num_devices=4, num_microbatches=8, device_memory="6GiB", reserve="1GiB",
                   solver="heuristic")
    assert result.schedule.mem_limit == (5 * GIB,) * 4 and max(result.peak_memory) <= 5 * GIB
    assert result.costs.static_bytes == (0,) * 4 and result.summary()["activation_gib"][0] <= 5


def solved_document(tmp_path, *args: str) -> tuple[dict, str]:
    path = tmp_path / "plan.json"
    done = runner.invoke(app, ["solve", str(llama_at_a_share(tmp_path)), "-p", "8", "-m", "16", "--device-memory",
                               "96GiB", "--solver", "heuristic", "-o", str(path), *args])
    assert done.exit_code == 0, done.output
    return json.loads(path.read_text()), done.output


def test_solve_a_model_prints_seconds_and_gib_and_its_document_checks(tmp_path):
    doc, output = solved_document(tmp_path, "--partition", "5,4,4,4,4,4,4,6")
    assert "step time with barrier (s)" in output and "step time without barrier (s)" in output
    assert "total GiB" in output
    assert doc["partition"]["stages"] == [[0, 5], [5, 9], [9, 13], [13, 17], [17, 21], [21, 25], [25, 29], [29, 35]]
    assert [layer["name"] for layer in doc["partition"]["layers"]][:2] == ["tok_embeddings", "layers.0"]
    assert doc["device_memory"] == 96 * GIB
    schedule, _ = from_document(doc)
    costs = document_costs(doc, schedule, "doc")
    check_fits(costs, simulate(schedule))
    path = tmp_path / "plan.json"
    checked = runner.invoke(app, ["check", str(path), "--json"])
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.output)["memory_gib"] == pytest.approx(doc["solver"]["memory_gib"])


def test_check_refuses_a_partition_that_does_not_sum_to_the_profile(tmp_path):
    doc, _ = solved_document(tmp_path)
    doc["partition"]["layers"][3]["t_b"] *= 1.01
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    done = runner.invoke(app, ["check", str(path)])
    assert done.exit_code == 2 and "profile.t_b[0] = " in done.output and "layers [0, 5) sum to" in done.output


def test_check_refuses_a_device_that_does_not_fit_its_memory(tmp_path):
    doc, _ = solved_document(tmp_path)
    doc["device_memory"] = 60 * GIB
    path = tmp_path / "small.json"
    path.write_text(json.dumps(doc))
    done = runner.invoke(app, ["check", str(path)])
    assert done.exit_code == 1 and "does not fit: static" in done.output and "exceed device_memory 60.00 GiB" \
        in " ".join(done.output.split())
    with pytest.raises(MemoryLimitError, match="device 7 does not fit"):
        check_fits(document_costs(doc, from_document(doc)[0], "doc"), simulate(from_document(doc)[0]))


def test_solve_takes_a_bare_profile_file(tmp_path):
    path = tmp_path / "measured.yaml"
    Profile(t_f=[1, 1, 1.2], t_b=1, t_w=1, mem_f=100, mem_b=-60, mem_w=-40).save(path)
    done = runner.invoke(app, ["solve", str(path), "--devices", "3", "--microbatches", "6", "--solver", "heuristic",
                               "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["step_time"] > 0
    missing = runner.invoke(app, ["solve", str(path), "--solver", "heuristic"])
    assert missing.exit_code == 2 and "give --devices and --microbatches to solve a profile" in missing.output


def test_a_zero_reserve_and_problem_overrides(tmp_path):
    result = solve(toy(), num_devices=2, num_microbatches=4, device_memory="6GiB", reserve="0GiB", solver="heuristic")
    assert result.costs.reserve == 0
    with pytest.raises(InputError, match=r"reserve = '-1GiB' is not a size"):
        solve(toy(), num_devices=2, num_microbatches=4, device_memory="6GiB", reserve="-1GiB")
    # A problem file's memory factor counts 1F1B's peak for the devices and microbatches asked for.
    path = tmp_path / "p.yaml"
    path.write_text("num_devices: 4\nnum_microbatches: 8\nmem_factor: 1\n")
    done = runner.invoke(app, ["solve", str(path), "-p", "2", "-m", "4", "--solver", "heuristic", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["mem_limit"] == 2.0  # 1F1B's peak on 2 devices of the unit profile


@pytest.mark.parametrize("placement, labels", [
    ("sequential", {0: "tok_embeddings, layers.0-3", 4: "layers.16-19", 7: "layers.28-31, norm, output"}),
    ("vshape", {0: "tok_embeddings, layers.0-1, layers.30-31, norm, output", 3: "layers.6-7, layers.24-25",
                7: "layers.14-17"}),
])
def test_devices_are_labelled_by_the_model_s_module_names(placement, labels):
    """Llama-3-8B's 35 entries (tok_embeddings, 32 blocks, norm, output) cut uniformly over 8 devices: the labels
    name modules, never positions in the description (device 0 of the V-shape holds the first and the last stage,
    device 7 the two middle ones, whose blocks run on)."""
    result = solve(ROOT / "problems" / "models" / "llama3-8b.yaml", num_devices=8, num_microbatches=16,
                   placement=placement, solver="heuristic")
    names = result.costs.device_names()
    assert {d: names[d] for d in labels} == labels
    assert result.summary()["device_layers"] == names


def test_solve_prints_module_names_and_a_met_bound_as_such(tmp_path):
    """ZB-H1 on Llama-3-8B meets the makespan bound up to the rounding of times for the solver: the status stays
    "heuristic" in the document and reads "heuristic (bound met)" in the table."""
    doc, output = solved_document(tmp_path)
    assert "tok_embeddings, layers.0-3" in output and "layers.28-31, norm, output" in output
    solver = doc["solver"]
    assert solver["status"] == "heuristic" and 0 < solver["gap"] <= 1e-5 and solver["bound_met"] is True
    assert "heuristic (bound met)" in output
    assert solver["device_layers"][0] == "tok_embeddings, layers.0-3"


def test_stages_are_labelled_by_the_model_s_module_names_in_the_json():
    """`zbsolve solve --json` of Llama-3-8B on the V-shape names each stage's modules ("stage_layers") beside each
    device's ("device_layers"): device 7 holds the two middle stages, told apart only per stage."""
    done = runner.invoke(app, ["solve", str(LLAMA), "-p", "8", "-m", "16", "--placement", "vshape",
                               "--solver", "heuristic", "--json"])
    assert done.exit_code == 0, done.output
    figures = json.loads(done.output)
    stages = figures["stage_layers"]
    assert len(stages) == 16 and len(figures["partition"]) == 16
    assert (stages[0], stages[7], stages[8], stages[15]) == (
        "tok_embeddings, layers.0-1", "layers.14-15", "layers.16-17", "layers.30-31, norm, output")
    assert figures["device_layers"][7] == "layers.14-17"
    assert figures["device_layers"][0] == "tok_embeddings, layers.0-1, layers.30-31, norm, output"


def test_a_met_bound_reads_so_in_a_notebook(tmp_path):
    """The result's own tables (Jupyter's HTML, rich) read the status as the command's table does."""
    result = solve(llama_at_a_share(tmp_path), num_devices=8, num_microbatches=16, device_memory="96GiB", solver="heuristic")
    assert result.status == "heuristic" and result.bound_met and result.summary()["status"] == "heuristic"
    assert "<td>heuristic (bound met)</td>" in result._repr_html_()
    assert "heuristic (bound met)" in list(result.__rich__().columns[1].cells)


def test_check_of_a_model_s_document_prints_seconds_and_gib(tmp_path):
    """No figure in the profile's raw units: the makespan in seconds, memory per device in GiB by module names."""
    solved_document(tmp_path)
    checked = runner.invoke(app, ["check", str(tmp_path / "plan.json")])
    assert checked.exit_code == 0, checked.output
    assert "step time with barrier (s)" in checked.output and "peak activations" not in checked.output
    assert "total GiB" in checked.output and "layers.28-31, norm, output" in checked.output
