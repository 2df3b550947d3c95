"""The database: URL checks, the engine, sessions and migrations.

SQLite (a file, the embedded default) and PostgreSQL (psycopg 3) are supported. SQLite runs in
WAL mode with a busy timeout so that several server processes and worker threads can share one
file; PostgreSQL connections are pinged before use, so a server that went away and came back
is reconnected to without a restart. Errors that mean "the database cannot be reached" are
told apart from the rest by :func:`is_unavailable` (the service answers 503 for them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from api.core.config import SettingsError

__all__ = [
    "MIGRATIONS",
    "Database",
    "alembic_config",
    "describe_url",
    "is_unavailable",
    "migrate",
    "normalize_url",
    "wait_for_database",
]

log = logging.getLogger("stagewright.db")

# The Alembic scripts live beside the packages in the source tree (like `profiles/`).
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
_SUPPORTED = ("sqlite", "postgresql")
# Any constant works: it only has to be the same in every process that migrates.
_MIGRATION_LOCK_KEY = 0x5747_5249


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL; ``postgresql://`` and ``postgres://`` mean psycopg 3.

    Raises SettingsError with an example of a good URL when it is not one."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SettingsError(
            f"{url!r} is not a database URL; use sqlite:///stagewright.db or "
            "postgresql+psycopg://user:password@host:5432/dbname"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgres":
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "postgresql" and parsed.get_driver_name() != "psycopg":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in _SUPPORTED:
        raise SettingsError(
            f"database {parsed.get_backend_name()!r} is not supported; use SQLite "
            "(sqlite:///stagewright.db) or PostgreSQL (postgresql+psycopg://...)"
        )
    return parsed


def describe_url(url: str | URL) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a database URL>"


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the database cannot be reached or is not ready (a 503, retry
    later), as opposed to a statement it rejected."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers and one writer work at once; busy_timeout makes a writer wait for
        # another process's write instead of failing with "database is locked".
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=15000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _make_engine(url: URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 15},
            pool_pre_ping=True,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=10,
        pool_timeout=10,
        connect_args={"connect_timeout": 5},
    )


class Database:
    """One engine and its session factory. Thread-safe; one per process."""

    def __init__(self, url: str | URL) -> None:
        self.url = normalize_url(url)
        self.engine = _make_engine(self.url)
        self.sessions: sessionmaker[Session] = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.url.get_backend_name()

    def __repr__(self) -> str:
        return f"Database({describe_url(self.url)})"

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that is rolled back (if still open) and closed on exit."""
        with self.sessions() as session:
            yield session

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        with self.engine.connect() as conn:
            conn.execute(select(1))

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config() -> Any:
    """Alembic's configuration for ``migrations/`` (no ini file, no logging set-up)."""
    from alembic.config import Config

    config = Config()
    # ConfigParser interpolates '%': escape it in the path.
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    return config


def migrate(database: Database, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``. On PostgreSQL an advisory lock makes concurrent
    starts (several replicas) migrate one after the other instead of colliding."""
    from alembic import command

    config = alembic_config()
    with database.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def wait_for_database(database: Database, timeout_s: float) -> None:
    """Ping until the database answers or ``timeout_s`` passes (a container that starts
    before its database). Raises SettingsError saying what to check."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            database.ping()
            return
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            if time.monotonic() >= deadline:
                raise SettingsError(
                    f"cannot reach the database at {describe_url(database.url)} "
                    f"({_reason(exc)}); check that it is running and that the URL "
                    "(--database-url or STAGEWRIGHT_DATABASE_URL) is right"
                ) from None
            if attempt == 1:
                log.warning("waiting for the database at %s", describe_url(database.url))
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _reason(exc: BaseException) -> str:
    """The driver's first message line, without SQLAlchemy's background link."""
    original = getattr(exc, "orig", None) or exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__
