"""What one application instance owns, and how routes hand blocking work to threads.

Routes are ``async def`` and do no blocking work themselves: every use case in
``api/services/`` that touches the database or computes runs through :func:`offload`, on a
bounded pool of threads, and is given up on (503) after ``request_timeout_s``. So the event
loop stays free for ``/healthz`` and every other request, whatever the database does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread

from api.core.config import Settings
from api.core.db import Database
from api.jobs.runner import JobRunner
from api.metrics import Metrics
from api.problems import server_busy
from api.services.cache import PerPlanCache
from api.services.health import HealthProbe
from api.services.plan_deletions import DeletionFeed, plan_exists
from api.services.timelines import timeline_weight

__all__ = ["AppState", "offload"]

_TIMELINE_ACTIONS = 1_000_000  # actions kept over every cached timeline of one process

P = ParamSpec("P")
T = TypeVar("T")
D = TypeVar("D")
V = TypeVar("V")


@dataclass
class AppState:
    """One application's settings, database, metrics, job runner, caches (timelines, done
    plans' JSON), the feed of plan deletions that keeps the caches true, and threads."""

    settings: Settings
    database: Database
    metrics: Metrics
    runner: JobRunner
    health: HealthProbe
    timelines: PerPlanCache[int, dict[str, Any]] = field(init=False)
    plans: PerPlanCache[bool, bytes] = field(init=False)
    deletions: DeletionFeed = field(init=False)
    threads: anyio.CapacityLimiter = field(init=False)

    def __post_init__(self) -> None:
        self.threads = anyio.CapacityLimiter(self.settings.request_threads)
        # Timelines by candidate, at most a million actions in all; done plans' JSON by
        # whether it lists the rejected configurations, at most plan_cache_mb.
        self.timelines = PerPlanCache(_TIMELINE_ACTIONS, timeline_weight)
        self.plans = PerPlanCache(self.settings.plan_cache_mb * 1024 * 1024, len)
        self.deletions = DeletionFeed(self.database, self.forget_plan)

    def cached(self, cache: PerPlanCache[D, V], plan_id: str, detail: D) -> V | None:
        """What ``cache`` holds for the plan, if the plan is still stored: known while the
        deletion feed is live, else asked of the database (a gone plan is forgotten)."""
        heard = self.deletions.live  # before the lookup: the entry is no older than this
        value = cache.get(plan_id, detail)
        if value is not None and not heard and not plan_exists(self.database, plan_id):
            self.forget_plan(plan_id)
            return None
        return value

    def forget_plan(self, plan_id: str | None) -> None:
        """Drop what the caches hold of a deleted plan (of every plan: None)."""
        for cache in (self.timelines, self.plans):
            if plan_id is None:
                cache.clear()
            else:
                cache.forget(plan_id)


async def offload(state: AppState, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` on one of the state's threads; 503 if it has not answered within
    ``request_timeout_s`` (the thread is abandoned: the database watchdog frees it)."""
    limit = state.settings.request_timeout_s
    try:
        with anyio.fail_after(limit):
            return await anyio.to_thread.run_sync(
                functools.partial(fn, *args, **kwargs),
                limiter=state.threads,
                abandon_on_cancel=True,
            )
    except TimeoutError:
        raise server_busy(limit) from None
