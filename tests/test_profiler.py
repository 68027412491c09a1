"""Profiler: a measured Profile that validates and schedules, the B/W split, memory accounting, latency."""

import pytest

torch = pytest.importorskip("torch")

from torch import nn

from zbsolve.errors import InputError
from zbsolve.families import make_schedule
from zbsolve.problem import Problem
from zbsolve.profile import Profile
from zbsolve.runtime.memory import SavedBytes
from zbsolve.runtime.model import ModelSpec, load_model
from zbsolve.runtime.profiler import (
    NOISE_COLUMNS,
    Measurement,
    ProfileOptions,
    latency_line,
    measure,
    measure_latency,
    noise_table,
    profile_header,
    relative_iqr,
    run_passes,
    stage_inputs,
    write_profile,
)
from zbsolve.simulator import simulate


def test_measured_profile_is_usable(tmp_path):
    path = tmp_path / "profile.yaml"
    options = ProfileOptions(microbatch_size=2, repeats=2, warmup=1)
    measurement = measure(load_model(ModelSpec(), 2), options)
    header = profile_header(ModelSpec(), 2, options)
    assert header.startswith("zbsolve profile of gpt: 2 stages, microbatch size 2, 2 repeats after 1 warm-up, "
                             "device cpu, 1 threads, torch ")
    profile = write_profile(measurement, path, header)
    assert profile == measurement.profile
    assert Profile.load(path) == profile
    assert profile.num_stages == 2
    assert profile.t_comm > 0
    for s in range(2):
        assert all(t > 0 for t in profile.durations(s))
        mem_f, mem_b, mem_w = profile.memories(s)
        assert mem_f > 0 and mem_f + mem_b + mem_w == 0
    text = path.read_text()
    assert text.startswith(f"# {header}\n") and "# noise" in text and "#   t_comm:" in text
    table = noise_table(measurement)
    assert [row[0] for row in table] == ["0", "1"] and all(len(row) == len(NOISE_COLUMNS) for row in table)
    assert latency_line(measurement).startswith(f"t_comm (one-way) = {profile.t_comm:,.1f} µs ±")
    problem = Problem(num_devices=2, num_microbatches=4, profile=Profile.load(path))
    timeline = simulate(make_schedule("zb-h1", problem.profile, 2, 4))
    assert timeline.work[0] == pytest.approx(4 * sum(profile.durations(0)))


def test_forward_memory_grows_with_microbatch_size():
    model = load_model(ModelSpec(), 3)
    small, large = (measure(model, ProfileOptions(microbatch_size=b, repeats=1, warmup=0, latency=False)).profile
                    for b in (1, 3))
    for s in range(3):
        assert large.memories(s)[0] > small.memories(s)[0] > 0


class Lookup(nn.Module):
    """A first stage whose only leaf module gives no differentiable output: nothing to cut B and W at."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Identity()
        self.table = nn.Parameter(torch.randn(10, 4))

    def forward(self, ids):
        return self.table[self.pre(ids)].tanh()


def assert_split_matches_full_backward(stage, x, tail, loss_fn):
    run_passes(stage, x, tail, loss_fn, lambda: None)
    split = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    out = stage(x)
    torch.autograd.backward(loss_fn(out, tail) if loss_fn else out, None if loss_fn else tail)
    assert all(torch.allclose(a, p.grad, rtol=1e-5, atol=1e-7) for a, p in zip(split, stage.parameters()))


def test_split_backward_gives_the_full_backward_gradients():
    model = load_model(ModelSpec(), 2)
    xs, tails = stage_inputs(model, 2, torch.device("cpu"))
    assert_split_matches_full_backward(model.stages[0], xs[0], tails[0], None)
    assert_split_matches_full_backward(model.stages[1], xs[1], tails[1], model.loss_fn)
    ids = torch.tensor([[1, 2, 2], [9, 0, 1]])
    assert_split_matches_full_backward(Lookup(), ids, torch.randn(2, 3, 4), None)


def test_saved_bytes_counts_activations_until_backward_frees_them():
    linear = nn.Linear(7, 3)
    x = torch.randn(5, 7, requires_grad=True)
    saved = SavedBytes(linear.parameters())
    with saved.hooks():
        y = torch.tanh(linear(x))
        z = y * y
    assert saved.current == saved.peak == x.nbytes + y.nbytes
    del z
    y.sum().backward()
    assert saved.current == 0 and saved.peak == x.nbytes + y.nbytes
    saved.reset_peak()
    assert saved.peak == 0


def test_medians_noise_and_exact_memory_balance():
    samples = {"t_f": [[1.0, 2.0, 3.0, 4.0, 100.0]], "t_b": [[2.0]], "t_w": [[1.0, 1.0]],
               "mem_f": [[10.0, 30.0, 20.0]], "mem_b": [[-4.0]], "mem_w": [[-99.0]]}
    m = Measurement(samples, [5.0, 7.0])
    assert m.profile == Profile(t_f=[3.0], t_b=[2.0], t_w=[1.0], t_comm=6.0, mem_f=[20.0], mem_b=[-4.0],
                                mem_w=[-16.0])
    assert m.noise()["t_f"] == [pytest.approx(2 / 3)]
    assert m.noise()["t_b"] == [0.0] and m.noise()["t_comm"] == [pytest.approx(1 / 6)]
    assert relative_iqr([0.0, 0.0]) == 0.0


def test_bad_input():
    model = load_model(ModelSpec(), 1)
    with pytest.raises(InputError, match="microbatch_size = 0"):
        ProfileOptions(microbatch_size=0)
    with pytest.raises(InputError, match="threads = 0"):
        ProfileOptions(threads=0)
    with pytest.raises(InputError, match="device = 'tpu'"):
        ProfileOptions(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device = 'cuda' but CUDA is not available"):
            measure(model, ProfileOptions(device="cuda"))
    with pytest.raises(InputError, match="layers = 2"):
        load_model(ModelSpec(layers=2), 3)
    with pytest.raises(InputError, match="no_such_module"):
        load_model(ModelSpec("no_such_module:stages"), 2)
    with pytest.raises(InputError, match="numel = 0"):
        measure_latency(0)
