"""Done plans' JSON, kept per process: a plan whose search is done never changes again
(only deleting it does), so reading it again needs neither its result from the database
nor encoding it anew.

A cached answer is still checked against the database before it is served: one
primary-key lookup (:func:`plan_exists`, a single round trip on PostgreSQL) tells whether
the plan was deleted meanwhile, perhaps by another server process. The cache holds at most
``capacity`` bytes of JSON (``plan_cache_mb``), least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sqlalchemy import select

from api.core.db import Database
from api.store.models import PlanRecord

__all__ = ["PlanCache", "plan_exists"]


class PlanCache:
    """Encoded plan documents by (plan id, include_rejected); thread-safe, bounded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, bool], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, plan_id: str, include_rejected: bool) -> bytes | None:
        key = (plan_id, include_rejected)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, plan_id: str, include_rejected: bool, body: bytes) -> None:
        if len(body) > self.capacity:
            return
        key = (plan_id, include_rejected)
        with self._lock:
            if key in self._items:
                return
            self._items[key] = body
            self._size += len(body)
            while self._size > self.capacity:
                _, dropped = self._items.popitem(last=False)
                self._size -= len(dropped)

    def forget(self, plan_id: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == plan_id]:
                self._size -= len(self._items.pop(key))

    def __len__(self) -> int:
        return len(self._items)


def plan_exists(database: Database, plan_id: str) -> bool:
    """Whether the plan is still stored. On PostgreSQL the lookup runs outside a
    transaction (autocommit): one round trip instead of BEGIN, SELECT and ROLLBACK."""
    statement = select(PlanRecord.id).where(PlanRecord.id == plan_id)
    if database.dialect == "postgresql":
        with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(statement).first() is not None
    with database.session() as session:
        return session.execute(statement).first() is not None
