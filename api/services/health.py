"""Readiness: does the database answer, and how many jobs wait and run.

``/healthz`` and ``/metrics`` must answer quickly whatever the database does, and must not
queue behind requests waiting for it. The probe runs on a thread of its own, one probe at
a time (concurrent callers share it), and callers wait at most ``timeout_s``: a database
that is down or stopped answering reads as "not ready" within that bound.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from api.core.db import Database, is_unavailable
from api.store import crud

__all__ = ["HealthProbe"]

log = logging.getLogger("stagewright.health")


class HealthProbe:
    """Job counts by status from the database, or None when it does not answer in time."""

    def __init__(self, database: Database, timeout_s: float) -> None:
        self._database = database
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stagewright-health")
        self._lock = threading.Lock()
        self._pending: Future[dict[str, int]] | None = None

    async def job_counts(self) -> dict[str, int] | None:
        with self._lock:
            if self._pending is None or self._pending.done():
                self._pending = self._executor.submit(self._query)
            pending = self._pending
        try:
            return await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(pending)), self.timeout_s
            )
        except TimeoutError:
            return None
        except Exception as exc:
            if not is_unavailable(exc):
                log.warning("health probe failed: %s", exc)
            return None

    def _query(self) -> dict[str, int]:
        with self._database.session() as session:
            return crud.count_jobs(session=session)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
