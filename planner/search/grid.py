"""Grid search over (t, p, d, micro-batch size, recompute, schedule).

Constraints (BPipe §4.2, generalised): heads % t == 0 and key/value heads % t == 0; t divides
the GPUs per node; t x cp x p x d == number of GPUs (cp the context-parallel degree, see
:func:`context_degrees`); global batch % (mb x d) == 0; layers spread over the schedule's
stages with no empty middle stage; interleaved needs m % p == 0 and p >= 2; 2BW needs m >= p;
BPipe and V-shape need p >= 2. Every point that breaks one is listed as rejected with the
reason, as is every candidate over the device's memory (with its predicted numbers).

Feasible candidates are ranked by the fast estimate; the best ``2 x top_k`` are priced with
the simulator and re-ranked by that, together with every schedule's exactly simulated best
(found by simulating its configurations in order of a lower bound until the bound cannot
beat the best found).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner._gc import collector_paused
from planner.costmodel.evaluate import (
    Estimate,
    PlanContext,
    Priced,
    adaptive_limit,
    estimate,
    num_stages,
    price,
    split_layers,
    stage_costs,
)
from planner.costmodel.layer_ops import fused_softmax_available
from planner.costmodel.memory import GIB
from planner.costmodel.timing import time_provenance
from planner.launch.artefacts import candidate_launch
from planner.launch.runtimes import runtime_limits
from planner.profiles import ProfileStore, default_store
from planner.schedules import BASELINE_SCHEDULE, MEMORY_LIMIT, RUNTIMES, schedule_family
from planner.search.gains import limit_note
from planner.specs import (
    DEFAULT_MICRO_BATCH_SIZES,
    Candidate,
    CandidateConfig,
    LandscapePoint,
    Plan,
    PlanRequest,
    PlanStats,
    Predicted,
    RefinementInfo,
    Rejected,
    ScheduleSummary,
    StageBreakdown,
)

if TYPE_CHECKING:
    from planner.search.refinement import Refined

__all__ = [
    "DEFAULT_MICRO_BATCH_SIZES",
    "SearchPoint",
    "plan",
    "schedule_problem",
    "search_points",
]


@dataclass(frozen=True)
class SearchPoint:
    """(t, p, d, micro-batch size, cp) of the search space."""

    t: int
    p: int
    d: int
    mb: int
    cp: int = 1


def _divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(sqrt n) steps (n may be a cluster's GPUs)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def context_degrees(request: PlanRequest, t: int) -> list[int]:
    """Context-parallel degrees searched with tensor-parallel degree t: the request's
    ``search.context_parallel``, or by default 1 and, with flash attention (Megatron-LM runs
    context parallelism only through it), every cp > 1 that keeps the t x cp group inside a
    node and splits the sequence into 2 x cp equal chunks."""
    wanted = request.search.context_parallel
    if wanted is not None:
        return wanted
    if not request.training.flash_attention:
        return [1]
    seq = request.model.seq_length
    return [
        cp for cp in _divisors(request.cluster.gpus_per_node // t) if cp == 1 or seq % (2 * cp) == 0
    ]


def search_points(request: PlanRequest) -> Iterator[tuple[SearchPoint, int]]:
    """(t, p, d, mb, cp) that meet the parallelism and batch constraints, with m."""
    model, cluster, training = request.model, request.cluster, request.training
    gpus = cluster.num_gpus
    sizes = request.search.micro_batch_sizes or list(DEFAULT_MICRO_BATCH_SIZES)
    batch = training.global_batch_size
    for t in _divisors(cluster.gpus_per_node):
        if t > gpus or gpus % t:
            continue
        if model.num_attention_heads % t or model.query_groups % t or model.ffn % t:
            continue  # Megatron's column-parallel layers split the heads and the MLP over t
        for cp in context_degrees(request, t):
            if gpus % (t * cp):
                continue
            for p in _divisors(gpus // (t * cp)):
                d = gpus // (t * cp * p)
                for mb in sizes:
                    if batch % (mb * d):
                        continue
                    yield SearchPoint(t, p, d, mb, cp), batch // (mb * d)


def schedule_problem(schedule: str, point: SearchPoint, m: int, layers: int) -> str | None:
    """Why ``schedule`` cannot run at this point (a readable reason), or None."""
    p = point.p
    problem = schedule_family(schedule).problem(p, m)
    if problem is not None:
        return problem
    stages = num_stages(schedule, p)
    split = split_layers(layers, stages)
    if split is None or min(split) == 0:
        return (
            f"{layers} layers cannot fill {stages} stages of {schedule}: every stage needs at "
            f"least one layer (a stage of only the embedding or the output layer cannot be "
            f"launched); use fewer pipeline devices"
        )
    return None


def _runtime_problem(request: PlanRequest, config: CandidateConfig, runtime: str) -> str | None:
    """Why the request's search.runtime cannot run ``config`` as planned; with ``any``, why
    no runtime can. (torch.distributed.pipelining runs every schedule it has as planned, so
    the runtimes of a schedule it has are only looked at when one was asked for.)"""
    if runtime == "any":
        if config.cp == 1 and "torch" in schedule_family(config.schedule).runtimes:
            return None
        limits = runtime_limits(request, config)
        if len(limits) < len(RUNTIMES):
            return None
        return "no runtime can run it as planned: " + "; ".join(limits.values())
    reason = runtime_limits(request, config).get(runtime)  # type: ignore[call-overload]
    return None if reason is None else f"search.runtime is {runtime}, which cannot run it: {reason}"


def _config(
    point: SearchPoint, m: int, recompute: str, schedule: str, layers: list[int]
) -> CandidateConfig:
    return CandidateConfig(
        t=point.t,
        p=point.p,
        d=point.d,
        cp=point.cp,
        micro_batch_size=point.mb,
        num_microbatches=m,
        recompute=recompute,
        schedule=schedule,
        layers_per_stage=layers,
    )


def _with_memory_limit(
    ctx: PlanContext, config: CandidateConfig
) -> tuple[CandidateConfig, str | None]:
    """``config`` with the memory limit its schedule is built for: all that its devices can
    still hold for activations, or the largest limit that changes the schedule if that is
    less. A limit below what the family can reach is a rejection that says so."""
    limit = adaptive_limit(ctx, config, stage_costs(ctx, config))
    family = schedule_family(config.schedule)
    assert family.smallest_memory_limit is not None and family.largest_memory_limit is not None
    smallest = family.smallest_memory_limit(config.p, config.num_microbatches)
    # Beyond the largest useful limit the schedule is the same: record that one.
    limit = min(limit, family.largest_memory_limit(config.p, config.num_microbatches))
    if limit < smallest:
        return config, (
            f"{config.schedule}: the memory left for activations allows {limit:.3g} of "
            f"1F1B's peak, below the smallest limit it can reach ({smallest:.3g})"
        )
    return config.model_copy(update={"memory_limit": limit}), None


def _predicted_from_estimate(ctx: PlanContext, est: Estimate) -> Predicted:
    request = ctx.request
    samples = request.training.global_batch_size / est.iteration_time_s
    memory = [round(m.total / GIB, 3) for m in est.memory]
    source, error = time_provenance(est.costs.layer, ctx.hardware)
    return Predicted(
        iteration_time_s=est.iteration_time_s,
        samples_per_s=samples,
        tokens_per_s=samples * request.model.seq_length,
        mfu=0.0,
        bubble_fraction=max(0.0, 1 - est.busy_s / est.iteration_time_s),
        memory_gib_per_device=memory,
        peak_memory_gib=max(memory),
        time_source=source,
        calibration_error=error,
    )


def _memory_reason(est: Estimate, gpu: str, usable_gib: float) -> str:
    worst = max(range(len(est.memory)), key=lambda i: est.memory[i].total)
    parts = est.memory[worst]
    static = (
        f"parameters {parts.parameters / GIB:.1f}, gradients {parts.gradients / GIB:.1f}, "
        f"optimizer {parts.optimizer / GIB:.1f}"
    )
    if not est.activations_counted:
        return (
            f"out of memory before any activation: device {worst} needs "
            f"{parts.total / GIB:.1f} GiB > {usable_gib:.1f} GiB usable on {gpu} ({static}, "
            f"allowance {parts.allowance / GIB:.1f}); more pipeline or tensor parallelism, or "
            f"the distributed optimizer, would shard it"
        )
    return (
        f"out of memory: device {worst} needs {parts.total / GIB:.1f} GiB > "
        f"{usable_gib:.1f} GiB usable on {gpu} ({static}, activations "
        f"{parts.activations / GIB:.1f} for {parts.in_flight:.2g} micro-batches in flight, "
        f"allowance {parts.allowance / GIB:.1f})"
    )


def plan(request: PlanRequest, store: ProfileStore | None = None) -> Plan:
    """Search the request's space and return the ranked, launchable plan."""
    with collector_paused():
        return _plan(request, store)


def _plan(request: PlanRequest, store: ProfileStore | None) -> Plan:
    started = time.perf_counter()
    ctx = PlanContext.from_store(request, store or default_store())
    hardware = ctx.hardware
    hardware.peak(request.training.precision)  # fails early for bf16 on a V100
    capacity = hardware.usable_memory_gib * GIB
    rejected: list[Rejected] = []
    feasible: list[Estimate] = []
    over_memory: list[Estimate] = []
    evaluated = 0
    layers_total = request.model.num_layers
    wanted = request.search.runtime
    for point, m in search_points(request):
        base_fits: dict[tuple[str, str], bool] = {}  # (schedule, recompute) at this point
        for schedule in request.search.schedules:
            problem = schedule_problem(schedule, point, m, layers_total)
            layers = split_layers(layers_total, num_stages(schedule, point.p)) or []
            base = schedule_family(schedule).memory_fallback_for
            if base not in request.search.schedules:
                base = None  # asked for on its own: priced as asked
            for recompute in request.search.recompute:
                config = _config(point, m, recompute, schedule, layers)
                evaluated += 1
                refused = problem
                if refused is None:
                    refused = _runtime_problem(request, config, wanted)
                if refused is None and base is not None:
                    refused = _fallback_problem(ctx, config, base, capacity, base_fits)
                if refused is None and schedule_family(schedule).has_parameter(MEMORY_LIMIT.name):
                    config, refused = _with_memory_limit(ctx, config)
                if refused is not None:
                    rejected.append(Rejected(config=config, reason=refused))
                    continue
                est = estimate(ctx, config, capacity)
                if est.peak_memory > capacity:
                    over_memory.append(est)
                    rejected.append(
                        Rejected(
                            config=config,
                            reason=_memory_reason(est, hardware.name, hardware.usable_memory_gib),
                            predicted=_predicted_from_estimate(ctx, est),
                        )
                    )
                    continue
                feasible.append(est)
    feasible.sort(key=lambda e: e.iteration_time_s)
    top_k = request.search.top_k
    refined: list[Refined] = []
    refine_notes: list[str] = []
    if request.search.method == "cpsat":
        # Imported here: OR-Tools (and the pandas it loads) take about 0.2 s to import,
        # which every grid search, the CLI's included, would otherwise pay.
        from planner.search.refinement import refine_plan

        # First: it sets the optimized placements every pricing below then uses.
        refined, refine_notes = refine_plan(ctx, request, feasible, over_memory, capacity)
    simulated = {i: price(ctx, e.config) for i, e in enumerate(feasible[: 2 * top_k])}
    best_of = _best_of_each_schedule(ctx, feasible, simulated)
    pool: list[tuple[Priced, RefinementInfo | None]] = [(pr, None) for pr in simulated.values()]
    pool += [
        (r.priced, r.info)
        for r in refined
        if wanted == "any" or _runtime_problem(request, r.priced.estimate.config, wanted) is None
    ]
    pool.sort(key=lambda item: item[0].iteration_time_s)
    candidates = [
        _candidate(ctx, pr, info, limit_note(ctx, pr, feasible)) for pr, info in pool[:top_k]
    ]
    if candidates and refine_notes:
        candidates[0] = candidates[0].model_copy(
            update={"notes": candidates[0].notes + refine_notes}
        )
    by_schedule = _summaries(request, feasible, best_of, [r.priced for r in refined])
    elapsed = (time.perf_counter() - started) * 1e3
    return Plan(
        id=uuid.uuid4().hex,
        request=request,
        best=candidates[0] if candidates else None,
        candidates=candidates,
        rejected=rejected,
        stats=PlanStats(evaluated=evaluated, feasible=len(feasible), search_ms=elapsed),
        by_schedule=by_schedule,
        landscape=[
            LandscapePoint(
                label=_label(e.config),
                samples_per_s=request.training.global_batch_size / e.iteration_time_s,
                peak_memory_gib=e.peak_memory / GIB,
            )
            for e in feasible
        ],
    )


def _fallback_problem(
    ctx: PlanContext,
    config: CandidateConfig,
    base: str,
    capacity: float,
    cache: dict[tuple[str, str], bool],
) -> str | None:
    """Why a memory-saving variant (BPipe) is not searched here: its base schedule, searched
    too, fits the same configuration, so the variant's transfers would only cost time."""
    key = (base, config.recompute)
    fits = cache.get(key)
    if fits is None:
        layers = split_layers(sum(config.layers_per_stage), num_stages(base, config.p)) or []
        base_config = config.model_copy(update={"schedule": base, "layers_per_stage": layers})
        fits = cache[key] = estimate(ctx, base_config, capacity).peak_memory <= capacity
    if not fits:
        return None
    return (
        f"{base} fits this configuration, so {config.schedule} would only add transfers: "
        f"it balances memory only where {base} runs out of it (BPipe §4.2)"
    )


def _label(config: CandidateConfig) -> str:
    cp = f" cp{config.cp}" if config.cp > 1 else ""
    return (
        f"t{config.t}{cp} p{config.p} d{config.d} mb{config.micro_batch_size} "
        f"{config.recompute} {config.schedule}"
    )


def _best_of_each_schedule(
    ctx: PlanContext, feasible: list[Estimate], simulated: dict[int, Priced]
) -> dict[str, Priced]:
    """The exactly simulated best configuration of every schedule among all that fit.

    Per schedule, candidates are simulated in order of their lower bound (the busiest
    device's compute, which no schedule beats) until the next bound is no better than the
    best simulated so far. Configurations the ranking already simulated (``simulated``, by
    index in ``feasible``) are reused, and every one simulated here is added to it, so the
    ranking sees each schedule's best too."""
    order: dict[str, list[tuple[float, int]]] = {}
    for index, est in enumerate(feasible):
        order.setdefault(est.config.schedule, []).append((est.lower_bound_s, index))
    best: dict[str, Priced] = {}
    for name, bounds in order.items():
        found = None
        for bound, index in sorted(bounds):
            if found is not None and bound >= found.iteration_time_s:
                break
            pr = simulated.get(index)
            if pr is None:
                pr = simulated[index] = price(ctx, feasible[index].config)
            if found is None or pr.iteration_time_s < found.iteration_time_s:
                found = pr
        if found is not None:
            best[name] = found
    return best


def _summaries(
    request: PlanRequest,
    feasible: list[Estimate],
    best_of: dict[str, Priced],
    refined: list[Priced],
) -> list[ScheduleSummary]:
    """The best configuration of each requested schedule: its exactly simulated best
    (:func:`_best_of_each_schedule`), or a CP-SAT refinement of it when faster."""
    best = dict(best_of)
    for pr in refined:
        name = pr.estimate.config.schedule
        if name not in best or pr.iteration_time_s < best[name].iteration_time_s:
            best[name] = pr
    counts: dict[str, int] = {}
    for est in feasible:
        counts[est.config.schedule] = counts.get(est.config.schedule, 0) + 1
    baseline = best.get(BASELINE_SCHEDULE)
    out = []
    for name in request.search.schedules:
        found = best.get(name)
        speedup = None
        if found is not None and baseline is not None:
            speedup = baseline.iteration_time_s / found.iteration_time_s
        out.append(
            ScheduleSummary(
                schedule=name,
                semantics=schedule_family(name).semantics,
                feasible=counts.get(name, 0),
                best_config=found.estimate.config if found else None,
                best_iteration_time_s=found.iteration_time_s if found else None,
                speedup_vs_1f1b=speedup,
            )
        )
    return out


def _candidate(
    ctx: PlanContext,
    priced: Priced,
    refinement: RefinementInfo | None = None,
    note: str | None = None,
) -> Candidate:
    request = ctx.request
    est = priced.estimate
    config = est.config
    samples = request.training.global_batch_size / priced.iteration_time_s
    memory = [round(m.total / GIB, 3) for m in est.memory]
    source, error = time_provenance(est.costs.layer, ctx.hardware)
    predicted = Predicted(
        iteration_time_s=priced.iteration_time_s,
        samples_per_s=samples,
        tokens_per_s=samples * request.model.seq_length,
        mfu=priced.mfu,
        bubble_fraction=priced.bubble_fraction,
        memory_gib_per_device=memory,
        peak_memory_gib=max(memory),
        time_source=source,
        calibration_error=error,
    )
    launch = candidate_launch(ctx, priced)
    family = schedule_family(config.schedule)
    return Candidate(
        config=config,
        predicted=predicted,
        launch=launch.launch,
        runtimes=launch.runtimes,
        runtime_limits=dict(launch.limits),
        semantics=family.semantics,
        breakdown=_breakdown(priced),
        notes=_notes(ctx, priced) + ([note] if note else []) + launch.notes,
        refinement=refinement,
    )


def _breakdown(priced: Priced) -> list[StageBreakdown]:
    est = priced.estimate
    config = est.config
    costs = est.costs
    sim = priced.simulation
    scale = config.num_microbatches / (priced.simulated_microbatches * sim.schedule.num_batches)
    out = []
    for device in range(config.p):
        stages = list(sim.schedule.stages_of(device))
        compute = sum(costs.forward[s] + costs.backward[s] + costs.weight[s] for s in stages)
        tp = sum(costs.tp_comm[s] for s in stages)
        m = config.num_microbatches
        mem = est.memory[device]
        out.append(
            StageBreakdown(
                device=device,
                stages=stages,
                layers=sum(config.layers_per_stage[s] for s in stages),
                compute_s=m * compute,
                communication_s=m * (tp + 2 * costs.p2p_s),
                bubble_s=max(0.0, priced.makespan_s - sim.devices[device].busy * scale),
                parameters_gib=mem.parameters / GIB,
                gradients_gib=mem.gradients / GIB,
                optimizer_gib=mem.optimizer / GIB,
                activations_gib=mem.activations / GIB,
                allowance_gib=mem.allowance / GIB,
                in_flight_microbatches=mem.in_flight,
            )
        )
    return out


def _transfer_note(transfer: float, forward: float, backward: float) -> str:
    """BPipe Appendix B: an evict (or load) must finish within one forward to hide (Eqs. 7-9);
    with the paper's pairing of an evict and a load over a backward and a forward, within
    (F + B) / 2 (Eqs. 10-12). The simulator overlaps each transfer with one compute action,
    so it prices the strict condition."""
    head = (
        f"BPipe transfer {transfer * 1e3:.2f} ms per micro-batch vs forward {forward * 1e3:.2f} ms"
    )
    if transfer <= forward:
        return f"{head}: hidden behind compute (BPipe Appendix B, Eqs. 7-9)"
    if 2 * transfer <= forward + backward:
        return (
            f"{head}: longer than the forward but within (F + B) / 2 = "
            f"{(forward + backward) / 2 * 1e3:.2f} ms, BPipe's relaxed bound (Appendix B, "
            "Eqs. 10-12), which pairs an evict and a load over a backward and a forward; priced "
            "here as stretching the step"
        )
    return f"{head}: longer than (F + B) / 2 as well, so it stretches the step (Appendix B)"


def _softmax_fallback_note(ctx: PlanContext, config: CandidateConfig) -> str | None:
    """Megatron's fused softmax needs b x a/t attention batches in multiples of 4 (and
    16 < s <= 4096, 16-bit); elsewhere its fp32 fallback makes five passes over the scores
    each way: why BPipe Table 7's 1F1B rows with selective recompute ran at 36-40% MFU."""
    r = ctx.request
    if r.training.flash_attention or fused_softmax_available(
        r.model, r.training, config.micro_batch_size, config.t
    ):
        return None
    batches = config.micro_batch_size * r.model.num_attention_heads // config.t
    return (
        f"Megatron's fused softmax cannot run here ({batches} attention batches per rank, "
        "not a multiple of 4, or a sequence or precision it does not take): its fp32 "
        "fallback is priced; a micro-batch or tensor-parallel degree that makes "
        "b x heads / t a multiple of 4, or flash attention, avoids it"
    )


def _notes(ctx: PlanContext, priced: Priced) -> list[str]:
    est = priced.estimate
    config = est.config
    costs = est.costs
    notes = [f"layer times: {costs.layer.source}"]
    fallback = _softmax_fallback_note(ctx, config)
    if fallback:
        notes.append(fallback)
    family = schedule_family(config.schedule)
    if family.semantics != "synchronous":
        notes.append(
            f"{family.title} updates weights with gradients of older weights "
            f"({family.citation}): it changes the training, not only its speed; allowed "
            f"by search.allow_stale_weights"
        )
    if schedule_family(config.schedule).transfers:
        notes.append(_transfer_note(costs.transfer_s, costs.forward[0], costs.backward[0]))
    if priced.data_parallel_s > 0:
        notes.append(f"data-parallel gradient sync {priced.data_parallel_s * 1e3:.1f} ms per step")
    if priced.simulated_microbatches < config.num_microbatches:
        notes.append(
            f"simulated {priced.simulated_microbatches} of {config.num_microbatches} "
            f"micro-batches exactly; the steady state is extended linearly"
        )
    return notes
