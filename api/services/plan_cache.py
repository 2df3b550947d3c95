"""Done plans' JSON, kept per process: a plan whose search is done never changes again
(only deleting it does), so reading it again needs neither its result from the database
nor encoding it anew.

A cached answer is still checked against the database before it is served: one
primary-key lookup (:func:`plan_exists`, a single round trip on PostgreSQL) tells whether
the plan was deleted meanwhile, perhaps by another server process. The cache holds at most
``capacity`` bytes of JSON (``plan_cache_mb``), least recently used first out
(:class:`api.services.cache.PerPlanCache`, made in :mod:`api.state`).
"""

from __future__ import annotations

from sqlalchemy import select

from api.core.db import Database
from api.store.models import PlanRecord

__all__ = ["plan_exists"]


def plan_exists(database: Database, plan_id: str) -> bool:
    """Whether the plan is still stored. On PostgreSQL the lookup runs outside a
    transaction (autocommit): one round trip instead of BEGIN, SELECT and ROLLBACK."""
    statement = select(PlanRecord.id).where(PlanRecord.id == plan_id)
    if database.dialect == "postgresql":
        with database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(statement).first() is not None
    with database.session() as session:
        return session.execute(statement).first() is not None
