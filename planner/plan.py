"""A plan request to a ranked, launchable plan: the one path every caller (CLI, REST service,
regression check, benchmarks) takes.

The request travels one way, each step a function of frozen inputs returning new values:

1. enumerate (:func:`planner.search.grid.enumerate_space`): every candidate of the space,
   refused with a reason, over memory, or feasible, each estimated once (exact memory,
   approximate time) and the feasible ones sorted by that estimate;
2. refine (``method`` cpsat only, :func:`planner.search.refinement.refine_plan`): optimized
   placements for the most promising (t, p, d, schedule) and CP-SAT splits of their layers
   and recompute modes; the plan is priced from then on under a context holding those
   placements;
3. price: the best ``2 x top_k`` feasible candidates are simulated, together with every
   schedule's exactly simulated best (found by simulating its candidates in order of a lower
   bound until the bound cannot beat the best found); each candidate is simulated at most
   once, from its estimate;
4. rank the simulated and refined candidates by simulated step time and assemble the best
   ``top_k`` (:mod:`planner.assemble`): prediction, breakdown, notes, launch artefacts; the
   first says which others its profile's calibration error cannot tell from it
   (:mod:`planner.search.ties`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from planner._gc import collector_paused
from planner.assemble import candidate, landscape, schedule_summaries
from planner.costmodel.evaluate import Estimate, PlanContext, Priced, estimate, placement_for, price
from planner.costmodel.memory import GIB
from planner.errors import InvalidScheduleError
from planner.profiles import ProfileStore, default_store
from planner.schedules import schedule_family
from planner.search.gains import limit_note
from planner.search.grid import enumerate_space, runtime_problem, unsearched
from planner.search.source_order import source_order_note
from planner.search.ties import near_tie_note
from planner.specs import Plan, PlanRequest, PlanStats, RefinementInfo

__all__ = ["plan"]


def plan(request: PlanRequest, store: ProfileStore | None = None) -> Plan:
    """Search the request's space and return the ranked, launchable plan, priced with the
    hardware and layer profiles of ``store`` (the bundled ones by default)."""
    with collector_paused():
        try:
            return _plan(request, store)
        except InvalidScheduleError as error:
            # A plan builds every schedule it prices from the registry's generators: one that
            # breaks a rule of the IR is a bug here, not something the request can change
            # (the service must answer it as a bug, not refuse the request with it).
            raise RuntimeError(
                f"stagewright generated an invalid schedule for this request ({error}); "
                "this is a bug in stagewright, please report the request"
            ) from error


def _plan(request: PlanRequest, store: ProfileStore | None) -> Plan:
    started = time.perf_counter()
    ctx = PlanContext.from_store(request, store or default_store())
    ctx.hardware.peak(request.training.precision)  # fails early for bf16 on a V100
    capacity = ctx.hardware.usable_memory_gib * GIB
    space = enumerate_space(ctx, capacity)
    feasible = space.feasible
    refined: list[tuple[Priced, RefinementInfo]] = []
    refine_notes: list[str] = []
    restated: Mapping[int, Estimate] = {}
    if request.search.method == "cpsat":
        # Imported here: OR-Tools (and the pandas it loads) take about 0.2 s to import,
        # which every grid search, the CLI's included, would otherwise pay.
        from planner.search.refinement import refine_plan

        refinement = refine_plan(ctx, feasible, space.over_memory, capacity)
        ctx = ctx.with_placements(refinement.placements)
        refined = [(r.priced, r.info) for r in refinement.refined]
        refine_notes = refinement.notes
        restated = refinement.estimates
    pricing = _Pricing(ctx, feasible, restated)
    for index in range(min(len(feasible), 2 * request.search.top_k)):
        pricing(index)
    best_of = _best_of_each_schedule(feasible, pricing)
    # Every candidate simulated so far, in the order it was (the rank's last tie-break).
    pool: list[tuple[Priced, RefinementInfo | None]] = [(pr, None) for pr in pricing.done()]
    wanted = request.search.runtime
    pool += [
        (pr, info)
        for pr, info in refined
        if runtime_problem(request, pr.estimate.config, wanted, pr.estimate.costs.placement) is None
    ]
    pool.sort(key=lambda item: _rank_key(item[0]))
    ranked = pool[: request.search.top_k]
    candidates = [
        candidate(ctx, pr, info, limit_note(pr, feasible, pricing)) for pr, info in ranked
    ]
    tie_note = near_tie_note(candidates)
    first_notes = refine_notes + ([tie_note] if tie_note else [])
    if candidates and first_notes:
        candidates[0] = candidates[0].model_copy(
            update={"notes": candidates[0].notes + first_notes}
        )
    order_note = source_order_note(ctx, [pr for pr, _ in ranked])
    by_schedule = schedule_summaries(request, feasible, best_of, [pr for pr, _ in refined])
    elapsed = (time.perf_counter() - started) * 1e3
    return Plan(
        id=uuid.uuid4().hex,
        request=request,
        best=candidates[0] if candidates else None,
        candidates=candidates,
        rejected=space.rejected,
        stats=PlanStats(evaluated=space.evaluated, feasible=len(feasible), search_ms=elapsed),
        by_schedule=by_schedule,
        landscape=landscape(request, feasible),
        notes=unsearched(request) + ([order_note] if order_note else []),
    )


def _rank_key(pr: Priced) -> tuple[float, bool, float]:
    """Faster first; at the same step time (to the nanosecond: configurations that differ
    only in what does not run, such as a schedule on a one-stage pipeline, tie up to
    rounding), synchronous training before stale weights, then the lower peak memory."""
    stale = schedule_family(pr.estimate.config.schedule).semantics != "synchronous"
    return round(pr.iteration_time_s, 9), stale, pr.estimate.peak_memory


class _Pricing:
    """The simulated price of the feasible candidates of one plan, by index in ``feasible``:
    each simulated at most once, from its estimate under ``ctx``'s placements. A candidate
    whose placement the refinement changed is estimated again, once (``restated`` holds the
    ones the refinement already estimated under their new placement)."""

    def __init__(
        self, ctx: PlanContext, feasible: list[Estimate], restated: Mapping[int, Estimate]
    ) -> None:
        self._ctx = ctx
        self._feasible = feasible
        self._restated = dict(restated)
        self._priced: dict[int, Priced] = {}

    def __call__(self, index: int) -> Priced:
        found = self._priced.get(index)
        if found is None:
            found = self._priced[index] = price(self._ctx, self._estimate(index))
        return found

    def done(self) -> list[Priced]:
        """The candidates priced so far, in the order they were."""
        return list(self._priced.values())

    def _estimate(self, index: int) -> Estimate:
        est = self._feasible[index]
        ctx = self._ctx
        if not ctx.placements:  # a grid plan: every estimate is under the default placement
            return est
        found = self._restated.get(index)
        if found is None:
            found = est
            gpus_per_node = ctx.request.cluster.gpus_per_node
            if est.costs.placement != placement_for(est.config, gpus_per_node, ctx.placements):
                found = self._restated[index] = estimate(ctx, est.config)
        return found


def _best_of_each_schedule(feasible: list[Estimate], pricing: _Pricing) -> dict[str, Priced]:
    """The exactly simulated best configuration of every schedule among all that fit.

    Per schedule, candidates are simulated in order of their lower bound (the busiest
    device's compute, which no schedule beats) until the next bound is no better than the
    best simulated so far. ``pricing`` simulates each at most once, and the ranking sees
    every one simulated here, each schedule's best among them."""
    order: dict[str, list[tuple[float, int]]] = {}
    for index, est in enumerate(feasible):
        order.setdefault(est.config.schedule, []).append((est.lower_bound_s, index))
    best: dict[str, Priced] = {}
    for name, bounds in order.items():
        found = None
        for bound, index in sorted(bounds):
            if found is not None and bound >= found.iteration_time_s:
                break
            pr = pricing(index)
            if found is None or pr.iteration_time_s < found.iteration_time_s:
                found = pr
        if found is not None:
            best[name] = found
    return best
