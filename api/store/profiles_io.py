"""One-call writes to the store for command-line tools (``stagewright profile
--database-url``): no server needed; the database is migrated and the bundled profiles
loaded first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from api.core.config import Settings
from api.core.db import Database, describe_url
from api.store.profiles import (
    SqlProfileStore,
    WriteReport,
    require_hardware,
    upsert_layer_point,
)
from planner.profiles import LayerPoint

__all__ = ["store_layer_point", "stored_profiles"]


@contextmanager
def stored_profiles(database_url: str | None) -> Iterator[SqlProfileStore]:
    """The profiles of a store (migrated and the bundled profiles loaded first), for
    planning on the command line with what the service would use."""
    from api.service import prepare_database

    settings = Settings.from_env(database_url=database_url)
    prepare_database(settings)
    database = Database(settings.database_url)
    try:
        yield SqlProfileStore(database.sessions)
    finally:
        database.dispose()


def store_layer_point(database_url: str | None, point: LayerPoint) -> str:
    """Store (or replace, by shape) one measured layer point; returns where it went.

    The point's ``gpu`` must name a hardware profile in that database (UnknownHardwareError
    lists the known ones). The hardware's revision goes up, so plans made before the
    measurement are not reused."""
    from api.service import prepare_database  # migrates and loads the bundled profiles

    settings = Settings.from_env(database_url=database_url)
    prepare_database(settings)
    database = Database(settings.database_url)
    try:
        with database.session() as session:
            require_hardware(session=session, name=point.gpu)
            report = WriteReport()
            outcome = upsert_layer_point(session=session, point=point, origin="api", report=report)
            session.commit()
        revision = report.revisions.get(point.gpu)
        return (
            f"{describe_url(database.url)} (layer_profiles, {outcome}; {point.gpu} "
            f"revision {revision})"
        )
    finally:
        database.dispose()
