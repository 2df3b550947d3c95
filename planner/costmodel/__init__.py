"""The cost model: FLOPs, time and memory of a candidate configuration."""

from __future__ import annotations

from planner.costmodel.evaluate import (
    ALLOWANCE_FRACTION,
    WORKSPACE_GIB,
    DeviceMemory,
    Estimate,
    PlanContext,
    Priced,
    StageCosts,
    estimate,
    price,
    split_layers,
    stage_costs,
)

__all__ = [
    "ALLOWANCE_FRACTION",
    "WORKSPACE_GIB",
    "DeviceMemory",
    "Estimate",
    "PlanContext",
    "Priced",
    "StageCosts",
    "estimate",
    "price",
    "split_layers",
    "stage_costs",
]
