"""The schedule document's promises (docs/schedule-format.md): what zbsolve writes, that it reads back to the
same schedule and figures, that unknown keys and missing planned times are accepted, how planned times
compare with the simulator's, and clear errors on documents it cannot read."""

import json

import pytest

from conftest import one_f_one_b
from zbsolve import InputError, Profile, simulate
from zbsolve.io.document import from_document, planned_drift, read_document, to_document, write_document
from zbsolve.schedulers.families import make_schedule
from zbsolve.core.profile import UNIT

UNEVEN = Profile(t_f=[1.0, 2.0, 1.0, 1.0], t_comm=0.1)


def timelines():
    """One schedule of every shape the format describes: fused BW with per-device limits and uneven
    times, split B/W, V-shape chunks, and DualPipe's two routes with F&B pairs."""
    return {
        "1f1b": simulate(one_f_one_b(4, 8, UNEVEN, mem_limit=[4, 4, 4, 4])),
        "zb-h1": simulate(make_schedule("zb-h1", Profile(t_w=0.5, t_comm=0.25), 4, 8)),
        "zb-v": simulate(make_schedule("zb-v", UNIT, 3, 6)),
        "dualpipe": simulate(make_schedule("dualpipe", Profile(overlap_saving=0.2), 4, 8)),
    }


TIMELINES = timelines()
CASES = pytest.mark.parametrize("name", sorted(TIMELINES))


def through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_written_fields(tmp_path):
    t = TIMELINES["1f1b"]
    path = tmp_path / "s.json"
    write_document(t, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "zbsolve-schedule" and doc["version"] == 1 and doc["name"] == "1f1b"
    assert doc["num_devices"] == 4 and doc["num_microbatches"] == 8
    assert doc["routes"] == [[0, 1, 2, 3]] and doc["microbatch_route"] == [0] * 8 and doc["mem_limit"] == [4, 4, 4, 4]
    assert doc["profile"]["t_f"] == [1.0, 2.0, 1.0, 1.0] and doc["profile"]["t_comm"] == 0.1
    assert doc["devices"][0][0] == {"kind": "F", "mb": 0, "stage": 0, "start": 0.0, "end": 1.0}
    assert doc["devices"][1][0] == {"kind": "F", "mb": 0, "stage": 1, "start": 1.1, "end": 3.1}
    assert doc["figures"] == t.figures()
    pair = next(op for ops in to_document(TIMELINES["dualpipe"])["devices"] for op in ops if op["kind"] == "F&B")
    assert set(pair) == {"kind", "f", "b", "start", "end"} and set(pair["f"]) == {"mb", "stage"}
    assert pair["b"]["kind"] == "BW" and pair["end"] - pair["start"] == pytest.approx(0.8 * 3.0)


@CASES
def test_roundtrip_gives_the_same_schedule_and_figures(name):
    t = TIMELINES[name]
    schedule, planned = from_document(through_json(to_document(t)))
    assert schedule == t.schedule
    again = simulate(schedule)
    assert again.figures() == t.figures()
    assert again.start == t.start and again.end == t.end
    assert planned == [list(zip(s, e)) for s, e in zip(t.start, t.end)]
    assert planned_drift(again, planned) == 0.0


def test_roundtrip_through_a_file(tmp_path):
    t = TIMELINES["dualpipe"]
    write_document(t, tmp_path / "s.json", solver={"status": "heuristic"})
    schedule, planned = read_document(tmp_path / "s.json")
    again = simulate(schedule)
    assert again.figures() == t.figures() and planned_drift(again, planned) == 0.0


@CASES
def test_unknown_keys_are_ignored(name):
    t = TIMELINES[name]
    doc = through_json(to_document(t, solver={"status": "optimal"}))
    doc.update(comment="written by hand", tags=["a", "b"], figures={"makespan": -1.0})
    for ops in doc["devices"]:
        for op in ops:
            op.update(note="unknown", color="#ff0000", duration=99.0)
    schedule, planned = from_document(doc)
    assert schedule == t.schedule
    again = simulate(schedule)
    assert again.figures() == t.figures() and planned_drift(again, planned) == 0.0


@CASES
@pytest.mark.parametrize("how", ["absent", "null", "some"])
def test_planned_times_are_optional(name, how):
    t = TIMELINES[name]
    doc = through_json(to_document(t))
    for d, ops in enumerate(doc["devices"]):
        for i, op in enumerate(ops):
            if how == "absent":
                del op["start"], op["end"]
            elif how == "null":
                op["start"] = op["end"] = None
            elif (d + i) % 2:
                del op["start"]
            else:
                del op["end"]
    schedule, planned = from_document(doc)
    assert schedule == t.schedule
    again = simulate(schedule)
    assert again.figures() == t.figures()
    assert planned_drift(again, planned) == 0.0
    if how != "some":
        assert all(times == (None, None) for ops in planned for times in ops)


@CASES
def test_drift_is_the_largest_perturbation(name):
    t = TIMELINES[name]
    doc = through_json(to_document(t))
    last = len(doc["devices"][-1]) - 1
    doc["devices"][0][2]["start"] += 0.25
    doc["devices"][-1][last]["end"] += 0.75
    doc["devices"][1][0]["end"] += 0.5
    schedule, planned = from_document(doc)
    again = simulate(schedule)
    assert again.figures() == t.figures(), "planned times do not change the simulated ones"
    assert planned_drift(again, planned) == pytest.approx(0.75)
    assert planned[0][2][0] == pytest.approx(t.start[0][2] + 0.25)


def test_drift_counts_only_the_times_given():
    t = TIMELINES["zb-h1"]
    doc = through_json(to_document(t))
    doc["devices"][3][5]["start"] += 2.0
    del doc["devices"][3][5]["end"]
    doc["devices"][2][4]["start"] = None
    doc["devices"][2][4]["end"] += 0.125
    schedule, planned = from_document(doc)
    assert planned_drift(simulate(schedule), planned) == pytest.approx(2.0)
    del doc["devices"][3][5]["start"]
    schedule, planned = from_document(doc)
    assert planned_drift(simulate(schedule), planned) == pytest.approx(0.125)


def test_drift_of_a_pair():
    t = TIMELINES["dualpipe"]
    doc = through_json(to_document(t))
    d, i = next((d, i) for d, ops in enumerate(doc["devices"]) for i, op in enumerate(ops) if op["kind"] == "F&B")
    doc["devices"][d][i]["end"] += 1.5
    schedule, planned = from_document(doc)
    assert planned_drift(simulate(schedule), planned) == pytest.approx(1.5)


def test_figures_are_recomputed_not_read():
    t = TIMELINES["zb-v"]
    doc = through_json(to_document(t))
    doc["figures"] = {"makespan": 1.0, "bubble_rate": 0.0, "paper_bubble": 0.0, "peak_memory": 0.0}
    schedule, _ = from_document(doc)
    assert simulate(schedule).figures() == t.figures()


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(format="other"), "format = 'other'"),
    (lambda d: d.update(version=2), "version = 2"),
    (lambda d: d["devices"][0].append({"kind": "X", "mb": 0, "stage": 0}), "devices.0.8.kind = 'X'"),
    (lambda d: d["devices"][0].append({"kind": "F", "mb": -1, "stage": 0}), "devices.0.8.mb = -1"),
    (lambda d: d["routes"][0].__setitem__(1, 9), "routes.0.1 = 9"),
    (lambda d: d.update(microbatch_route=[0, 3]), "microbatch_route has 2 entries"),
    (lambda d: d["profile"].update(t_f=-1), "profile: t_f = -1.0"),
])
def test_rejects(edit, needle):
    doc = to_document(simulate(one_f_one_b(2, 4)))
    edit(doc)
    with pytest.raises(InputError) as exc:
        from_document(doc)
    assert needle in str(exc.value)


def test_not_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_document(path)

