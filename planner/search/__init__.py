"""Search: the grid's enumeration and pruning of a request's space (:mod:`.grid`), the CP-SAT
refinement of its most promising candidates (:mod:`.refinement`, :mod:`.cpsat`,
:mod:`.placement_cpsat`), and the up-front cost of a search (:mod:`.cost`). A request
becomes a plan through :func:`planner.plan.plan`, the one entry point.
"""

from __future__ import annotations

from planner.search.grid import DEFAULT_MICRO_BATCH_SIZES

__all__ = ["DEFAULT_MICRO_BATCH_SIZES"]
