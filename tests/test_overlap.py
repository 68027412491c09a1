"""The overlap rule (``core.overlap``), communication in profiles and documents, and the pair search
(``optimize.pairing``): DualPipeV against ZB-V on an expert-parallel profile, derived by hand."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import zbsolve
from zbsolve.app.cli import app
from zbsolve.base.errors import InputError
from zbsolve.core.profile import Profile
from zbsolve.core.simulator import simulate
from zbsolve.core.transforms import with_limit
from zbsolve.io.document import load_document
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.schedule import pair_count
from zbsolve.optimize.pairing import least_work, overlap_pairs


def moe(share: float, slowdown: float = 0.15) -> Profile:
    """A stage of F = B = W = 2 whose F and B are ``share`` all-to-all; split in two V chunks of 1 each."""
    return Profile(t_f=2, t_b=2, t_w=2, comm_f=2 * share, comm_b=2 * share, mem_f=1, mem_b=-0.5, mem_w=-0.5,
                   overlap_slowdown=slowdown)


def test_a_pair_lasts_its_computation_with_the_slowdown_or_its_communication():
    """F: 3 s of which 1 communicates; BW: B 4 (2 communicate) + W 1. Computation 2 + 3 = 5, communication 3:
    5 + 0.15 * 3 = 5.45 against 3 + 5 alone. With 9 s of communication beside 1 s of computation the pair is the
    communication's 9 s, and without communication (1 - saving) times the sum, as before communication existed."""
    prof = Profile(t_f=[3, 3], t_b=[4, 4], t_w=[1, 1], comm_f=[1, 1], comm_b=[2, 2], mem_f=1, mem_b=-0.5,
                   mem_w=-0.5)
    assert prof.pair_time(0, "BW", 1) == pytest.approx(5.45)
    assert prof.pair_time(0, "B", 1) == pytest.approx(4 + 0.15 * 3)
    chatty = Profile(t_f=[5, 5], t_b=[5, 5], t_w=1, comm_f=[4.5, 4.5], comm_b=[4.5, 4.5])
    assert chatty.pair_time(0, "B", 1) == pytest.approx(9.0)
    assert Profile(overlap_saving=0.25).pair_time(0, "BW", 0) == pytest.approx(0.75 * 3)


@pytest.mark.parametrize("fields, name", [({"comm_f": 1.5}, "comm_f"), ({"comm_b": -0.1}, "comm_b"),
                                          ({"overlap_slowdown": 2.0}, "overlap_slowdown")])
def test_bad_communication_is_refused_naming_the_field(fields, name):
    with pytest.raises(InputError, match=name):
        Profile.parse(fields, "profile")


def test_communication_is_left_out_of_a_dense_dump_and_kept_in_an_expert_one(tmp_path):
    assert not {"comm_f", "comm_b", "overlap_slowdown"} & set(Profile().model_dump())
    path = tmp_path / "moe.yaml"
    moe(0.4, 0.1).save(path)
    assert Profile.load(path) == moe(0.4, 0.1)
    assert moe(0.4).split_chunks(2).comm_f == [0.4, 0.4]


@pytest.mark.parametrize("p, m", [(4, 8), (6, 12), (8, 16), (4, 12)])
@pytest.mark.parametrize("share, slowdown", [(0.3, 0.15), (0.5, 0.15), (0.4, 0.0)])
def test_dualpipev_beats_zbv_by_what_the_overlap_rule_predicts(p, m, share, slowdown):
    """Chunks of F = B = W = T = 1, a = ``share`` of F and B communicating.

    - ZB-V runs passes one at a time: each device works 6m T with no bubble inside its span (m >= 2p - 1), and the
      last device's first F waits for p - 1 forwards: 6m + (p - 1), whatever the communication.
    - DualPipeV's pair of an F and a BW computes (1 - a) + (2 - a) and communicates 2a: P = max(2a, 3 - 2a +
      slowdown * 2a) by the rule. Its last device runs 2m - 2p - 1 pairs, each P instead of 3 T, and idles
      (p - 1)(P + T_B - 2 T_W) = (p - 1)(P - 1) (the family's closed form with F&B = P): 6m - (2m - 2p - 1)(3 - P)
      + (p - 1)(P - 1). Device d runs 2m - 3p + 1 + d pairs, the last one fewer (its first F
      and B of the steady phase run apart): p(2m - 3p + 1) + p(p - 1)/2 - 1 in all.
    - So ZB-V - DualPipeV = (2m - 2p - 1)(3 - P) - (p - 1)(P - 2), at DualPipeV's memory ((2p + 1) chunk
      activations), which holds ZB-V's too."""
    a = share
    pair = max(2 * a, 3 - 2 * a + slowdown * 2 * a)
    dpv = simulate(make_schedule("dualpipev", moe(share, slowdown), p, m))
    zbv = simulate(with_limit(make_schedule("zb-v", moe(share, slowdown), p, m), dpv.peak))
    assert dpv.peak == pytest.approx((2 * p + 1) / 2) and zbv.peak <= dpv.peak
    assert pair_count(dpv.schedule) == p * (2 * m - 3 * p + 1) + p * (p - 1) // 2 - 1
    assert zbv.makespan == pytest.approx(6 * m + p - 1)
    assert zbv.makespan - dpv.makespan == pytest.approx((2 * m - 2 * p - 1) * (3 - pair) - (p - 1) * (pair - 2))
    assert dpv.makespan < zbv.makespan


def test_the_pair_search_finds_a_schedule_between_never_and_always_overlapping():
    """p = 4, m = 8, 30% all-to-all: fusing some of ZB-V's F and B into pairs beats both ZB-V (no pair) and
    DualPipeV (a pair wherever its order has one), under DualPipeV's memory; and the bound on any schedule with
    pairs is below all three."""
    prof = moe(0.3)
    dpv = simulate(make_schedule("dualpipev", prof, 4, 8))
    zbv = simulate(with_limit(make_schedule("zb-v", prof, 4, 8), dpv.peak))
    searched = overlap_pairs(zbv)
    pairs = pair_count(searched.schedule)
    assert searched.makespan < min(zbv.makespan, dpv.makespan) and searched.peak <= dpv.peak
    assert 0 < pairs < 2 * 8 * 4
    assert simulate(searched.schedule).makespan == searched.makespan
    assert least_work(searched.schedule) <= min(searched.makespan, dpv.makespan, zbv.makespan)


def test_the_pair_search_changes_nothing_without_communication():
    zbv = simulate(make_schedule("zb-v", Profile(), 4, 8))
    assert overlap_pairs(zbv) is zbv


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_a_vshape_solve_is_at_most_the_better_of_zbv_and_dualpipev(share):
    prof = moe(share)
    dpv = simulate(make_schedule("dualpipev", prof, 4, 8))
    zbv = simulate(make_schedule("zb-v", prof, 4, 8))
    result = zbsolve.solve(prof, dpv.peak, num_microbatches=8, num_devices=4, placement="vshape", time_limit=20)
    timeline = simulate(result.schedule)
    assert timeline.makespan == pytest.approx(result.objective)
    assert result.objective <= min(zbv.makespan, dpv.makespan) + 1e-9
    assert result.lower_bound <= result.objective and timeline.peak <= dpv.peak


def test_a_dense_solve_has_no_pairs_and_its_bounds_as_before():
    """Where nothing communicates no pair saves time: the solve searches none, and its bound is the one on passes run
    one at a time (the integer form's, not the pairs' least work), at most the step of every schedule it tries: here
    ZB-V's, which meets it (p = 4, m = 8, chunks of F = B = W = 1/2: each device works 24, and the last one's first
    F waits for 3 forwards of 1/2)."""
    from zbsolve.core.placement import vshape
    from zbsolve.optimize.bound import lower_bound
    from zbsolve.optimize.formulation import formulate
    from zbsolve.schedulers.heuristic import heuristic
    from zbsolve.schedulers.vgreedy import v_greedy

    result = zbsolve.solve(Profile(), 4, num_microbatches=8, num_devices=4, placement="vshape", time_limit=10)
    assert "pairs" not in result.solver_log
    assert pair_count(result.schedule) == 0
    chunks = result.schedule.profile
    form = formulate(chunks, vshape(4), 8, 4, "makespan")
    assert least_work(result.schedule) == pytest.approx(24.0)
    assert result.lower_bound == pytest.approx(form.to_time(lower_bound(form)))
    assert result.lower_bound == pytest.approx(25.5)
    tried = [make_schedule(name, Profile(), 4, 8) for name in ("zb-v", "v-half", "v-min")]
    tried += [heuristic(chunks, vshape(4), 8, 4), v_greedy(chunks, 4, 8, 4)]
    steps = [simulate(with_limit(schedule, 4)).makespan for schedule in tried]
    assert all(result.lower_bound <= step + 1e-9 for step in steps)
    assert result.objective == pytest.approx(min(steps))
    assert result.objective == pytest.approx(result.lower_bound)


# -- a model's experts ------------------------------------------------------------------------------------------
MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
           "vocab_size": 128, "tie_word_embeddings": False}


def mixtral() -> zbsolve.Model:
    from zbsolve.costmodel.estimate import estimate
    return estimate(MIXTRAL, seq_len=16, microbatch_size=2, ep=4)


def test_a_stage_communicates_what_its_layers_do_and_recomputing_runs_the_all_to_all_again():
    from zbsolve.core.placement import vshape
    from zbsolve.problem.costs import model_costs
    from zbsolve.problem.recompute import FULL

    model = mixtral()
    profile, costs = model_costs(model, vshape(2), "uniform")
    for s, (a, b) in enumerate(costs.ranges):
        layers = model.layers[a:b]
        assert profile.stage_value("comm_f", s) == pytest.approx(sum(x.comm_f or 0 for x in layers))
    again, _ = model_costs(model, vshape(2), "uniform", recompute=FULL)
    assert again.comm_b == pytest.approx([b + f for b, f in zip(profile.comm_b, profile.comm_f)])
    assert profile.communicates() and not model_costs(model.model_copy(update={"layers": [
        x.model_copy(update={"comm_f": None, "comm_b": None}) for x in model.layers]}), vshape(2))[0].communicates()


def test_documents_record_and_check_each_layers_communication(tmp_path):
    """``zbsolve solve`` of a model with experts records each layer's communication; ``zbsolve check`` refuses a
    document whose layers no longer sum to its profile's."""
    path, model_path = tmp_path / "moe.json", tmp_path / "mixtral.yaml"
    mixtral().save(model_path)
    run = CliRunner().invoke(app, ["solve", str(model_path), "--devices", "2", "--microbatches", "4", "--placement",
                                   "vshape", "--time-limit", "10", "-o", str(path), "--quiet"])
    assert run.exit_code == 0, run.output
    doc = json.loads(path.read_text())
    blocks = [layer for layer in doc["partition"]["layers"] if layer["block"]]
    assert all(layer["comm_f"] > 0 and layer["comm_b"] > 0 for layer in blocks)
    assert doc["profile"]["comm_f"] and load_document(path)
    doc["partition"]["layers"][1]["comm_f"] /= 2
    path.write_text(json.dumps(doc))
    check = CliRunner().invoke(app, ["check", str(path)])
    assert check.exit_code == 2 and "comm_f" in check.output
