"""The cost model: FLOPs, time and memory of a candidate configuration."""

from __future__ import annotations

from planner.costmodel.evaluate import (
    DeviceMemories,
    DeviceMemory,
    Estimate,
    PlanContext,
    Priced,
    StageCosts,
    estimate,
    memory_allowance,
    price,
    split_layers,
    stage_costs,
)

__all__ = [
    "DeviceMemories",
    "DeviceMemory",
    "Estimate",
    "PlanContext",
    "Priced",
    "StageCosts",
    "estimate",
    "memory_allowance",
    "price",
    "split_layers",
    "stage_costs",
]
