"""The simulated timeline of a candidate, for the dashboard's Gantt chart: bounded.

A candidate's schedule has p x m actions (more with chunks), and m can be thousands: a
timeline is drawn action by action only while building and simulating the whole schedule
stays under ``max_work`` (``planner.schedules.generation_work``). Beyond that it is a
per-device summary priced like the plan itself (the simulated warm-up and steady state,
extended linearly): forward, backward and weight time per device, busy and idle time.
"""

from __future__ import annotations

from typing import Any

from planner.costmodel.evaluate import PlanContext, price, stage_costs, stages_by_device
from planner.profiles import ProfileStore, default_store
from planner.schedules import generate, generation_work, schedule_actions
from planner.simulate import Durations, simulate
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["candidate_timeline"]


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
    Both carry ``makespan``, ``bubble_fraction`` and ``num_actions`` (the schedule's size)."""
    ctx = PlanContext.from_store(request, store or default_store())
    name, p, m = config.schedule, config.p, config.num_microbatches
    num_actions = schedule_actions(name, p, m)
    if generation_work(name, p, m) > max_work:
        return _summary(ctx, config, num_actions)
    costs = stage_costs(ctx, config)
    schedule = generate(name, p, m, check=False)
    result = simulate(
        schedule,
        Durations(
            costs.forward, costs.backward, costs.weight, comm=costs.p2p_s, transfer=costs.transfer_s
        ),
        activation=costs.activation_bytes,
    )
    devices: list[dict[str, Any]] = [{"device": d, "actions": []} for d in range(p)]
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
        "num_actions": sum(len(d["actions"]) for d in devices),
        "devices": devices,
    }


def _summary(ctx: PlanContext, config: CandidateConfig, num_actions: int) -> dict[str, Any]:
    priced = price(ctx, config)
    costs = priced.estimate.costs
    m = config.num_microbatches
    devices = []
    for device, stages in enumerate(stages_by_device(config.schedule, config.p)):
        forward = m * sum(costs.forward[s] for s in stages)
        backward = m * sum(costs.backward[s] for s in stages)
        weight = m * sum(costs.weight[s] for s in stages)
        busy = forward + backward + weight
        devices.append(
            {
                "device": device,
                "stages": list(stages),
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
        "num_actions": num_actions,
        "devices": devices,
    }
