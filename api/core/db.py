"""The database: URL checks, the engine, sessions and migrations.

SQLite (a file, the embedded default) and PostgreSQL (psycopg 3) are supported. SQLite runs in
WAL mode with a busy timeout so that several server processes and worker threads can share one
file, and write sessions take its write lock up front (BEGIN IMMEDIATE). A connection idle
for a second is pinged when it is checked out, so a server that went away and came back is
reconnected to without a restart. For the service, PostgreSQL statements carry a server-side
timeout and a watchdog cuts a connection that is held past a bound (a database that stops
answering cannot hang a request). Errors that mean "the database cannot be reached" are told
apart from the rest by :func:`is_unavailable` (the service answers 503 for them), and those
an operator must mend (a full disk, a read-only file or server) by :func:`storage_trouble`:
both by the driver's code of the failure (PostgreSQL's SQLSTATE, SQLite's result code), not
by its message, which a server may word in another language; the English words decide only
for an error that carries no code.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, func, inspect, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from api.core.config import SettingsError
from planner.bundled import bundled_dir

__all__ = [
    "MIGRATIONS",
    "POOL_MARGIN",
    "Database",
    "alembic_config",
    "describe_url",
    "is_unavailable",
    "migrate",
    "migration_connection",
    "normalize_url",
    "reported_failures",
    "storage_trouble",
    "wait_for_database",
]

log = logging.getLogger("stagewright.db")

# The Alembic scripts: the top-level migrations/ of a checkout, or the copy inside an
# installed wheel (like `profiles/`).
MIGRATIONS = bundled_dir("api", "migrations")
_SUPPORTED = ("sqlite", "postgresql")
# Any constant works: it only has to be the same in every process that migrates.
_MIGRATION_LOCK_KEY = 0x5747_5249
_WRITE_OPTION = "stagewright_write"
_SQLITE_BUSY_MS = 15_000
_CONNECT_TIMEOUT_S = 3
_POOL_TIMEOUT_S = 5
POOL_MARGIN = 4  # connections a pool may open past its size, for a moment
_DEFAULT_CONNECTIONS = 5
_PING_AFTER_S = 1.0
_TCP_USER_TIMEOUT_MS = 10_000


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
    if parsed.get_backend_name() == "sqlite" and parsed.get_driver_name() != "pysqlite":
        raise SettingsError(
            f"there is no driver {parsed.get_driver_name()!r} for sqlite here; write "
            f"sqlite:///{parsed.database or 'stagewright.db'} (Python's own sqlite3)"
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
    later), or cannot write until an operator mends it (:func:`storage_trouble`: a server
    that takes no writes), as opposed to a statement it rejected."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError, DisconnectionError)):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    # By code only: a bug's message that mentions a disk is not the database's trouble.
    return bool(exc.connection_invalidated) or _storage_by_code(exc)[1] is not None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own transaction handling starts transactions lazily and cannot start an
    # IMMEDIATE one; hand it over to the "begin" listener below.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers and one writer work at once; busy_timeout makes a writer wait for
        # another process's write instead of failing with "database is locked".
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    """BEGIN IMMEDIATE for write sessions: the write lock is taken before the first read,
    so a read-then-write transaction can neither interleave with another writer nor fail
    half-way with SQLITE_BUSY_SNAPSHOT (WAL refuses to upgrade a stale read snapshot)."""
    mode = "IMMEDIATE" if conn.get_execution_options().get(_WRITE_OPTION) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


def _postgres_options(url: URL, statement_timeout_s: float | None) -> dict[str, Any]:
    """connect_args for psycopg: a connect timeout, TCP keepalives (a vanished host is
    noticed by the kernel), and server-side statement and lock timeouts appended to any
    ``options`` the URL already carries."""
    args: dict[str, Any] = {
        "connect_timeout": _CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
    }
    if statement_timeout_s is not None:
        ms = max(1, int(statement_timeout_s * 1000))
        extra = f"-c statement_timeout={ms} -c lock_timeout={ms}"
        given = url.query.get("options")
        given_text = given if isinstance(given, str) else " ".join(given or ())
        args["options"] = f"{given_text} {extra}".strip()
    return args


class _Watchdog:
    """Bounds how long one checked-out PostgreSQL connection may be used.

    A statement timeout is enforced by the server; a server (or proxy) that stops
    answering altogether leaves the client waiting on its socket for as long as TCP
    allows. Every checkout is registered with a deadline; a connection still checked out
    past it has its socket shut down, so the blocked call fails at once with a
    connection error (the service answers 503 and the pool discards the connection).
    One thread serves every connection of the engine. A connection is forgotten when it is
    checked in, invalidated or closed (before it closes: its socket number may be reused),
    and its socket is looked up at the moment it is cut, under the same lock."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._armed: dict[int, tuple[float, Any]] = {}  # id(record) -> (deadline, dbapi conn)
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, record: Any, dbapi_connection: Any) -> None:
        with self._lock:
            self._armed[id(record)] = (time.monotonic() + self.limit_s, dbapi_connection)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="stagewright-db-watchdog", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def disarm(self, record: Any) -> None:
        with self._lock:
            self._armed.pop(id(record), None)

    def _watch(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                expired = [key for key, (deadline, _) in self._armed.items() if deadline <= now]
                for key in expired:
                    _, connection = self._armed.pop(key)
                    fd = _socket_fd(connection)
                    if fd is not None:
                        _shut_down(fd)
                        log.warning(
                            "a database call ran over %.1f s; its connection was cut",
                            self.limit_s,
                        )
                nearest = min((d for d, _ in self._armed.values()), default=now + 60)
                self._lock.wait(max(0.01, nearest - now))


def _socket_fd(dbapi_connection: Any) -> int | None:
    """The socket of a live psycopg connection, or None (closed, or not psycopg)."""
    if getattr(dbapi_connection, "closed", True):
        return None
    pgconn = getattr(dbapi_connection, "pgconn", None)
    try:
        fd = int(pgconn.socket) if pgconn is not None else -1
    except Exception:  # a closed connection has no socket
        return None
    return fd if fd >= 0 else None


def _shut_down(fd: int) -> None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def _install_checkout_guard(
    engine: Engine, watchdog: _Watchdog | None, ping_after_s: float
) -> None:
    """Our own pre-ping, under the watchdog: a connection idle for ``ping_after_s`` is
    pinged when checked out (a server restart is noticed before the request's own
    statement fails); a busy pool skips the round trip."""

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if watchdog is not None:
            watchdog.arm(record, dbapi_connection)
        idle_since = record.info.get("checked_in_at")
        if idle_since is None or time.monotonic() - idle_since < ping_after_s:
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            dbapi_connection.rollback()
        except Exception as exc:
            if watchdog is not None:
                watchdog.disarm(record)
            raise DisconnectionError(str(exc).splitlines()[0] if str(exc) else "ping") from exc

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        if watchdog is not None:
            watchdog.disarm(record)
        record.info["checked_in_at"] = time.monotonic()

    if watchdog is not None:

        @event.listens_for(engine, "invalidate")
        def _invalidate(_dbapi_connection: Any, record: Any, _exc: Any) -> None:
            watchdog.disarm(record)

        @event.listens_for(engine, "close")
        def _close(_dbapi_connection: Any, record: Any) -> None:
            watchdog.disarm(record)


def _make_engine(
    url: URL,
    statement_timeout_s: float | None,
    operation_timeout_s: float | None,
    connections: int,
) -> Engine:
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": _SQLITE_BUSY_MS / 1000},
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        _install_checkout_guard(engine, None, ping_after_s=_PING_AFTER_S)
        return engine
    # Every thread that may hold a connection keeps one open: a connection opened past the
    # pool's size is closed again when returned, and PostgreSQL forks a backend for each
    # new one, so a pool smaller than the threads using it opened and closed connections
    # all the time under load (78 in 5 s of cached reads, with p99 stalls of 0.3-1 s). The
    # overflow is only a margin for a thread that nests two sessions.
    engine = create_engine(
        url,
        pool_size=connections,
        max_overflow=POOL_MARGIN,
        pool_timeout=_POOL_TIMEOUT_S,
        connect_args=_postgres_options(url, statement_timeout_s),
    )
    watchdog = _Watchdog(operation_timeout_s) if operation_timeout_s is not None else None
    _install_checkout_guard(engine, watchdog, ping_after_s=_PING_AFTER_S)
    return engine


class Database:
    """One engine and its session factories. Thread-safe; one per process.

    ``statement_timeout_s`` (PostgreSQL) makes the server cancel any statement or lock wait
    longer than that; ``operation_timeout_s`` cuts a connection checked out for longer
    (a database that stopped answering). Both are off by default (migrations and command
    line tools may run long); the service turns them on. ``connections`` is how many
    threads of the process may use the database at once: on PostgreSQL the pool keeps that
    many connections open (and a few more for a moment if needed)."""

    def __init__(
        self,
        url: str | URL,
        *,
        statement_timeout_s: float | None = None,
        operation_timeout_s: float | None = None,
        connections: int = _DEFAULT_CONNECTIONS,
    ) -> None:
        self.url = normalize_url(url)
        self.engine = _make_engine(self.url, statement_timeout_s, operation_timeout_s, connections)
        self.sessions: sessionmaker[Session] = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions: sessionmaker[Session] = sessionmaker(
            self.engine.execution_options(**{_WRITE_OPTION: True}), expire_on_commit=False
        )

    @property
    def dialect(self) -> str:
        return self.url.get_backend_name()

    def __repr__(self) -> str:
        return f"Database({describe_url(self.url)})"

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A session that is rolled back (if still open) and closed on exit. ``write=True``
        for a transaction that reads and then writes: on SQLite it takes the write lock at
        its start (BEGIN IMMEDIATE), so concurrent writers queue instead of colliding."""
        factory = self._write_sessions if write else self.sessions
        with factory() as session:
            yield session

    def dedicated_connection(self, application_name: str) -> Any:
        """A new psycopg connection outside the pool, in autocommit, with the pool's
        connect timeout and TCP keepalives (PostgreSQL only): for a thread that holds one
        connection for a long time (LISTEN), which must not take a pooled one from
        requests. ``application_name`` names it in ``pg_stat_activity`` unless the URL
        names the application already (the operator's name wins). The caller closes it."""
        import psycopg

        if self.dialect != "postgresql":
            raise ValueError("a dedicated connection is for PostgreSQL")
        cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
        cparams.update(_postgres_options(self.url, None))
        cparams.setdefault("application_name", application_name)
        # A statement whose bytes the server stops acknowledging fails after this, rather
        # than when TCP gives up (many minutes): keepalives only cover an idle connection.
        cparams.setdefault("tcp_user_timeout", _TCP_USER_TIMEOUT_MS)
        return psycopg.connect(*cargs, autocommit=True, **cparams)

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


@contextmanager
def migration_connection(database: Database) -> Iterator[Connection]:
    """A connection to run migrations on. On SQLite, foreign keys are off while it is
    open: a batch migration rebuilds a table (copy, drop, rename), and with them on,
    dropping a parent table would delete its children's rows on the way (links and layer
    points of ``hardware``, jobs and measurements of ``plans``). They are checked after."""
    with database.engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        raw: Any = conn.connection.driver_connection
        if sqlite:  # outside any transaction, where the pragma takes effect
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            yield conn
        finally:
            if sqlite:
                broken = raw.execute("PRAGMA foreign_key_check").fetchall()
                raw.execute("PRAGMA foreign_keys=ON")
                if broken:
                    raise SettingsError(
                        f"the migration left {len(broken)} row(s) whose parent is missing "
                        f"(first: {tuple(broken[0])}); restore the database from a backup"
                    )


def migrate(database: Database, revision: str = "head") -> None:
    """Upgrade the schema to ``revision``. On PostgreSQL an advisory lock makes concurrent
    starts (several replicas) migrate one after the other instead of colliding."""
    from alembic import command

    config = alembic_config()
    with migration_connection(database) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
        _check_schema_revision(conn, config)
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def _check_schema_revision(conn: Connection, config: Any) -> None:
    """Refuse, with what to do, a database these migrations cannot upgrade: one migrated by
    a newer stagewright (an image rolled back), or one holding stagewright's tables without
    Alembic's record of their revision (made by hand, or alembic_version dropped), which
    the first migration would try to create again. Nothing is changed."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from api.store.models import Base

    script = ScriptDirectory.from_config(config)
    head = script.get_current_head()
    current = MigrationContext.configure(conn).get_current_heads()
    for found in current:
        try:
            known = script.get_revision(found) is not None
        except Exception:  # Alembic's "Can't locate revision"
            known = False
        if not known:
            raise SettingsError(
                f"the database's schema is at revision {found}, but the newest this version "
                f"of stagewright knows is {head}: a newer stagewright migrated it; run that "
                "version (or newer) against it, or point this one at another database"
            )
    if not current:
        ours = sorted(set(Base.metadata.tables) & set(inspect(conn).get_table_names()))
        if ours:
            raise SettingsError(
                f"the database has stagewright's tables ({', '.join(ours)}) but no "
                "alembic_version recording their schema revision, so they cannot be "
                "upgraded; restore it from a backup, or use a new, empty database"
            )


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
            refused = _refusal(database, exc)
            if refused is not None:  # waiting would not change it
                raise SettingsError(refused) from None
            if time.monotonic() >= deadline:
                raise SettingsError(
                    f"cannot reach the database at {describe_url(database.url)} "
                    f"({_reason(exc)}); check that it is running and that the URL "
                    "(--database-url or STAGEWRIGHT_DATABASE_URL) is right"
                ) from None
            if attempt == 1:
                log.warning("waiting for the database at %s", describe_url(database.url))
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# The SQLSTATEs of a connection PostgreSQL refuses for good: a database that does not exist
# (invalid_catalog_name), a role that does not exist or a client pg_hba.conf does not let in
# (invalid_authorization_specification), a wrong password (invalid_password).
_REFUSED_SQLSTATES = frozenset({"3D000", "28000", "28P01"})
# The fallback, for an error that carries no SQLSTATE, which is every failure while
# connecting with psycopg 3.3 (libpq keeps the server's code to itself: the exception's
# `sqlstate` and `diag` are empty): what the server says of those refusals in English, and
# what libpq says of options it cannot use. A server whose lc_messages is another language
# words them otherwise; such a refusal is not recognised, and is waited out as before.
_REFUSED = re.compile(
    r"FATAL:\s+(database \".*\" does not exist|role \".*\" does not exist|"
    r"no pg_hba\.conf entry|.*authentication failed)"
    r"|^connection is bad: invalid|^invalid connection option|^invalid dsn"
)


def _refusal(database: Database, exc: BaseException) -> str | None:
    """What to say at once of a connection that failed for good, else None (wait on)."""
    reason = _reason(exc)
    if database.dialect == "sqlite":  # a file: no server that could come up later
        return (
            f"cannot open the SQLite file {database.url.database} ({reason}); check that "
            "this user may create and write it and its folder (SQLite keeps its -wal and "
            "-shm files beside it), or choose another --database-url"
        )
    code = _sqlstate(_driver_error(exc))
    if code is not None:
        if code not in _REFUSED_SQLSTATES:
            return None
        said = reason
    else:
        found = _REFUSED.search(reason)
        if found is None:
            return None
        said = reason[found.start() :] if reason[found.start() :].startswith("FATAL") else reason
    return (
        f"the database server refused the connection to {describe_url(database.url)} "
        f"({' '.join(said.split())}); fix the URL (--database-url or "
        "STAGEWRIGHT_DATABASE_URL), or create the database or role it names"
    )


@contextmanager
def reported_failures(url: str | URL) -> Iterator[None]:
    """For the command-line tools: a database failure that is no bug of theirs (a full or
    read-only file system, a server gone) becomes one SettingsError line saying what to
    check, instead of SQLAlchemy's traceback. The transaction that failed is rolled back."""
    try:
        yield
    except DBAPIError as exc:
        if not is_unavailable(exc):
            raise  # a statement it rejected: a bug's traceback
        hint = storage_trouble(exc) or "check that the database is running and try again"
        raise SettingsError(
            f"the database at {describe_url(url)} failed ({_reason(exc)}); the write in "
            f"progress was rolled back; {hint}"
        ) from None


_NO_SPACE = "check the free space (and quotas) of its file system"
_NOT_WRITABLE = "check that this user may write the database file and its folder"
_READ_ONLY_SERVER = (
    "check that the URL names a server that takes writes: a standby, or one with "
    "default_transaction_read_only on, refuses them"
)
# What to check, by the driver's code of the failure: PostgreSQL's SQLSTATE (disk_full,
# read_only_sql_transaction) and SQLite's primary result code (the extended ones, such as
# SQLITE_IOERR_WRITE when a write cannot grow the file, share it).
_STORAGE_SQLSTATES = {"53100": _NO_SPACE, "25006": _READ_ONLY_SERVER}
# SQLITE_CANTOPEN is not among them: a file that cannot be opened is most often on a volume
# not mounted yet, which the service waits for without a restart (503, retry).
_STORAGE_SQLITE_CODES = {
    sqlite3.SQLITE_FULL: _NO_SPACE,
    sqlite3.SQLITE_IOERR: _NO_SPACE,
    sqlite3.SQLITE_READONLY: _NOT_WRITABLE,
    sqlite3.SQLITE_PERM: _NOT_WRITABLE,
}


def storage_trouble(exc: BaseException) -> str | None:
    """What an operator must check when the database failed for want of storage (its file
    system full or over a quota, SQLite's "disk I/O error" when a write cannot grow the file,
    a file or folder it may not write, a server that takes no writes), else None: waiting
    alone will not mend it, unlike a database that is restarting. Decided by the driver's
    code of the failure, which does not depend on the language the server speaks."""
    coded, hint = _storage_by_code(exc)
    if coded:
        return hint
    # The fallback, for an error that carries no code (a wrapper's, or a driver's that
    # gives none): the English words of SQLite's and PostgreSQL's messages, which a server
    # with another lc_messages does not use.
    lowered = _reason(exc).lower()
    if "disk" in lowered or "space" in lowered:  # SQLite's "database or disk is full"
        return _NO_SPACE
    if "readonly" in lowered or "read-only" in lowered:
        return _NOT_WRITABLE
    return None


def _storage_by_code(exc: BaseException) -> tuple[bool, str | None]:
    """Whether the driver's error carries a code (PostgreSQL's SQLSTATE, SQLite's result
    code), and what :func:`storage_trouble` says of that code (None: not storage trouble)."""
    original = _driver_error(exc)
    code = _sqlstate(original)
    if code is not None:
        return True, _STORAGE_SQLSTATES.get(code)
    primary = _sqlite_code(original)
    if primary is not None:
        return True, _STORAGE_SQLITE_CODES.get(primary)
    return False, None


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception: SQLAlchemy's wraps it as ``orig``."""
    return getattr(exc, "orig", None) or exc


def _sqlstate(original: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of a psycopg error (None when it carries none, as a failure to
    connect does)."""
    code = getattr(original, "sqlstate", None)
    return code if isinstance(code, str) else None


def _sqlite_code(original: BaseException) -> int | None:
    """The primary SQLite result code of a sqlite3 error (its low byte: SQLITE_IOERR of
    SQLITE_IOERR_WRITE), or None."""
    code = getattr(original, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _reason(exc: BaseException) -> str:
    """The driver's first message line, without SQLAlchemy's background link."""
    original = _driver_error(exc)
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__
