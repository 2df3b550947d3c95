"""The ``cpsat`` method: refine the most promising coarse candidates of the grid.

Which coarse candidates: the (t, p, d, micro-batch size, schedule) of the best feasible grid
candidates, and of the fastest ones the grid rejected for memory by at most 50% (a
non-uniform split or a per-stage recompute mix may make them fit). Each gets an optimized
placement and a CP-SAT refinement within the request's time budget (2 s per model at
most); the refined configuration is priced with the simulator like any other, and kept only
when it fits and is faster than its uniform version, so the cpsat answer is never worse than
the grid's. A placement is offered only if the request's search.runtime (with ``any``: some
runtime) can number its ranks that way (:mod:`planner.launch.rank_order`): CP-SAT's, else
Megatron-LM's other order (pipeline before data), else none (the default stays).

The refinement changes nothing it is given: it returns the placements it chose (with the
estimates of the coarse candidates under them, so that none is estimated twice), and the
caller prices the rest of the plan under a context holding them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.costmodel.evaluate import (
    Estimate,
    PlanContext,
    Priced,
    estimate,
    placement_for,
    price,
    stage_costs,
)
from planner.costmodel.memory import GIB, bytes_per_parameter
from planner.costmodel.shapes import chunk_parameters
from planner.costmodel.stages import PlacementKey, placement_key
from planner.costmodel.timing import p2p_bytes
from planner.launch.rank_order import order_coords
from planner.launch.runtimes import RUNTIME_TITLES
from planner.placement import Placement
from planner.schedules import ActionKind, generate, schedule_family
from planner.search.cpsat import RefineOptions, check, refine
from planner.search.grid import runtime_problem
from planner.search.placement_cpsat import PlacementWeights, optimize_placement
from planner.specs import CandidateConfig, PlanRequest, Recompute, RefinementInfo, SolverStatus

__all__ = [
    "MAX_OVER_MEMORY",
    "Kept",
    "PlanRefinement",
    "Refined",
    "keep_if_faster",
    "launchable",
    "refine_plan",
]

MAX_OVER_MEMORY = 1.5  # refine memory-rejected candidates up to 50% over the device
PER_MODEL_S = 2.0
_KEYS_FEASIBLE = 6
_KEYS_OVER_MEMORY = 6
_ORDER: dict[Recompute, int] = {"none": 0, "selective": 1, "full": 2}


@dataclass(frozen=True)
class Refined:
    priced: Priced
    info: RefinementInfo


@dataclass(frozen=True)
class PlanRefinement:
    """What the refinement of one plan found."""

    placements: dict[PlacementKey, Placement]  # every (t, p, d, schedule) it decided
    refined: list[Refined]  # refinements faster than their uniform version
    notes: list[str]  # the ones that did not improve, and why
    estimates: dict[int, Estimate]  # by index in feasible: coarse ones under a new placement


def _key(config: CandidateConfig) -> tuple[int, int, int, int, str, int | None]:
    return (
        config.t,
        config.p,
        config.d,
        config.micro_batch_size,
        config.schedule,
        config.num_chunks,
    )


def _pick(
    feasible: list[Estimate], over_memory: list[Estimate], capacity: float
) -> list[tuple[int | None, Estimate]]:
    """The coarse candidates to refine, each with its index in ``feasible`` (None for the
    ones over memory)."""
    chosen: dict[tuple[int, int, int, int, str, int | None], tuple[int | None, Estimate]] = {}
    for index, est in enumerate(feasible):  # sorted by estimated time
        if len(chosen) >= _KEYS_FEASIBLE:
            break
        chosen.setdefault(_key(est.config), (index, est))
    extra = 0
    for est in sorted(over_memory, key=lambda e: e.iteration_time_s):
        if extra >= _KEYS_OVER_MEMORY:
            break
        if est.peak_memory > MAX_OVER_MEMORY * capacity or not est.activations_counted:
            continue
        if _key(est.config) not in chosen:
            chosen[_key(est.config)] = (None, est)
            extra += 1
    return list(chosen.values())


def _placement_weights(ctx: PlanContext, config: CandidateConfig) -> PlacementWeights:
    r = ctx.request
    costs = stage_costs(ctx, config)
    m = config.num_microbatches
    hop = 2 * m * p2p_bytes(r.model, r.training, config.micro_batch_size, config.t, config.cp)
    pair = 0.0
    if schedule_family(config.schedule).transfers:
        # Evictions per micro-batch are steady once the schedule runs 2p micro-batches.
        simulated = min(m, 2 * config.p)
        chunks = chunk_parameters(config.num_chunks)
        shape = generate(config.schedule, config.p, simulated, check=False, **chunks)
        evictions = shape.count(ActionKind.EVICT) / max(1, len(shape.meta.get("pairs", [])))
        pair = 2 * evictions * (m / simulated) * max(costs.activation_bytes)
    weight_b, grad_b, _ = bytes_per_parameter(r.training, config.weight_replicas)
    ring = 2 * max(costs.parameters) * (weight_b + grad_b)
    return PlacementWeights(pipeline_hop=hop, bpipe_pair=pair, data_ring=ring)


@dataclass(frozen=True)
class Kept:
    placement: Placement  # the one the (t, p, d, schedule) uses from now on
    estimate: Estimate  # the candidate's estimate under it
    optimized: bool  # whether it is the optimized placement (else the default)


def keep_if_faster(ctx: PlanContext, est: Estimate, optimized: Placement) -> Kept:
    """The placement the (t, p, d, schedule) of ``est`` (an estimate under the default
    placement) should use: the optimized one if the cost model prices the step faster with
    it, else the default. The optimizer counts bytes across nodes; the step time sees links
    more coarsely (one slow hop slows the whole pipeline, a ring is fast only if it stays in
    a node), so fewer bytes can still price slower."""
    config = est.config
    key = placement_key(config)
    default = placement_for(config, ctx.request.cluster.gpus_per_node)
    assert est.costs.placement == default, "keep_if_faster compares with the default placement"
    trial = ctx.with_placements({key: optimized})
    moved = estimate(trial, config)
    if price(trial, moved).iteration_time_s < price(ctx, est).iteration_time_s:
        return Kept(optimized, moved, optimized=True)
    return Kept(default, est, optimized=False)


def launchable(
    request: PlanRequest, config: CandidateConfig, optimized: Placement
) -> tuple[Placement | None, bool]:
    """The placement to offer ``config`` instead of its default: ``optimized`` when the
    request's search.runtime (with ``any``: some runtime that runs ``config``) can number
    its ranks that way; else Megatron-LM's other order (pipeline before data), which
    torch.distributed.pipelining can take too, when that one can; else None. The second
    item says whether ``optimized`` was refused."""
    wanted = request.search.runtime
    if runtime_problem(request, config, wanted, optimized) is None:
        return optimized, False
    g, p, d = config.t * config.cp, config.p, config.d
    other = Placement(
        g, p, d, request.cluster.gpus_per_node, "optimized", order_coords("tp-pp-dp", g, p, d)
    )
    if runtime_problem(request, config, wanted, other) is not None:
        return None, True
    return other, True


def refine_plan(
    ctx: PlanContext, feasible: list[Estimate], over_memory: list[Estimate], capacity: float
) -> PlanRefinement:
    """Refine the promising coarse candidates of ``feasible`` (sorted by estimated time) and
    ``over_memory``, all estimated under ``ctx``, which holds no optimized placement. Returns
    the placements chosen, the refinements that improve on the grid, notes for the ones that
    did not (infeasible, slower, out of budget), and the coarse candidates' estimates under
    their new placement."""
    request = ctx.request
    budget = request.search.time_limit_s
    started = time.perf_counter()
    modes = tuple(sorted(request.search.recompute, key=_ORDER.__getitem__))
    placements: dict[PlacementKey, Placement] = {}
    estimates: dict[int, Estimate] = {}
    refined: list[Refined] = []
    notes: list[str] = []
    for index, est in _pick(feasible, over_memory, capacity):
        coarse = est.config
        remaining = budget - (time.perf_counter() - started)
        if remaining < 0.05:
            notes.append(
                f"cpsat: time budget of {budget:g} s spent; {_describe(coarse)} not refined"
            )
            continue
        key = placement_key(coarse)
        current = est  # the estimate under the placement its (t, p, d, schedule) uses
        if key not in placements and coarse.cp == 1:  # cp groups keep Megatron's order
            limit = min(1.0, remaining / 2)
            result = optimize_placement(
                coarse.t,
                coarse.p,
                coarse.d,
                request.cluster.gpus_per_node,
                _placement_weights(ctx, coarse),
                time_limit_s=limit,
            )
            optimized, refused = launchable(request, coarse, result.placement)
            if optimized is None:
                kept = Kept(est.costs.placement, est, optimized=False)
            else:
                kept = keep_if_faster(ctx, est, optimized)
            placements[key] = kept.placement
            current = kept.estimate
            if refused:
                notes.append(
                    f"cpsat: placement of {_describe(coarse)}: "
                    + _refused(request.search.runtime, kept.optimized)
                )
            if result.status in ("too large", "timed out"):
                why = (
                    "the CP-SAT model would be too large for this cluster"
                    if result.status == "too large"
                    else f"CP-SAT found no layout within {limit:.2g} s"
                )
                outcome_text = (
                    "the best structured layout (tiles of stages x replicas per node) is used"
                    if kept.optimized
                    else "the default layout is kept (no structured one prices faster)"
                )
                notes.append(f"cpsat: placement of {_describe(coarse)}: {why}; {outcome_text}")
        here = ctx.with_placements(placements)
        if current.costs.placement != placement_for(
            coarse, request.cluster.gpus_per_node, here.placements
        ):  # placed when an earlier coarse candidate of its (t, p, d, schedule) was
            current = estimate(here, coarse)
        if index is not None and current is not est:
            estimates[index] = current
        fits = est.peak_memory <= capacity
        uniform = price(here, current) if fits else None
        outcome = refine(
            here,
            coarse,
            modes,
            capacity,
            RefineOptions(time_limit_s=min(PER_MODEL_S, max(0.05, remaining))),
        )
        if outcome.config is None:
            notes.append(f"cpsat: {_describe(coarse)}: {outcome.status}")
            continue
        memory, _ = check(here, outcome)
        if max(memory) > capacity * (1 + 1e-6):  # pragma: no cover - the checker's guard
            notes.append(f"cpsat: {_describe(coarse)}: solution failed the memory check")
            continue
        priced = price(here, estimate(here, outcome.config))
        if uniform is not None and priced.iteration_time_s >= uniform.iteration_time_s:
            notes.append(
                f"cpsat: {_describe(coarse)}: no split beats the uniform one ({outcome.status})"
            )
            continue
        refined.append(
            Refined(priced, _info(outcome.status, outcome.wall_s, coarse, est, uniform, priced))
        )
    return PlanRefinement(placements, refined, notes, estimates)


def _refused(runtime: str, other_order: bool) -> str:
    """Why CP-SAT's layout was not used, and what was."""
    who = (
        "any runtime that runs the candidate"
        if runtime == "any"
        else f"{RUNTIME_TITLES[runtime]} (search.runtime {runtime})"  # type: ignore[index]
    )
    used = (
        "Megatron-LM's other order (pipeline before data) is used"
        if other_order
        else "the default layout is kept"
    )
    return f"CP-SAT's layout puts GPUs on nodes as no rank order of {who} does; {used}"


def _describe(config: CandidateConfig) -> str:
    return (
        f"t={config.t} p={config.p} d={config.d} mb={config.micro_batch_size} "
        f"{config.schedule_label}"
    )


def _info(
    status: SolverStatus,
    wall: float,
    coarse: CandidateConfig,
    est: Estimate,
    uniform: Priced | None,
    priced: Priced,
) -> RefinementInfo:
    config = priced.estimate.config
    changes = []
    if config.layers_per_stage != coarse.layers_per_stage:
        changes.append(f"layers per stage {coarse.layers_per_stage} -> {config.layers_per_stage}")
    split = config.recompute_per_stage or []
    mixed = [
        f"stage {s}: "
        + (", ".join(f"{n} {mode}" for mode, n in entry.as_dict().items()) or "no layers")
        for s, entry in enumerate(split)
        if entry.as_dict() != {coarse.recompute: coarse.layers_per_stage[s]}
    ]
    if mixed:
        changes.append(f"recompute (uniform: all {coarse.recompute}) -> " + "; ".join(mixed))
    new_peak = priced.estimate.peak_memory / GIB
    changes.append(f"peak memory {est.peak_memory / GIB:.1f} -> {new_peak:.1f} GiB")
    if uniform is None:
        changes.append(
            f"the uniform split does not fit; refined step {priced.iteration_time_s:.3f} s"
        )
        speedup = None
    else:
        speedup = uniform.iteration_time_s / priced.iteration_time_s
        changes.append(
            f"step {uniform.iteration_time_s:.3f} -> {priced.iteration_time_s:.3f} s "
            f"({speedup:.3f}x)"
        )
    return RefinementInfo(
        status=status,
        solve_s=wall,
        uniform_layers_per_stage=coarse.layers_per_stage,
        uniform_recompute=coarse.recompute,
        uniform_iteration_time_s=uniform.iteration_time_s if uniform else None,
        uniform_peak_memory_gib=est.peak_memory / GIB,
        speedup_vs_uniform=speedup,
        changes=changes,
    )
