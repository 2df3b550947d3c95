"""The simulated timeline of a candidate, for the dashboard's Gantt chart: bounded.

A candidate's schedule has p x m actions (more with chunks), and m can be thousands: a
timeline is drawn action by action only while building and simulating the whole schedule
stays under ``max_work`` (``planner.schedules.generation_work``). Beyond that it is a
per-device summary priced like the plan itself (the simulated warm-up and steady state,
extended linearly): forward, backward and weight time per device, busy and idle time.
"""

from __future__ import annotations

from typing import Any

from planner.costmodel.evaluate import (
    Estimate,
    PlanContext,
    Priced,
    chunk_parameters,
    estimate,
    price,
    stages_by_device,
)
from planner.costmodel.memory import GIB
from planner.profiles import ProfileStore, default_store
from planner.schedules import Schedule, generate, generation_work, schedule_actions, schedule_family
from planner.simulate import Durations, simulate
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["candidate_timeline", "memory_breakdown"]


def candidate_timeline(
    request: PlanRequest,
    config: CandidateConfig,
    store: ProfileStore | None = None,
    *,
    max_work: int = 200_000,
) -> dict[str, Any]:
    """The candidate's timeline with its own per-stage durations.

    ``mode`` 'actions': ``devices[d].actions`` are [kind, stage, micro-batch, start s, end s]
    for every compute action and BPipe transfer of the whole schedule (bookkeeping markers
    such as SEND/RECV, version switches and mirrors left out). ``mode`` 'summary' (the
    schedule is too large to build within ``max_work``): ``devices[d]`` has its stages and
    ``forward_s``, ``backward_s``, ``weight_s``, ``busy_s`` and ``idle_s`` over the step.
    Both carry ``makespan`` and ``bubble_fraction`` of what is drawn, ``step_time_s`` (the
    plan's step time: the simulated steady state extended to every micro-batch, plus
    data-parallel sync and the optimizer step), ``num_actions`` (the schedule's size),
    ``num_microbatches`` (every micro-batch drawn: 2BW runs ``num_batches`` batches without a
    flush, so twice the configuration's) and each device's ``stages`` in chunk order (a V
    schedule's two chunks) and ``memory`` (:func:`memory_breakdown`). In 'actions' mode each
    device also has ``memory_curve``: [time s, GiB] steps of its memory over the step, the
    static part (parameters, gradients, optimizer states, working buffers and allowance) plus
    the activations the simulator counts as saved at that time.

    A schedule its family searches for under the candidate's pass times (v-adaptive,
    zb-adaptive) is the one the plan priced and the executor runs: the choice of the plan's
    search, rebuilt for every micro-batch."""
    ctx = PlanContext.from_store(request, store or default_store())
    name, p, m = config.schedule, config.p, config.num_microbatches
    chunks = chunk_parameters(config.num_chunks)
    num_actions = schedule_actions(name, p, m, **chunks)
    # Priced as the plan prices it: the step time to show beside what is drawn, and for a
    # searched schedule its choice and the memory counted from it.
    priced = price(ctx, estimate(ctx, config))
    if generation_work(name, p, m, **chunks) > max_work:
        return _summary(priced, num_actions)
    est = priced.estimate
    costs = est.costs
    schedule = _whole_schedule(priced)
    result = simulate(
        schedule,
        Durations(
            costs.forward, costs.backward, costs.weight, comm=costs.p2p_s, transfer=costs.transfer_s
        ),
        activation=costs.activation_bytes,
    )
    breakdown = _breakdown(est)
    devices: list[dict[str, Any]] = [
        {
            "device": d,
            "stages": list(schedule.stages_of(d)),
            "memory": breakdown[d],
            "memory_curve": _curve(result.memory[d], breakdown[d]),
            "actions": [],
        }
        for d in range(p)
    ]
    for device, action, start, end in result.timeline():
        kind = action.kind
        if kind.is_compute or (kind.is_transfer and schedule.stage_devices[action.stage] == device):
            devices[device]["actions"].append(
                [kind.value, action.stage, action.microbatch, round(start, 6), round(end, 6)]
            )
    return {
        "mode": "actions",
        "schedule": name,
        "makespan": result.makespan,
        "bubble_fraction": result.bubble_fraction,
        "step_time_s": priced.iteration_time_s,
        "num_actions": sum(len(d["actions"]) for d in devices),
        "num_microbatches": schedule.total_microbatches,
        "num_batches": schedule.num_batches,
        "devices": devices,
    }


def _whole_schedule(priced: Priced) -> Schedule:
    """The priced candidate's schedule with all its micro-batches: a searched family's
    choice (made for the micro-batches the plan simulates) rebuilt without searching again,
    as the executor rebuilds it; any other family generated from (p, m)."""
    config = priced.estimate.config
    name, p, m = config.schedule, config.p, config.num_microbatches
    family = schedule_family(name)
    if family.rebuild is not None:
        return family.rebuild(priced.simulation.schedule.meta["choice"], p, m)
    return generate(name, p, m, check=False, **chunk_parameters(config.num_chunks))


def memory_breakdown(
    request: PlanRequest, config: CandidateConfig, store: ProfileStore | None = None
) -> list[dict[str, float]]:
    """Each pipeline device's memory as the plan counts it, in GiB: ``parameters``,
    ``gradients``, ``optimizer``, ``activations`` (saved at the peak, plus working buffers),
    ``allowance`` (workspace and fragmentation) and their ``total``, with ``in_flight``
    (peak saved micro-batches). Also for a configuration the search rejected as out of
    memory: activations are counted however far over the capacity it is."""
    ctx = PlanContext.from_store(request, store or default_store())
    return _breakdown(estimate(ctx, config))


def _breakdown(est: Estimate) -> list[dict[str, float]]:
    """Each device's memory in ``est``, in GiB."""
    return [
        {
            "parameters": m.parameters / GIB,
            "gradients": m.gradients / GIB,
            "optimizer": m.optimizer / GIB,
            "activations": m.activations / GIB,
            "allowance": m.allowance / GIB,
            "total": m.total / GIB,
            "in_flight": m.in_flight,
        }
        for m in est.memory
    ]


def _curve(steps: list[tuple[float, float]], memory: dict[str, float]) -> list[list[float]]:
    """The simulator's saved-activation steps (bytes) on top of the rest of the device's
    planned memory (its total less the simulated peak's saved activations: weights,
    gradients, optimizer states, working buffers, and the allowance as at the peak), so the
    curve's top is the plan's figure when the simulated peak is the plan's."""
    levels = [level for _, level in steps]
    peak = max(levels, default=0.0) / GIB
    base = memory["total"] - peak
    return [[0.0, round(base, 6)]] + [
        [round(t, 6), round(base + level / GIB, 6)] for t, level in steps
    ]


def _summary(priced: Priced, num_actions: int) -> dict[str, Any]:
    config = priced.estimate.config
    costs = priced.estimate.costs
    m = config.num_microbatches
    devices = []
    breakdown = _breakdown(priced.estimate)
    for device, stages in enumerate(stages_by_device(config.schedule, config.p, config.num_chunks)):
        forward = m * sum(costs.forward[s] for s in stages)
        backward = m * sum(costs.backward[s] for s in stages)
        weight = m * sum(costs.weight[s] for s in stages)
        busy = forward + backward + weight
        devices.append(
            {
                "device": device,
                "stages": list(stages),
                "memory": breakdown[device],
                "forward_s": forward,
                "backward_s": backward,
                "weight_s": weight,
                "busy_s": busy,
                "idle_s": max(0.0, priced.makespan_s - busy),
            }
        )
    return {
        "mode": "summary",
        "schedule": config.schedule,
        "makespan": priced.makespan_s,
        "bubble_fraction": priced.bubble_fraction,
        "step_time_s": priced.iteration_time_s,
        "num_actions": num_actions,
        "num_microbatches": m,
        "num_batches": 1,
        "devices": devices,
    }
