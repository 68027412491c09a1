"""What is known of a configuration of ``zbsolve configure`` before it is timed, from ``predict``'s own model, split
and order: whether its devices can hold their static bytes and the activations every order holds (``group_fits``
for a group whatever its virtual stages, ``memory_fits`` for one configuration: where they cannot, no order fits,
and ``predict`` says so; ``order_fits`` for the activations the configuration's own order holds), and lower bounds on
``predict``'s step (``group_bound``, ``step_bound``)."""

from __future__ import annotations

from collections.abc import Sequence

from zbsolve.configure.predict import Configuration
from zbsolve.core.memory import least_held, peak
from zbsolve.core.placement import Placement
from zbsolve.core.profile import Profile
from zbsolve.costmodel.model import Model
from zbsolve.costmodel.step_tail import device_tail, window
from zbsolve.optimize.bound_terms import pair_saving, route_stages
from zbsolve.problem.costs import Costs
from zbsolve.problem.partition import stage_profile
from zbsolve.problem.recompute import Recompute, parse_recompute
from zbsolve.problem.recompute_costs import layer_costs
from zbsolve.schedulers.builtins import builtin_schedule


class ModelAsOneStage:
    """What ``group_fits`` and ``group_bound`` read of one model, each of its profiles as one stage built once (a
    search weighs every recomputation choice of every model it estimates)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        """The model."""
        self.static = sum(layer.static_bytes for layer in model.layers if layer.shares is None)
        """Static bytes of every layer, a shared weight once."""
        self.params = sum(layer.params or 0 for layer in model.layers if layer.shares is None)
        """Parameters of every layer, a shared weight once."""
        self._profiles: dict[Recompute, Profile] = {}
        self._least: float | None = None

    def profile(self, recompute: Recompute) -> Profile:
        """The model as one stage, its blocks recomputing as ``recompute`` says, those a split chooses (uniform:N)
        timed as not recomputed: recomputation only adds to B."""
        least = recompute._replace(mode="none", blocks=0) if recompute.mode == "uniform" else recompute
        if least not in self._profiles:
            whole = [(0, len(self.model.layers))]
            self._profiles[least] = stage_profile(self.model, whole, least.layers(self.model, whole),
                                                  least.selected(self.model, whole), least.module_names(self.model))
        return self._profiles[least]

    def kept(self, recompute: Recompute) -> float:
        """What every layer's F keeps under ``recompute``, each layer's least where a split chooses (uniform:N: a
        block recomputed whole or not)."""
        if recompute.mode != "uniform":
            return self.profile(recompute).delta("F", 0)
        if self._least is None:
            self._least = sum(min(layer_costs(self.model, i, False)["mem_f"], layer_costs(self.model, i, True)["mem_f"])
                              if layer.block else layer_costs(self.model, i, False)["mem_f"]
                              for i, layer in enumerate(self.model.layers))
        return self._least


def group_bound(whole: ModelAsOneStage, num_microbatches: int, pp: int, recompute: Recompute, paired: bool) -> float:
    """A lower bound on the step of ``whole``'s model over ``pp`` pipeline ranks with ``recompute``, whatever the
    split and the virtual stages, for orders that overlap F&B pairs where ``paired``: the step is the busiest
    device's share, at least the average one, its passes and its tail (``core.objective``). Every microbatch's F, B
    and W of every layer over ``pp`` devices, less what overlapped pairs could save (``core.overlap.most_saved``,
    each pass in one pair at most; nothing unless ``paired``), and the devices' tails: each device's
    (``costmodel.step_tail``) grows with its parameters, by less for each added one (the last bucket, one latency),
    and is 0 without any, and what it shows past its one-microbatch work (``step_tail.exposed``) sums over the
    devices to at least what the whole shows past the whole's, so together they are at least the tail of one
    device holding every parameter and every layer's work. Where pairs
    save nothing, microbatch 0 runs the F then the B of every layer one after the other. Blocks a split chooses to
    recompute (uniform:N) are timed as not recomputed (``ModelAsOneStage.profile``), and what pairs save grows by
    less than recomputation adds."""
    profile = whole.profile(recompute)
    saved = _saved(profile, [0]) if paired else 0.0
    chain = 0.0 if saved else profile.time("F", 0) + profile.time("B", 0)
    step = whole.model.step
    tail = 0.0 if step is None else device_tail(whole.params, step, window(whole.model.layers)).unslowed
    return max((num_microbatches * (_device_work(profile, [0], False) - saved) + tail) / pp, chain)


def group_fits(whole: ModelAsOneStage, c: Configuration) -> str | None:
    """Why no device of ``c`` (of ``whole``'s model) over its ``pp`` ranks can fit, whatever the split and virtual
    stages, or None: the heaviest device holds at least the average static bytes and, after one microbatch's F, the
    average of what every layer's F keeps (``ModelAsOneStage.kept``), by the one test of a fit
    (``Costs.first_over``)."""
    average, static, kept = _average(whole, c)
    if average.first_over([kept]) is None:
        return None
    return (f"{c.recompute}: {average.shortfall(0, {'static': static, 'one microbatch': kept})} on average "
            f"over pp = {c.pp}")


def group_need(whole: ModelAsOneStage, c: Configuration) -> float:
    """The bytes the heaviest device of ``c`` needs at least, whatever the split and virtual stages: the average static
    bytes, the average of what every layer's F keeps and the reserve (``group_fits``' bound)."""
    average, static, kept = _average(whole, c)
    return static + kept + average.reserve


def group_likely(whole: ModelAsOneStage, c: Configuration, num_microbatches: int) -> bool:
    """A guess, no bound (``likely_fits`` on average): whether the average device of ``c`` over its ``pp`` ranks fits
    its static bytes and what every layer's F keeps for as many microbatches as there are ranks (at most
    ``num_microbatches``)."""
    average, _, kept = _average(whole, c)
    return average.first_over([min(num_microbatches, c.pp) * kept]) is None


def _average(whole: ModelAsOneStage, c: Configuration) -> tuple[Costs, int, float]:
    """The average device of ``c`` over its ``pp`` ranks: its costs (its static bytes, the device memory and
    reserve), those static bytes, and what every layer's F keeps there under ``c``'s recomputation
    (``ModelAsOneStage.kept``)."""
    static, kept = whole.static // c.pp, whole.kept(parse_recompute(c.recompute)) / c.pp
    return Costs(whole.model, (), c.memory, c.kept, (static,)), static, kept


def _device_work(profile: Profile, stages: Sequence[int], paired: bool) -> float:
    """Seconds one microbatch's F, B and W of ``stages`` take on one device, less what pairs could save where
    ``paired``."""
    return sum(sum(profile.durations(s)) for s in stages) - (_saved(profile, stages) if paired else 0.0)


def _saved(profile: Profile, stages: Sequence[int]) -> float:
    """The most overlapped F&B pairs could save of one microbatch's passes of ``stages`` on one device, each pass in
    one pair at most (``optimize.bound_terms.pair_saving``, which grows with the computation and the communication)."""
    work = sum(sum(profile.durations(s)) for s in stages)
    comm = sum(profile.comm("F", s) + profile.comm("B", s) for s in stages)
    return pair_saving(work - comm, comm, profile.overlap_saving, profile.overlap_slowdown)


def memory_fits(profile: Profile, placement: Placement, costs: Costs) -> bool:
    """Whether every device can hold its static bytes and the least activations any order holds there
    (``least_activations``) within the device memory less the reserve, by the one test of a fit
    (``Costs.first_over``): where it cannot, no order fits, ``predict``'s included."""
    return costs.first_over(least_activations(profile, placement)) is None


def order_peaks(profile: Profile, name: str, pp: int, num_microbatches: int, vp: int) -> list[float]:
    """Per device, the peak activations of built-in order ``name`` (``builtin_schedule``: 1F1B's rank d holds
    p - d microbatches' F when its first B starts, the interleaved order more) on ``profile``, by the memory rule
    (``core.memory.peak``): a running sum of the passes' deltas in each device's order, which no timing changes."""
    schedule = builtin_schedule(name, profile, pp, num_microbatches, vp)
    return [peak(schedule, d) for d in range(pp)]


def order_fits(profile: Profile, costs: Costs, name: str, pp: int, num_microbatches: int, vp: int) -> bool:
    """Whether every device can hold its static bytes and the activations order ``name`` holds there at its peak
    (``order_peaks``) within the device memory less the reserve (``Costs.first_over``). A valid test for pruning:
    ``predict`` runs that order on these costs (``planning.runs.builtin_run``) and the simulator's peak is the same
    running sum, so its device needs at least the static bytes, that peak and the bytes outside the allocator
    (the costs' reserve), with the pipeline buffers and fragmentation besides: where this test fails, ``predict``
    says the configuration does not fit."""
    return costs.first_over(order_peaks(profile, name, pp, num_microbatches, vp)) is None


def order_need(profile: Profile, costs: Costs, name: str, pp: int, num_microbatches: int, vp: int) -> float:
    """The bytes the busiest device needs at order ``name``'s peak: its static bytes, that peak (``order_peaks``) and
    the reserve (``order_fits``' bound)."""
    return max(costs.needed(order_peaks(profile, name, pp, num_microbatches, vp)))


def likely_fits(profile: Profile, placement: Placement, costs: Costs, num_microbatches: int) -> bool:
    """A guess, no bound: whether every device fits holding the F of each of its stages for as many microbatches as
    there are pipeline ranks (at most ``num_microbatches``), as 1F1B's first rank does when its first B starts."""
    held = min(num_microbatches, placement.num_devices)
    return costs.first_over([held * need for need in least_activations(profile, placement)]) is None


def least_activations(profile: Profile, placement: Placement) -> list[float]:
    """Per device, activation bytes every order reaches (the memory rule, ``core.memory``): when a microbatch's
    last F on the device starts, the F of each of its stages is held; while its backward of a stage runs, that
    stage's F and the least that backward holds, as B or as one BW (``core.memory.least_held``). A
    microbatch never holds less than nothing (its B leaves what its W reads, its W the rest), so the others only
    add."""
    needs = []
    for stages in route_stages(placement.routes[0], placement.num_devices):
        forward = sum(profile.delta("F", s) for s in stages)
        needs.append(max(forward, max(profile.delta("F", s) + least_held(profile, s) for s in stages)))
    return needs


def step_bound(profile: Profile, placement: Placement, num_microbatches: int, paired: bool) -> float:
    """A lower bound on the step of any order of ``num_microbatches`` on ``profile`` placed by ``placement`` (its
    one route): each device's share is at least the F of the stages before its first one (no pass of it can start
    before microbatch 0 reaches it; dropped where F&B pairs run, ``paired``), all of its passes one after the other
    (less what pairs could save) and its tail (``Profile.device_tails``)."""
    tails = profile.device_tails(placement)
    shares = []
    for d, stages in enumerate(route_stages(placement.routes[0], placement.num_devices)):
        head = 0.0 if paired else sum(profile.time("F", s) for s in range(stages[0]))
        shares.append(head + num_microbatches * _device_work(profile, stages, paired) + tails[d])
    return max(shares)
