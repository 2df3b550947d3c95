"""Search: the grid's enumeration and pruning of a request's space (:mod:`.grid`), the CP-SAT
refinement of its most promising candidates (:mod:`.refinement`, :mod:`.cpsat`,
:mod:`.placement_cpsat`), and the up-front cost of a search (:mod:`.cost`). A request
becomes a plan through :func:`planner.plan.plan`.
"""

from __future__ import annotations

from typing import Any

from planner.search.grid import DEFAULT_MICRO_BATCH_SIZES

__all__ = ["DEFAULT_MICRO_BATCH_SIZES", "plan"]


def __getattr__(name: str) -> Any:
    # ``planner.search.plan`` was the entry point before planner.plan: kept for code outside
    # this repository. Resolved lazily, as planner.plan imports this package.
    if name == "plan":
        from planner.plan import plan

        return plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
