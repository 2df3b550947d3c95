"""What ``stagewright serve`` and ``stagewright profiles load`` do.

Both first bring the database up to date: wait for it (a container may start before its
database), upgrade the schema with Alembic, and load the bundled profiles (idempotent). Then
``serve`` runs uvicorn with the application factory; worker processes rebuild the settings
from the environment, which is set here from the options.
"""

from __future__ import annotations

import copy
import errno
import logging
import logging.config
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from api.core.config import Settings, SettingsError
from api.core.db import Database, describe_url, migrate, reported_failures, wait_for_database
from api.security import parse_tokens
from api.store.profiles import WriteReport, load_bundled_profiles, load_profile_folders

__all__ = ["load_profiles", "prepare_database", "serve"]

log = logging.getLogger("stagewright.service")


_SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def _check_sqlite_path(database: Database) -> None:
    if database.dialect != "sqlite":
        return
    path = database.url.database
    if not path or path == ":memory:" or path.startswith("file::memory:"):
        raise SettingsError(
            "an in-memory SQLite database is not shared between the server's threads and "
            "processes; use a file, e.g. sqlite:///stagewright.db"
        )
    file = Path(path).expanduser().resolve()
    try:
        _check_sqlite_file(file)
    except OSError as exc:  # a name longer than the file system takes, a broken mount...
        raise SettingsError(
            f"cannot open the SQLite file {file} ({exc.strerror or exc}); choose another "
            "--database-url"
        ) from None


def _check_sqlite_file(file: Path) -> None:
    folder = file.parent
    if not folder.is_dir():
        raise SettingsError(
            f"the folder {folder} for the SQLite file does not exist; create it or choose "
            "another --database-url"
        )
    if file.is_dir():
        raise SettingsError(
            f"{file} is a folder, not an SQLite file; name a file in it, e.g. "
            f"sqlite:///{file / 'stagewright.db'}"
        )
    for needed in (folder, file) if file.exists() else (folder,):
        if not os.access(needed, os.W_OK):
            what = "folder" if needed == folder else "file"
            raise SettingsError(
                f"the {what} {needed} is not writable by this user, and SQLite writes the "
                "database and its -wal and -shm files there; make it writable or choose "
                "another --database-url"
            )
    if file.is_file() and file.stat().st_size > 0:
        with file.open("rb") as opened:
            header = opened.read(len(_SQLITE_HEADER))
        if header != _SQLITE_HEADER:  # SQLite would say "file is not a database" mid-query
            raise SettingsError(
                f"{file} is not an SQLite database (a plan request or another file?); name "
                "a new file or an existing stagewright database with --database-url"
            )


def prepare_database(settings: Settings) -> WriteReport:
    """Wait for the database, migrate it to the newest schema, load the bundled profiles."""
    database = Database(settings.database_url)
    try:
        _check_sqlite_path(database)
        wait_for_database(database, settings.database_wait_s)
        with reported_failures(database.url):
            migrate(database)
            with database.session() as session:
                return load_bundled_profiles(session=session)
    finally:
        database.dispose()


def load_profiles(
    *, database_url: str | None, folders: Sequence[Path] = ()
) -> tuple[WriteReport, WriteReport | None]:
    """Migrate the store and load the bundled profiles, then ``folders`` as the team's own
    (:func:`api.store.profiles.load_profile_folders`): the two reports, the second None
    without folders."""
    settings = Settings.from_env(database_url=database_url)
    bundled = prepare_database(settings)
    if not folders:
        return bundled, None
    database = Database(settings.database_url)
    try:
        with reported_failures(database.url), database.session() as session:
            return bundled, load_profile_folders(session=session, folders=folders)
    finally:
        database.dispose()


# How long a server process may take to answer its supervisor (see serve()).
WORKER_HEALTHCHECK_S = 60


class PoolResetFailure(logging.Filter):
    """SQLAlchemy's pool logs a connection it could not reset when it came back (its
    backend was terminated, or the watchdog cut it in the middle of a command) with a
    traceback, and then discards that connection: under a failing database an expected
    event, which this turns into one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.getMessage().startswith("Exception during reset"):
            error = record.exc_info[1]
            lines = str(error).strip().splitlines() if error is not None else []
            record.msg = "a database connection could not be reset on return; discarded: %s"
            record.args = (lines[0] if lines else type(error).__name__,)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def _log_config() -> dict[str, Any]:
    """Uvicorn's logging plus the service's own loggers and SQLAlchemy's pool warnings, in
    every server process."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["stagewright"] = {
        "handlers": ["default"],
        "level": "INFO",
        "propagate": False,
    }
    config.setdefault("filters", {})["pool_reset"] = {"()": PoolResetFailure}
    config["handlers"]["database"] = {**config["handlers"]["default"], "filters": ["pool_reset"]}
    config["loggers"]["sqlalchemy.pool"] = {
        "handlers": ["database"],
        "level": "WARNING",
        "propagate": False,
    }
    return config


def connection_budget_warning(database: Database, settings: Settings, workers: int) -> str | None:
    """What to change when ``workers`` server processes may open more connections than the
    PostgreSQL server has left for them (it refuses the rest with "too many clients
    already", which the service can only answer with 503), else None."""
    if database.dialect != "postgresql":
        return None
    from api.app import connections_per_process

    each = connections_per_process(settings)
    with database.engine.connect() as conn:
        limit = int(conn.exec_driver_sql("SHOW max_connections").scalar_one())
        reserved = int(conn.exec_driver_sql("SHOW superuser_reserved_connections").scalar_one())
        in_use = int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).scalar_one()
        )
    left = limit - reserved - in_use
    if workers * each <= left:
        return None
    fixed = each - settings.request_threads - settings.planner_threads
    return (
        f"{workers} server process(es) may open up to {workers * each} connections "
        f"({each} each: STAGEWRIGHT_REQUEST_THREADS + STAGEWRIGHT_PLANNER_THREADS + {fixed}), "
        f"but the database's max_connections is {limit}, {reserved} of them reserved for "
        f"superusers and {in_use} in use; under load it will refuse some and requests "
        "answer 503: lower --workers or STAGEWRIGHT_REQUEST_THREADS, or raise max_connections"
    )


def check_listen(host: str, port: int) -> None:
    """Refuse an address this process cannot listen on, before the database is touched or
    the server announced (uvicorn would find out after both). The socket is closed again
    at once; uvicorn binds its own (with SO_REUSEADDR, as here)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise SettingsError(
            f"--host {host} does not resolve ({reason}); use an address of this machine, "
            "e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    family, kind, proto, _, address = found[0]
    shown = f"[{host}]" if ":" in host else host
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            hint = {
                errno.EADDRINUSE: "another program (another stagewright serve?) listens "
                "there; stop it or choose another --port",
                errno.EACCES: "ports below 1024 need privileges; choose another --port",
                errno.EADDRNOTAVAIL: "no interface of this machine has that address; "
                "choose another --host",
            }.get(exc.errno or 0, "choose another --host or --port")
            raise SettingsError(
                f"cannot listen on {shown}:{port} ({exc.strerror or exc}); {hint}"
            ) from None


# The most server processes `serve` starts: WORKERS_PER_CPU per CPU it may run on, at least
# MIN_WORKER_CAP. A guard against a typo (each process starts its own search processes and
# pool of database connections), not a tuning rule.
WORKERS_PER_CPU = 4
MIN_WORKER_CAP = 8


def check_serve_options(host: str, port: int, workers: int) -> None:
    """Refuse a port, host or number of server processes no one means, in one line each."""
    if not 0 < port < 65536:
        raise SettingsError(f"--port {port} is not a port; use 1-65535")
    if not host.strip():  # "" binds every interface: an unset $HOST, not a choice
        raise SettingsError(
            "--host is empty; use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        )
    if workers < 1:
        raise SettingsError("--workers must be at least 1")
    # The CPUs this process may run on (a container's cpuset), not the whole host's.
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    most = max(MIN_WORKER_CAP, WORKERS_PER_CPU * (cpus or 1))
    if workers > most:
        raise SettingsError(
            f"--workers {workers} is more server processes than the {cpus or 1} CPU(s) this "
            f"process may run on can serve; use 1-{most} (each runs "
            "STAGEWRIGHT_PLANNER_THREADS searches of its own)"
        )


def serve(*, host: str, port: int, database_url: str | None, workers: int) -> int:
    import uvicorn

    from api.http_protocol import NoDelayH11Protocol

    check_serve_options(host, port, workers)
    settings = Settings.from_env(database_url=database_url)
    # Every setting is checked before the database is touched or the server announced; the
    # tokens are otherwise parsed only by the application, in the server process.
    parse_tokens(settings.api_tokens, settings.api_token)
    check_listen(host, port)
    log_config = _log_config()
    logging.config.dictConfig(log_config)
    report = prepare_database(settings)
    database = Database(settings.database_url)
    try:
        warning = connection_budget_warning(database, settings, workers)
    except Exception as exc:  # a warning only: the server answers 503 until the database does
        warning = None
        log.debug("could not count the database's connections: %s", exc)
    finally:
        database.dispose()
    if warning is not None:
        log.warning("%s", warning)
    log.info(
        "database %s ready; bundled profiles: %d created, %d updated, %d unchanged",
        describe_url(settings.database_url),
        report.created,
        report.updated,
        report.unchanged,
    )
    # Worker processes build their settings from the environment: hand ours over.
    os.environ.update(settings.to_env())
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(
        f"stagewright serving on http://{shown}:{port} (API docs at http://{shown}:{port}/docs)"
        f", {workers} process(es), database {describe_url(settings.database_url)}\n"
    )
    uvicorn.run(
        "api.app:served_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        http=NoDelayH11Protocol,
        access_log=settings.access_log,
        log_config=log_config,
        log_level="info",
        timeout_graceful_shutdown=5,
        # uvicorn kills a worker that does not answer its supervisor's ping within this
        # (5 s by default): on a busy machine a worker still importing the application
        # missed it, was killed and restarted, again and again (seen under load).
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
    )
    return 0
