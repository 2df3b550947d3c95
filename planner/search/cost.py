"""What a plan request will cost, known before any of it is done.

A service answers every request, so it must refuse one whose work or answer is beyond its
limits before starting it, whatever its fields say. :func:`search_cost` walks the search
space as :func:`planner.plan.plan` does (the (t, p, d, mb) points and the schedule
constraints are cheap: divisors and arithmetic), and bounds from above:

- ``work``: the fast estimate of every configuration, the schedules built for in-flight
  counts and for pricing (``planner.schedules.generation_work``), and the actions simulated
  when the most expensive configurations the search could price are priced; in units of
  about a microsecond of one core (one action simulated or built);
- ``plan_bytes``: the JSON of the answer (without the rejected list, which the service
  serves only on request) if the largest configurations were the ranked ones.

Sizes per item were measured on plans' JSON; a test checks the bounds against real plans.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

from planner.costmodel.evaluate import (
    chunk_parameters,
    inflight_microbatches,
    num_stages,
    rebuilt_for_memory,
    timing_microbatches,
)
from planner.schedules import NUM_BATCHES, generation_work, schedule_actions, schedule_family
from planner.search.grid import schedule_chunks, schedule_problem, search_points
from planner.specs import PlanRequest

__all__ = ["SearchCost", "search_cost"]

# Work of the fast estimate of one configuration (cost model, memory, in-flight counts).
_ESTIMATE_WORK = 150
# CP-SAT refinement re-prices up to six promising and six memory-rejected models.
_REFINED_MODELS = 12
# Bytes of one ranked candidate's JSON beyond the per-device, per-stage and per-node parts
# (config, prediction, notes, the executor config's model and training, Megatron arguments).
_CANDIDATE_BYTES = 2_500
_DEVICE_BYTES = 330  # a breakdown row and a memory figure
_STAGE_BYTES = 20  # layers_per_stage and the executor config's stage_layers entry
_NODE_BYTES = 200  # one torchrun line
_BLOCK_BYTES = 12  # an optimized placement's [dp, pp] block
_PLAN_BYTES = 4_000  # id, request, stats, status fields
_SCHEDULE_SUMMARY_BYTES = 700
_LANDSCAPE_BYTES = 110  # one point of the landscape (every configuration that fits)


@dataclass(frozen=True)
class SearchCost:
    """Upper bounds of one request's search: see the module docstring."""

    configurations: int  # every configuration considered (rejections included)
    priceable: int  # configurations that meet every constraint (before memory)
    work: int
    plan_bytes: int
    largest_pipeline: int  # the largest p of a priceable configuration


@dataclass(frozen=True)
class _Shape:
    schedule: str
    p: int
    m: int
    nodes: int
    blocks: int  # p x d
    chunks: int | None = None  # stages a device, for a family that takes num_chunks


@lru_cache(maxsize=4096)
def _pricing_work(schedule: str, p: int, m: int, chunks: int | None = None) -> int:
    """Building and simulating the timing schedules of one configuration of ``schedule`` on
    p devices with m micro-batches, as ``price`` does: the run priced and, past the
    warm-up, one p micro-batches shorter; for a family without a flush between batches
    (2BW), two and three batches; ``chunks`` stages a device where the family takes them.
    Memoized: a request's configurations share far fewer
    (schedule, p, m) (243 among 576 in the 1,024-GPU example), and so do requests."""
    simulated = timing_microbatches(schedule, p, m)
    runs: list[tuple[int, dict[str, float]]]
    given = chunk_parameters(chunks)
    family = schedule_family(schedule)
    if family.flush_per_batch:
        runs = [(simulated, given), (max(1, simulated - p), given)]
    else:
        runs = [(simulated, {NUM_BATCHES.name: 2}), (simulated, {NUM_BATCHES.name: 3})]
    if family.uses_pass_times and rebuilt_for_memory(m, simulated):
        # Its memory is counted from the search's choice built with all m (``price``).
        runs.append((m, {}))
    work = 0
    for microbatches, parameters in runs:
        work += generation_work(schedule, p, microbatches, **parameters)
        work += schedule_actions(schedule, p, microbatches, **parameters)
    return work


def _candidate_bytes(shape: _Shape, stages: int, cpsat: bool) -> int:
    size = _CANDIDATE_BYTES + shape.p * _DEVICE_BYTES + stages * _STAGE_BYTES
    size += shape.nodes * _NODE_BYTES
    if cpsat:
        size += shape.blocks * _BLOCK_BYTES
    return size


def search_cost(request: PlanRequest) -> SearchCost:
    """Bounds of the work and answer size of planning ``request``; O(points x schedules),
    no schedule is built beyond one small instance per schedule name."""
    search = request.search
    layers = request.model.num_layers
    per_node = request.cluster.gpus_per_node
    recompute = len(search.recompute)
    cpsat = search.method == "cpsat"
    configurations = priceable = largest = 0
    shapes: list[tuple[_Shape, int]] = []  # priceable shapes with their stage count
    searched = [
        (schedule, chunks)
        for schedule in search.schedules
        for chunks in schedule_chunks(request, schedule)
    ]
    for point, m in search_points(request):
        for schedule, chunks in searched:
            configurations += recompute
            if schedule_problem(schedule, point, m, layers, chunks) is not None:
                continue
            priceable += recompute
            world = point.t * point.cp * point.p * point.d
            nodes = max(1, world // per_node)
            shape = _Shape(schedule, point.p, m, nodes, point.p * point.d, chunks)
            shapes.append((shape, num_stages(schedule, point.p, chunks)))
            largest = max(largest, point.p)
    inflight = {
        (s.schedule, s.p, inflight_microbatches(s.schedule, s.p, s.m), s.chunks) for s, _ in shapes
    }
    work = configurations * _ESTIMATE_WORK
    work += sum(
        generation_work(name, p, m, **chunk_parameters(chunks)) for name, p, m, chunks in inflight
    )
    priced = min(priceable, 2 * search.top_k + len(searched))
    if cpsat:
        priced += _REFINED_MODELS
    # Each shape stands for `recompute` configurations; the dearest ones bound the priced.
    pricing = heapq.nlargest(
        priced,
        (w for s, _ in shapes for w in [_pricing_work(s.schedule, s.p, s.m, s.chunks)] * recompute),
    )
    work += sum(pricing)
    ranked = min(priceable, search.top_k)
    sizes = heapq.nlargest(
        ranked,
        (b for s, stages in shapes for b in [_candidate_bytes(s, stages, cpsat)] * recompute),
    )
    plan_bytes = _PLAN_BYTES + sum(sizes) + max(sizes, default=0)  # `best` repeats one
    plan_bytes += len(search.schedules) * _SCHEDULE_SUMMARY_BYTES + priceable * _LANDSCAPE_BYTES
    return SearchCost(
        configurations=configurations,
        priceable=priceable,
        work=int(math.ceil(work)),
        plan_bytes=plan_bytes,
        largest_pipeline=largest,
    )
