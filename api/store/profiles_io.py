"""One-call writes to the store for command-line tools (``stagewright profile
--database-url``, ``stagewright run --record``): no server needed; the database is migrated
and the bundled profiles loaded first."""

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
from planner.measurement_files import ParsedRun
from planner.measurements import MeasuredRun
from planner.profiles import LayerPoint

__all__ = ["store_layer_point", "store_measured_run", "stored_profiles"]


def store_measured_run(database_url: str | None, run: MeasuredRun) -> str:
    """Store a run the executor measured (kept once if identical, and restored if that one
    was withdrawn); where it went. A run the store cannot take (its hardware has no
    profile, say) raises, naming the field."""
    from api.service import prepare_database
    from api.store.measured_runs import add_runs

    settings = Settings.from_env(database_url=database_url)
    prepare_database(settings)
    database = Database(settings.database_url)
    try:
        with database.session() as session:
            report = add_runs(
                session=session,
                runs=[ParsedRun("the measured run", run)],
                origin="executor",
                name="the measured run",
            )
            session.commit()
        state = (
            "stored"
            if report.created
            else "restored: it was withdrawn"
            if report.restored
            else "already stored"
        )
        return f"{describe_url(database.url)} (measured run {report.ids[0]}, {state})"
    finally:
        database.dispose()


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
