"""Price one candidate: memory per device and the iteration time from the schedule itself,
from the per-stage times and activation sizes of :mod:`planner.costmodel.stages` (whose
names this module re-exports, so callers import the cost model from one place).

Two depths:
- :func:`estimate` (every candidate of a search): memory is exact (in-flight counts from the
  schedule's order, see :mod:`planner.schedules._inflight`); time is the busiest device's work
  plus the schedule's idle time scaled from the papers' bubble ratios.
- :func:`price` (the top candidates): the simulator times the real schedule with the
  durations of the candidate's :class:`Estimate` (computed once, never again by ``price``).
  For long runs it simulates ``timing_microbatches`` micro-batches and extends the steady
  state linearly, which tests check against simulating all of them.

An estimate depends on the placement (pipeline hops and the data-parallel ring cross nodes
or not): it records the one it was made with (``costs.placement``), and pricing it under a
context that places the candidate differently is a bug :func:`price` refuses.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import NamedTuple, overload

from planner.costmodel.adaptive import (
    bounded_shape,
    built_for_a_limit,
    memory_limit_for,
    searched_schedule,
)
from planner.costmodel.flops import model_flops_per_step
from planner.costmodel.memory import (
    GIB,
    bytes_per_parameter,
    stored_bytes_per_parameter,
)
from planner.costmodel.parameters import ALLOCATOR_FRAGMENTATION, WORKSPACE_GIB
from planner.costmodel.shapes import (
    Shape,
    chunk_parameters,
    inflight_microbatches,
    schedule_shape,
    shape_of,
    shape_profile,
    stages_by_device,
)
from planner.costmodel.stages import (
    PlanContext,
    StageCosts,
    num_stages,
    placement_for,
    split_layers,
    stage_costs,
)
from planner.placement import Placement
from planner.profiles import HardwareProfile
from planner.schedules import generate, schedule_family
from planner.schedules._engine import CompiledSchedule, compile_schedule
from planner.schedules._inflight import peak_from_profile
from planner.simulate import Durations, SimulationResult, simulate
from planner.specs import CandidateConfig

__all__ = [
    "EXACT_MEMORY_RUNS",
    "rebuilt_for_memory",
    "DeviceMemories",
    "DeviceMemory",
    "Estimate",
    "PlanContext",
    "Priced",
    "StageCosts",
    "chunk_parameters",
    "counted_shape",
    "device_memory",
    "estimate",
    "inflight_microbatches",
    "memory_allowance",
    "num_stages",
    "placement_for",
    "shape_profile",
    "stages_by_device",
    "price",
    "split_layers",
    "stage_costs",
]

# Schedules are priced with the candidate's own parameters (interleaved: its num_chunks, v
# stages a device; an adaptive schedule: its memory limit) and otherwise their family's
# defaults (2BW: the steady state of batches without a flush).


class DeviceMemory(NamedTuple):
    """Bytes on one pipeline device (made on demand by :class:`DeviceMemories`)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    allowance: float
    in_flight: float  # peak saved micro-batches of this device's stages

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.allowance


class DeviceMemories(Sequence[DeviceMemory]):
    """Bytes on every pipeline device of a candidate: a sequence of :class:`DeviceMemory`,
    kept as the columns the records are made of, with each device's total.

    A search estimates thousands of candidates and reads only the totals of most of them
    (the fit check, an over-memory rejection's prediction, the landscape): a device's record
    is made when it is asked for (by index or by iterating), from the same products its
    total was added from, so ``self[d].total == self.totals[d]`` exactly."""

    __slots__ = ("_activations", "_allowance", "_bytes", "_held", "_in_flight", "totals")

    def __init__(
        self,
        held: Sequence[float],
        activations: Sequence[float],
        in_flight: Sequence[float],
        bytes_per_parameter: tuple[float, float, float],
        workspace: float,
        fragmentation: float,
    ) -> None:
        """``held``: parameters of each device; ``bytes_per_parameter``: the bytes its
        weights, gradients and optimizer states store per parameter; every device adds
        ``workspace`` bytes and ``fragmentation`` x its tensors (:func:`memory_allowance`)."""
        weight_b, grad_b, opt_b = bytes_per_parameter
        per_param = weight_b + grad_b + opt_b
        allowance = [
            workspace + fragmentation * (h * per_param + a)
            for h, a in zip(held, activations, strict=True)
        ]
        self._held, self._activations, self._in_flight = held, activations, in_flight
        self._bytes, self._allowance = bytes_per_parameter, allowance
        # Added as DeviceMemory.total adds them: parameters, gradients, optimizer,
        # activations, allowance.
        self.totals: tuple[float, ...] = tuple(
            [
                h * weight_b + h * grad_b + h * opt_b + a + extra
                for h, a, extra in zip(held, activations, allowance, strict=True)
            ]
        )

    def __len__(self) -> int:
        return len(self.totals)

    @overload
    def __getitem__(self, index: int) -> DeviceMemory: ...

    @overload
    def __getitem__(self, index: slice) -> list[DeviceMemory]: ...

    def __getitem__(self, index: int | slice) -> DeviceMemory | list[DeviceMemory]:
        if isinstance(index, slice):
            return [self._record(d) for d in range(len(self))[index]]
        return self._record(index)

    def __iter__(self) -> Iterator[DeviceMemory]:
        return map(self._record, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceMemories):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # equal by value, like a list

    def __repr__(self) -> str:
        return f"DeviceMemories({list(self)!r})"

    def _record(self, device: int) -> DeviceMemory:
        held = self._held[device]
        weight_b, grad_b, opt_b = self._bytes
        return DeviceMemory(
            held * weight_b,
            held * grad_b,
            held * opt_b,
            self._activations[device],
            self._allowance[device],
            self._in_flight[device],
        )


def memory_allowance(hw: HardwareProfile) -> tuple[float, float]:
    """(workspace bytes, fragmentation fraction) every device adds on top of the tensors the
    memory model counts: a device needs tensors x (1 + fraction) + workspace. Both are the
    profile's free parameters (see :mod:`planner.costmodel.parameters` for what they stand
    for and where the defaults come from)."""
    return (
        hw.parameter(WORKSPACE_GIB.name) * GIB,
        hw.parameter(ALLOCATOR_FRAGMENTATION.name),
    )


def counted_shape(config: CandidateConfig) -> Shape:
    """The in-flight profile a candidate's memory is counted from: its schedule's shape, or
    for a schedule built for a memory limit (the adaptive ones, whose order depends on pass
    times not known here) the limit itself on every device."""
    if built_for_a_limit(config.schedule):
        return bounded_shape(config)
    return schedule_shape(config.schedule, config.p, config.num_microbatches, config.num_chunks)


def device_memory(
    ctx: PlanContext,
    config: CandidateConfig,
    costs: StageCosts,
    *,
    capacity: float = math.inf,
    shape: Shape | None = None,
) -> tuple[DeviceMemories, bool]:
    """Bytes per pipeline device (the worst tensor/data-parallel rank is identical), and
    whether activations were counted. When the weights, gradients and optimizer states of
    some device already exceed ``capacity`` the schedule is not built: activations are left
    at zero (the numbers are then a lower bound) and the flag is False. ``shape`` gives
    the in-flight counts of a schedule already built (else they come from the schedule's
    shape, or for one built for a memory limit from the limit itself)."""
    by_device = stages_by_device(config.schedule, config.p, config.num_chunks)
    params = _device_sums(costs.parameters, by_device)
    return _device_memory(ctx, config, costs, by_device, params, capacity, shape)


def _device_memory(
    ctx: PlanContext,
    config: CandidateConfig,
    costs: StageCosts,
    by_device: tuple[tuple[int, ...], ...],
    params: list[float],
    capacity: float,
    shape: Shape | None,
) -> tuple[DeviceMemories, bool]:
    """:func:`device_memory` given each device's parameters (``params``), which
    :func:`estimate` needs too."""
    stored = stored_bytes_per_parameter(
        ctx.request.training, config.weight_replicas, config.schedule
    )
    weight_b, grad_b, opt_b = stored
    static = max(params) * (weight_b + grad_b + opt_b)
    workspace, fragmentation = memory_allowance(ctx.hardware)
    counted = static * (1 + fragmentation) + workspace <= capacity
    if counted:
        if shape is None:
            shape = counted_shape(config)
        peaks = peak_from_profile(shape.profile, costs.activation_bytes)
        working = _device_maxima(costs.working_bytes, by_device)
        activations = [peak + work for peak, work in zip(peaks, working, strict=True)]
        in_flight: Sequence[float] = shape.in_flight
    else:
        activations = in_flight = [0.0] * config.p
    memory = DeviceMemories(params, activations, in_flight, stored, workspace, fragmentation)
    return memory, counted


def adaptive_limit(ctx: PlanContext, config: CandidateConfig, costs: StageCosts) -> float:
    """For a schedule built for a memory limit: the limit that uses what each device has
    left for activations on this hardware (see :mod:`planner.costmodel.adaptive`)."""
    weight_b, grad_b, opt_b = stored_bytes_per_parameter(
        ctx.request.training, config.weight_replicas, config.schedule
    )
    workspace, fragmentation = memory_allowance(ctx.hardware)
    return memory_limit_for(
        config,
        costs.parameters,
        costs.activation_bytes,
        costs.working_bytes,
        capacity=ctx.hardware.usable_memory_gib * GIB,
        workspace=workspace,
        fragmentation=fragmentation,
        bytes_per_parameter=weight_b + grad_b + opt_b,
    )


def _device_sums(values: Sequence[float], by_device: tuple[tuple[int, ...], ...]) -> list[float]:
    """Per device, the sum of its stages' values, added in stage order from 0.0 (plain
    Python: called several times per candidate, on a few dozen devices)."""
    if len(by_device) == len(values):  # every device holds a stage, so each exactly one
        return [0.0 + values[stage] for (stage,) in by_device]
    out = []
    for stages in by_device:
        total = 0.0
        for stage in stages:
            total += values[stage]
        out.append(total)
    return out


def _device_maxima(values: Sequence[float], by_device: tuple[tuple[int, ...], ...]) -> list[float]:
    """Per device, the largest of its stages' values."""
    if len(by_device) == len(values):  # one stage a device, as in :func:`_device_sums`
        return [values[stage] for (stage,) in by_device]
    return [max([values[stage] for stage in stages]) for stages in by_device]


def _data_parallel_seconds(
    ctx: PlanContext, config: CandidateConfig, placement: Placement, params_per_device: float
) -> float:
    """Gradient synchronisation once per step: with the distributed optimizer a
    reduce-scatter of the fp32 gradients and an all-gather of the updated 16-bit weights,
    otherwise an all-reduce; ring volume (d - 1) / d of the buffer each way. With context
    parallelism the ring spans the d x cp ranks that hold the same weights. ``placement``
    is the candidate's (its stage costs were priced with it)."""
    d = config.weight_replicas
    if d == 1:
        return 0.0
    r = ctx.request
    link = (
        ctx.hardware.intra_node if placement.data_groups_within_nodes else ctx.hardware.inter_node
    )
    weight_b, grad_b, _ = bytes_per_parameter(r.training, d)
    if r.training.distributed_optimizer:
        volume = (d - 1) / d * params_per_device * (grad_b + weight_b)
    else:
        volume = 2 * (d - 1) / d * params_per_device * grad_b
    return 2 * (d - 1) * link.latency_us * 1e-6 + volume / (link.bandwidth_gbps * 1e9)


def _optimizer_seconds(ctx: PlanContext, config: CandidateConfig, params: float) -> float:
    """The optimizer step is memory-bound: each rank reads and writes its optimizer states
    and the matching shard of gradients and weights (all of them without the distributed
    optimizer)."""
    training = ctx.request.training
    weight_b, grad_b, opt_b = bytes_per_parameter(training, config.weight_replicas)
    shard = config.weight_replicas if training.distributed_optimizer else 1
    moved = params * opt_b + params / shard * (weight_b + grad_b)
    return 2 * moved / (ctx.hardware.memory_bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class Estimate:
    config: CandidateConfig
    costs: StageCosts
    memory: DeviceMemories
    iteration_time_s: float
    busy_s: float
    activations_counted: bool = True
    data_parallel_s: float = 0.0  # gradient synchronisation, once per step
    optimizer_s: float = 0.0  # the optimizer step

    @property
    def device_totals(self) -> tuple[float, ...]:
        """Each device's total bytes (its :attr:`DeviceMemory.total`)."""
        return self.memory.totals

    @cached_property
    def peak_memory(self) -> float:
        # Cached: the fit check, the ranking and the landscape all read it. (An estimate is
        # frozen; dataclasses.replace makes a new one, with its own.)
        return max(self.memory.totals)

    @property
    def lower_bound_s(self) -> float:
        """A step time no simulation of this candidate can beat (what :func:`price` finds is
        at least this): for every device, the forwards of the stages before its first one
        (it cannot start earlier), its own compute, and for a fused backward the backwards
        of those stages after its last one (they wait for it), with a hop where stages
        change device; plus synchronisation and the optimizer. A family without a flush
        between batches (2BW) amortizes fill and drain, so only the compute counts."""
        config, costs = self.config, self.costs
        family = schedule_family(config.schedule)
        m = config.num_microbatches
        by_device = stages_by_device(config.schedule, config.p, config.num_chunks)
        work = _device_sums(costs.work, by_device)
        if not family.flush_per_batch:
            return m * max(work) + self.data_parallel_s + self.optimizer_s
        placement = family.stage_devices(config.p, chunk_parameters(config.num_chunks))
        head = tail = 0.0
        heads, tails = [0.0], [0.0]  # before stage s: forward chain, fused backward chain
        for s in range(len(placement) - 1):
            hop = costs.p2p_s if placement[s] != placement[s + 1] else 0.0
            head += costs.forward[s] + hop
            tail += costs.backward[s] + costs.weight[s] + hop
            heads.append(head)
            tails.append(tail)
        fused = not family.split_backward
        span = max(
            heads[stages[0]] + m * work[d] + (tails[stages[0]] if fused else 0.0)
            for d, stages in enumerate(by_device)
        )
        return span + self.data_parallel_s + self.optimizer_s


def estimate(ctx: PlanContext, config: CandidateConfig, capacity: float = math.inf) -> Estimate:
    """Fast pricing for ranking: exact memory, approximate time (see module docstring).
    With ``capacity`` (bytes), a candidate whose static memory alone exceeds it skips the
    activation count (``Estimate.activations_counted`` is then False)."""
    costs = stage_costs(ctx, config)
    m = config.num_microbatches
    by_device = stages_by_device(config.schedule, config.p, config.num_chunks)
    device_params = _device_sums(costs.parameters, by_device)
    memory, counted = _device_memory(ctx, config, costs, by_device, device_params, capacity, None)
    per_device = _device_sums(costs.work, by_device)
    busy = m * max(per_device)
    stage_time = sum(per_device) / config.p
    idle = (
        schedule_family(config.schedule).idle_estimate(config.memory_limit, config.num_chunks)
        * (config.p - 1)
        * (stage_time + 2 * costs.p2p_s)
    )
    params = max(device_params)
    dp = _data_parallel_seconds(ctx, config, costs.placement, params)
    opt = _optimizer_seconds(ctx, config, params)
    return Estimate(config, costs, memory, busy + idle + dp + opt, busy, counted, dp, opt)


@dataclass(frozen=True)
class Priced:
    """A candidate priced with the simulator."""

    estimate: Estimate
    iteration_time_s: float
    makespan_s: float  # ``simulation`` has the timeline only: memory comes from ``estimate``
    bubble_fraction: float
    data_parallel_s: float
    optimizer_s: float
    mfu: float
    simulation: SimulationResult
    simulated_microbatches: int


def _durations(costs: StageCosts) -> Durations:
    return Durations(
        forward=costs.forward,
        backward=costs.backward,
        weight=costs.weight,
        comm=costs.p2p_s,
        transfer=costs.transfer_s,
    )


@lru_cache(maxsize=256)
def _timing_schedule(
    schedule: str, p: int, m: int, batches: int | None = None, num_chunks: int | None = None
) -> CompiledSchedule:
    """The schedule ``price`` simulates, compiled once: every candidate of the shape reuses it.
    ``batches`` is given for families without a flush between batches (2BW), ``num_chunks``
    for those whose devices hold that many stages (interleaved)."""
    parameters = chunk_parameters(num_chunks)
    if batches is None:
        built = generate(schedule, p, m, check=False, **parameters)
    else:
        built = generate(schedule, p, m, check=False, num_batches=batches, **parameters)
    # Cached: keep the columns the engine reads, not 10^5 action objects the collector
    # would walk (and the service would hold) for as long as the entry lives.
    return compile_schedule(built.columns_only())


# Schedules searched for a memory limit: their memory is counted from the schedule that runs
# up to this many times the micro-batches simulated for the step time (see ``price``).
EXACT_MEMORY_RUNS = 4


def rebuilt_for_memory(m: int, simulated: int) -> bool:
    """Whether ``price`` builds a searched schedule's choice again, with all m micro-batches,
    to count its memory (with m == simulated the searched one is that schedule already)."""
    return simulated < m <= EXACT_MEMORY_RUNS * simulated


def timing_microbatches(schedule: str, p: int, m: int) -> int:
    """Micro-batches simulated exactly for the step time: 3p + 2 (a multiple of p for
    interleaved), so that both runs whose difference gives the steady-state slope (that and
    p fewer) are past the warm-up: V-Half and V-ZB with a heavier last stage settle only after
    about 2p + 2. GPipe's step time is affine in m from the start (each phase is a flow shop
    of identical micro-batches). The tests check all of them against simulating every
    micro-batch."""
    cap = 3 * p + 2
    if schedule_family(schedule).microbatches_multiple_of_devices:
        cap = -(-cap // p) * p
    return min(m, cap)


def price(ctx: PlanContext, est: Estimate) -> Priced:
    """Simulate the estimated candidate's schedule with its durations (steady state extended
    past ``timing_microbatches`` micro-batches) and add data-parallel sync and the optimizer
    step. ``est`` must come from :func:`estimate` under ``ctx``'s placement of the candidate;
    its memory is what the plan reports, except for schedules searched under their own pass
    times, whose memory is counted from the schedule the search chose. An estimate made with
    a ``capacity`` its static memory exceeded (activations not counted) prices the same time;
    its memory stays a lower bound."""
    config = est.config
    assert est.costs.placement == placement_for(
        config, ctx.request.cluster.gpus_per_node, ctx.placements
    ), "the estimate was made under another placement of this candidate; estimate it again"
    costs = est.costs
    durations = _durations(costs)
    m = config.num_microbatches
    simulated = timing_microbatches(config.schedule, config.p, m)
    family = schedule_family(config.schedule)
    batches = None if family.flush_per_batch else 2
    chunks = config.num_chunks
    if family.uses_pass_times:
        # Searched under this candidate's own pass times. Its memory is counted from what
        # runs: the search's choice built with all m micro-batches, as the launch builds it.
        # The simulated ones do not do: under a generous limit a device keeps more
        # micro-batches the more there are, and the choice's heuristics hold them differently
        # at another count (zb-adaptive, p = 8, m = 96, limit 5.75 kept 46 where its 26
        # simulated kept 26). Past EXACT_MEMORY_RUNS x the simulated count that build costs
        # more than the search (4 s for zb-adaptive at p = 64, m = 16,384): the estimate's
        # count stays, the limit itself on every device, which the schedule never exceeds.
        built = searched_schedule(
            config, costs.forward, costs.backward, costs.weight, costs.p2p_s, simulated
        )
        assert family.rebuild is not None  # every family that searches can rebuild
        if m == simulated or rebuilt_for_memory(m, simulated):
            runs = built if m == simulated else family.rebuild(built.meta["choice"], config.p, m)
            memory, _ = device_memory(ctx, config, costs, shape=shape_of(runs))
            est = replace(est, memory=memory)
        schedule = compile_schedule(built)
    else:
        schedule = _timing_schedule(config.schedule, config.p, simulated, batches, chunks)
    result = simulate(schedule, durations, track_memory=False)
    makespan = result.makespan
    if batches is not None:
        # No flush between batches (2BW): one more batch costs makespan(3) - makespan(2).
        three = _timing_schedule(config.schedule, config.p, simulated, batches + 1, chunks)
        per_batch = simulate(three, durations, track_memory=False).makespan - makespan
        makespan = per_batch * m / simulated
    elif m > simulated:
        step = config.p
        if family.rebuild is not None:  # the same choice, p micro-batches fewer
            choice = schedule.schedule.meta["choice"]
            shorter = compile_schedule(family.rebuild(choice, config.p, simulated - step))
        else:
            shorter = _timing_schedule(config.schedule, config.p, simulated - step, None, chunks)
        slope = (makespan - simulate(shorter, durations, track_memory=False).makespan) / step
        # Past the warm-up every micro-batch costs the busiest device its whole work; with
        # uneven stages the last p simulated micro-batches can still be filling bubbles and
        # measure less (up to 2.7% under the full simulation for random stage times).
        makespan += (m - simulated) * max(slope, est.busy_s / m)
    dp, opt = est.data_parallel_s, est.optimizer_s
    iteration = makespan + dp + opt
    busy = m * max(d.busy for d in result.devices) / (simulated * schedule.schedule.num_batches)
    r = ctx.request
    flops = model_flops_per_step(r.model, r.training.global_batch_size)
    mfu = flops / (iteration * r.cluster.num_gpus * ctx.hardware.peak(r.training.precision))
    bubble = max(0.0, 1.0 - busy / makespan) if makespan > 0 else 0.0
    return Priced(est, iteration, makespan, bubble, dp, opt, mfu, result, simulated)
