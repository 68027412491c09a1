"""Tests of the torch CSV exporter (zbsolve.export), checked by torch's own loader offline."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zbsolve.document import write_document
from zbsolve.errors import InfeasibleError, InputError
from zbsolve.export import export_schedule, torch_csv
from zbsolve.families import FAMILIES, make_schedule
from zbsolve.heuristic import heuristic
from zbsolve.placement import Placement, interleaved, sequential, vshape
from zbsolve.profile import UNIT, Profile
from zbsolve.schedule import BW, B, F, Pair, Pass, W, build, passes_of
from zbsolve.simulator import simulate
from zbsolve.torch_compat import lower_csv
from zbsolve.transforms import renumber_last_stage, torch_actions

pytest.importorskip("torch.distributed.pipelining")

TORCH = {F: "F", B: "I", W: "W", BW: "B"}


def _family_cases() -> list[tuple[str, int, int]]:
    cases = []
    for name in FAMILIES:
        for p in (2, 4):
            ms = [4, 9, 4 * p]
            for m in ms:
                try:
                    schedule = make_schedule(name, UNIT, p, m)
                except InputError:
                    continue
                if len(schedule.placement.routes) == 1:
                    cases.append((name, p, m))
    return cases


def _expected_cells(schedule) -> list[list[str]]:
    """The cells the export must hold, built independently of zbsolve.export."""
    last = schedule.num_stages - 1
    dev = schedule.placement.device(0, last)
    order = [p.mb for op in schedule.devices[dev] for p in passes_of(op) if p.kind == F and p.stage == last]
    new = {mb: i for i, mb in enumerate(order)}

    def cell(p: Pass) -> str:
        return f"{p.stage}{TORCH[p.kind]}{new[p.mb]}"

    return [[f"({cell(op.f)};{cell(op.b)})OVERLAP_F_B" if isinstance(op, Pair) else cell(op) for op in ops]
            for ops in schedule.devices]


_ACTION = re.compile(r"(\d+)([A-Z_]+)(\d*)")
"""A torch action inside an action string: stage, computation type, microbatch."""


def _lower(schedule) -> list[list[str]]:
    """The CSV text of ``schedule`` lowered by torch, checked against the expected cells."""
    text = torch_csv(schedule)
    assert list(csv.reader(text.splitlines())) == _expected_cells(schedule)
    return lower_csv(text, num_stages=schedule.num_stages, num_microbatches=schedule.num_microbatches,
                     num_devices=schedule.num_devices)


def _last_stage_forwards(actions: list[list[str]], last: int) -> list[int]:
    return [int(mb) for row in actions for cell in row for stage, kind, mb in _ACTION.findall(cell)
            if kind == "F" and int(stage) == last]


def _compute_only(actions: list[list[str]]) -> list[list[str]]:
    """Torch's actions without the communication and sharding ones it adds."""
    return [[cell for cell in row if all(kind in TORCH.values() for _, kind, _ in _ACTION.findall(cell))]
            for row in actions]


@pytest.mark.parametrize("name,p,m", _family_cases())
def test_every_family_loads_in_torch(name: str, p: int, m: int) -> None:
    schedule = make_schedule(name, UNIT, p, m)
    simulate(schedule)
    actions = _lower(schedule)
    assert _compute_only(actions) == _expected_cells(schedule)
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


@pytest.mark.parametrize("placement", [sequential(2), sequential(4), interleaved(2), vshape(2), vshape(4)],
                         ids=["seq2", "seq4", "interleaved2", "vshape2", "vshape4"])
@pytest.mark.parametrize("m", [3, 8])
def test_heuristic_loads_in_torch(placement: Placement, m: int) -> None:
    profile = Profile(t_f=1.0, t_b=1.5, t_w=0.7, t_comm=0.1)
    schedule = heuristic(profile, placement, m)
    simulate(schedule)
    actions = _lower(schedule)
    assert _last_stage_forwards(actions, schedule.num_stages - 1) == list(range(m))


def test_last_stage_forwards_renumbered() -> None:
    devices = [[Pass(F, 0, 0), Pass(F, 1, 0), Pass(B, 1, 0), Pass(W, 1, 0), Pass(B, 0, 0), Pass(W, 0, 0)],
               [Pass(F, 1, 1), Pass(B, 1, 1), Pass(W, 1, 1), Pass(F, 0, 1), Pass(BW, 0, 1)]]
    schedule = build("swapped", sequential(2), 2, UNIT, devices)
    simulate(schedule)
    assert torch_actions(schedule) == [["0F0", "0F1", "0I1", "0W1", "0I0", "0W0"],
                                       ["1F1", "1I1", "1W1", "1F0", "1B0"]]
    renumbered = renumber_last_stage(schedule)
    assert torch_actions(renumbered) == [["0F1", "0F0", "0I0", "0W0", "0I1", "0W1"],
                                         ["1F0", "1I0", "1W0", "1F1", "1B1"]]
    assert simulate(renumbered).makespan == simulate(schedule).makespan
    actions = _lower(schedule)
    assert _last_stage_forwards(actions, 1) == [0, 1]


def test_renumbering_keeps_routes_and_pairs() -> None:
    schedule = make_schedule("dualpipe", UNIT, 2, 4)
    assert any(isinstance(op, Pair) for ops in schedule.devices for op in ops)

    def last_forwards(s) -> list[int]:
        return [p.mb for ops in s.devices for op in ops for p in passes_of(op) if p.kind == F and p.stage == 1]

    old = last_forwards(schedule)
    assert old != list(range(4))
    renumbered = renumber_last_stage(schedule)
    assert last_forwards(renumbered) == list(range(4))
    assert list(renumbered.microbatch_route) == [schedule.microbatch_route[mb] for mb in old]
    assert simulate(renumbered).makespan == simulate(schedule).makespan


def test_bidirectional_is_refused() -> None:
    schedule = make_schedule("dualpipe", UNIT, 2, 4)
    with pytest.raises(InputError, match=r"routes = \[\[0, 1\], \[1, 0\]\] is bidirectional"):
        torch_csv(schedule)


def test_device_without_stage_is_refused() -> None:
    placement = Placement(3, ((0, 1),))
    devices = [[Pass(F, 0, 0), Pass(BW, 0, 0)], [Pass(F, 0, 1), Pass(BW, 0, 1)], []]
    schedule = build("idle", placement, 1, UNIT, devices)
    simulate(schedule)
    with pytest.raises(InputError, match="device 2 no stage"):
        torch_csv(schedule)


def test_invalid_schedule_is_refused() -> None:
    schedule = build("bad", sequential(2), 1, UNIT, [[Pass(F, 0, 0), Pass(BW, 0, 0)], [Pass(BW, 0, 1), Pass(F, 0, 1)]])
    with pytest.raises(Exception, match="deadlock"):
        torch_csv(schedule)


def test_torch_rejection_is_an_input_error() -> None:
    schedule = make_schedule("zb-h1", UNIT, 2, 2)
    rows = torch_actions(schedule)
    rows[0] = [c for c in rows[0] if c != "0I1"] + ["0I1"]
    text = "\n".join(",".join(r) for r in rows) + "\n"
    with pytest.raises(InputError, match="torch rejects the exported schedule: .*Backward Weight for stage 0, "
                                         "microbatch 1"):
        lower_csv(text, num_stages=2, num_microbatches=2, num_devices=2)


def test_export_schedule(tmp_path: Path) -> None:
    schedule = make_schedule("zb-v", UNIT, 2, 4)
    out = tmp_path / "zbv.csv"
    out.write_text("old")
    assert export_schedule(schedule, out) == out.read_text() == torch_csv(schedule)
    assert [p.name for p in tmp_path.iterdir()] == ["zbv.csv"]
    with pytest.raises(InputError, match="format = 'megatron' is unknown"):
        export_schedule(schedule, tmp_path / "x", "megatron")
    with pytest.raises(InputError, match="output = .*missing/zbv.csv: the folder .*missing does not exist"):
        export_schedule(schedule, tmp_path / "missing" / "zbv.csv")
    with pytest.raises(InputError, match="is bidirectional"):
        export_schedule(make_schedule("dualpipe", UNIT, 2, 4), out)
    assert out.read_text() == torch_csv(schedule)
    assert [p.name for p in tmp_path.iterdir()] == ["zbv.csv"]


def test_export_command(tmp_path: Path) -> None:
    doc, out = tmp_path / "zbv.json", tmp_path / "zbv.csv"
    write_document(simulate(make_schedule("zb-v", UNIT, 2, 4)), doc)
    run = subprocess.run([sys.executable, "-m", "zbsolve", "export", str(doc), "--format", "torch-csv", "-o",
                          str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"wrote {out}"
    assert out.read_text() == torch_csv(make_schedule("zb-v", UNIT, 2, 4))
    run = subprocess.run([sys.executable, "-m", "zbsolve", "export", str(doc), "-f", "megatron", "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "format = 'megatron' is unknown" in run.stderr


def test_export_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "1f1b.csv"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from zbsolve.export import export_schedule\n"
            "from zbsolve.families import make_schedule\nfrom zbsolve.profile import UNIT\n"
            f"export_schedule(make_schedule('1f1b', UNIT, 2, 2), {str(out)!r})\n"
            "import zbsolve.torch_compat as tc; assert not tc.has_pipelining()\n")
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.read_text() == torch_csv(make_schedule("1f1b", UNIT, 2, 2))


def test_optimizer_schedule_loads_in_torch() -> None:
    from zbsolve.solve import solve

    try:
        result = solve(Profile(t_f=1.0, t_b=1.2, t_w=0.8), 3.0, num_microbatches=6, num_devices=3,
                       solver="heuristic")
    except InfeasibleError as exc:
        pytest.fail(f"solve found no schedule: {exc}")
    simulate(result.schedule)
    actions = _lower(result.schedule)
    assert _last_stage_forwards(actions, 2) == list(range(6))
