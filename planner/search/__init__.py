"""Search: from a PlanRequest to a ranked, launchable Plan."""

from __future__ import annotations

from planner.search.grid import DEFAULT_MICRO_BATCH_SIZES, plan

__all__ = ["DEFAULT_MICRO_BATCH_SIZES", "plan"]
