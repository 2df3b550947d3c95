"""The simulated timeline of a candidate, for the dashboard's Gantt chart."""

from __future__ import annotations

from typing import Any

from planner.costmodel.evaluate import PlanContext, stage_costs
from planner.profiles import ProfileStore, default_store
from planner.schedules import generate
from planner.simulate import Durations, simulate
from planner.specs import CandidateConfig, PlanRequest

__all__ = ["candidate_timeline"]


def candidate_timeline(
    request: PlanRequest, config: CandidateConfig, store: ProfileStore | None = None
) -> dict[str, Any]:
    """Every compute action and BPipe transfer of the candidate's full schedule, timed with
    its own per-stage durations: ``devices[d].actions`` are [kind, stage, micro-batch,
    start s, end s]; bookkeeping markers (SEND/RECV, version switches, mirrors) are left
    out."""
    ctx = PlanContext.from_store(request, store or default_store())
    costs = stage_costs(ctx, config)
    schedule = generate(config.schedule, config.p, config.num_microbatches, check=False)
    result = simulate(
        schedule,
        Durations(
            costs.forward, costs.backward, costs.weight, comm=costs.p2p_s, transfer=costs.transfer_s
        ),
        activation=costs.activation_bytes,
    )
    devices: list[dict[str, Any]] = [{"device": d, "actions": []} for d in range(config.p)]
    for device, action, start, end in result.timeline():
        kind = action.kind
        if kind.is_compute or (kind.is_transfer and schedule.stage_devices[action.stage] == device):
            devices[device]["actions"].append(
                [kind.value, action.stage, action.microbatch, round(start, 6), round(end, 6)]
            )
    return {
        "schedule": config.schedule,
        "makespan": result.makespan,
        "bubble_fraction": result.bubble_fraction,
        "devices": devices,
    }
