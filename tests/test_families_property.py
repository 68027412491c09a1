"""Every family, on random p, m and profiles: the simulator accepts its output or it says why not."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbsolve import InputError, Profile, simulate
from zbsolve.schedulers.families import FAMILIES, make_schedule

times = st.floats(0.1, 5.0, allow_nan=False)


@st.composite
def profiles(draw, p):
    per_stage = st.lists(times, min_size=p, max_size=p)
    m_b = draw(st.lists(st.floats(0.5, 4.0), min_size=p, max_size=p))
    share = draw(st.floats(0.0, 1.0))
    return Profile.from_paper(draw(per_stage), draw(per_stage), draw(per_stage), draw(st.floats(0.0, 1.0)),
                              M_B=m_b, M_W=[share * x for x in m_b],
                              overlap_saving=draw(st.floats(0.0, 0.5)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FAMILIES)), st.integers(1, 8), st.integers(1, 40), st.data())
def test_every_family_validates(name, p, m, data):
    profile = data.draw(profiles(p))
    try:
        schedule = make_schedule(name, profile, p, m)
    except InputError as exc:
        assert any(word in str(exc) for word in ("microbatches", "stages", "devices")), exc
        return
    simulate(schedule)
    assert schedule.name == name and schedule.num_devices == p and schedule.num_microbatches == m
