"""Database failures are told apart by the driver's code of the failure (PostgreSQL's
SQLSTATE, SQLite's result code), not by the English words of its message, which a server
with another ``lc_messages`` does not use.

The failures are real ones, raised by the real drivers (a full SQLite file, a read-only
transaction on the local PostgreSQL, ...), except PostgreSQL's disk_full, which no test can
cause on a shared server: that one is psycopg's own class for its SQLSTATE. This machine has
no locale but C and POSIX (``locale -a``), so PostgreSQL refuses ``SET lc_messages`` to any
other language here; the messages of another language are made by replacing the text of the
real exception, keeping its code, with the translation from PostgreSQL's own catalogues
(postgres-15.mo) and glibc's."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from api.core import db
from api.core.config import SettingsError
from api.core.db import Database, is_unavailable, reported_failures, storage_trouble
from api.services import measured_runs
from tests.integration.conftest import assert_problem, schema_url
from tests.integration.test_measured_runs import RUN

NO_SPACE = "check the free space (and quotas) of its file system"
NOT_WRITABLE = "check that this user may write the database file and its folder"
READ_ONLY_SERVER = "check that the URL names a server that takes writes"


def _raised(action: Callable[[], Any]) -> DBAPIError:
    """The error SQLAlchemy raised for ``action``, around the driver's own."""
    with pytest.raises(DBAPIError) as caught:
        action()
    return caught.value


def _worded(exc: DBAPIError, message: str) -> DBAPIError:
    """``exc`` with the driver's message replaced by ``message`` (its code kept), as a
    server speaking another language would have said it."""
    exc.orig.args = (message,)
    assert str(exc.orig) == message
    return exc


# -- SQLite ---------------------------------------------------------------------------------


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'store.db'}")
    with database.session(write=True) as session:
        session.execute(text("CREATE TABLE t (x BLOB)"))
        session.commit()
    yield database
    database.dispose()


def _write(database: Database, *pragmas: str, rows: int = 1) -> None:
    with database.session(write=True) as session:
        for pragma in pragmas:
            session.execute(text(pragma))
        for _ in range(rows):
            session.execute(text("INSERT INTO t VALUES (randomblob(4000))"))
        session.commit()


def test_a_full_sqlite_file_is_told_by_its_code(sqlite_db):
    # max_page_count: SQLite's own "the file may not grow", answered as a full disk.
    exc = _raised(lambda: _write(sqlite_db, "PRAGMA max_page_count = 3", rows=10))
    assert exc.orig.sqlite_errorname == "SQLITE_FULL"
    assert storage_trouble(exc) == NO_SPACE
    assert storage_trouble(_worded(exc, "Datenbank voll")) == NO_SPACE
    assert is_unavailable(exc)


def test_a_read_only_sqlite_file_is_told_by_its_code(sqlite_db):
    exc = _raised(lambda: _write(sqlite_db, "PRAGMA query_only = 1"))
    assert exc.orig.sqlite_errorname == "SQLITE_READONLY"
    assert storage_trouble(exc) == NOT_WRITABLE
    assert storage_trouble(_worded(exc, "Schreibschutz")) == NOT_WRITABLE


def test_a_sqlite_file_that_cannot_be_opened_is_waited_for(tmp_path):
    """SQLite's "unable to open database file" is most often a volume not mounted yet: the
    service answers 503 "retry" until the file is there (test_faults), not "an operator must
    mend it"."""
    database = Database(f"sqlite:///{tmp_path / 'no-such-folder' / 'store.db'}")
    try:
        exc = _raised(database.ping)
    finally:
        database.dispose()
    assert exc.orig.sqlite_errorname == "SQLITE_CANTOPEN"
    assert str(exc.orig) == "unable to open database file"
    assert storage_trouble(exc) is None


def test_a_locked_sqlite_file_is_not_storage_trouble_whatever_its_message_says(sqlite_db):
    """The code decides, not the words: a busy file is waited for even when its message
    speaks of a full disk."""

    def second_writer() -> None:
        with sqlite_db.engine.connect() as conn:
            conn.execute(text("PRAGMA busy_timeout = 0"))  # fail at once, do not wait
            conn.execute(text("INSERT INTO t VALUES (2)"))

    with sqlite_db.session(write=True) as holder:
        holder.execute(text("INSERT INTO t VALUES (1)"))  # holds the write lock
        exc = _raised(second_writer)
    assert exc.orig.sqlite_errorname == "SQLITE_BUSY"
    assert storage_trouble(_worded(exc, "database or disk is full")) is None


def test_an_error_without_a_code_falls_back_to_the_english_words():
    """An error that carries no code (one a wrapper made, say) is told by the words of
    SQLite's and PostgreSQL's English messages, as before."""
    import sqlite3

    bare = OperationalError("INSERT ...", {}, sqlite3.OperationalError("database or disk is full"))
    assert not hasattr(bare.orig, "sqlite_errorcode")
    assert storage_trouble(bare) == NO_SPACE
    assert storage_trouble(OperationalError("x", {}, psycopg.OperationalError("gone"))) is None


# -- PostgreSQL -----------------------------------------------------------------------------


@pytest.fixture
def pg_db(postgres_schema: str) -> Iterator[Database]:
    database = Database(schema_url(postgres_schema))
    yield database
    database.dispose()


def _read_only_write(database: Database) -> None:
    with database.session(write=True) as session:
        session.execute(text("SET TRANSACTION READ ONLY"))
        session.execute(text("CREATE TABLE sw_never_created (x int)"))


@pytest.fixture
def read_only_error(pg_db: Database) -> DBAPIError:
    """A real read_only_sql_transaction (a standby, or default_transaction_read_only on,
    answers every write so), worded as a French server words it."""
    exc = _raised(lambda: _read_only_write(pg_db))
    assert exc.orig.sqlstate == "25006"
    return _worded(exc, "ne peut pas exécuter CREATE TABLE dans une transaction en lecture seule")


def test_a_server_that_takes_no_writes_is_told_by_its_code(read_only_error):
    """A write refused by a read-only server (SQLAlchemy's InternalError, not an
    OperationalError) was a bug's 500 and traceback; it is the operator's to mend."""
    assert storage_trouble(read_only_error) == (
        f"{READ_ONLY_SERVER}: a standby, or one with default_transaction_read_only on, refuses them"
    )
    assert is_unavailable(read_only_error)
    with pytest.raises(SettingsError) as said, reported_failures("postgresql://h/db"):
        raise read_only_error
    assert "transaction en lecture seule" in str(said.value)
    assert READ_ONLY_SERVER in str(said.value)


def test_the_service_answers_a_read_only_server_as_a_503_saying_so(
    client, monkeypatch, read_only_error
):
    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise read_only_error

    monkeypatch.setattr(measured_runs, "add_measured_runs", refused)
    response = client.post("/v1/measurements", json={"runs": [RUN]})
    assert_problem(response, 503, "could not write", READ_ONLY_SERVER)
    assert response.headers["Retry-After"]


def test_a_full_disk_of_the_server_is_told_by_its_code():
    """psycopg's class for disk_full (no test can fill the shared server's disk), with the
    message of a German server: none of the English words."""
    german = (
        "konnte Datei »base/16384/2619« nicht erweitern: Auf dem Gerät ist kein "
        "Speicherplatz mehr verfügbar"
    )
    exc = OperationalError("INSERT ...", {}, psycopg.errors.DiskFull(german))
    assert exc.orig.sqlstate == "53100"
    assert storage_trouble(exc) == NO_SPACE


def test_a_statement_error_is_not_storage_trouble_whatever_its_message_says(pg_db):
    exc = _raised(lambda: _execute(pg_db, "SELECT 1/0"))
    assert exc.orig.sqlstate == "22012"  # division_by_zero
    assert storage_trouble(_worded(exc, "no space left on device")) is None
    assert not is_unavailable(exc)


def _execute(database: Database, statement: str) -> None:
    with database.engine.connect() as conn:
        conn.execute(text(statement))


def test_a_database_that_does_not_exist_is_refused_by_its_code(pg_db):
    """invalid_catalog_name, as a French server words it, is refused at once. (The
    server's own error, raised by a statement: psycopg gives no SQLSTATE for a failure while
    connecting, see the next test.)"""
    missing = f"sw_no_such_database_{uuid.uuid4().hex[:8]}"

    def drop() -> None:
        with pg_db.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(text(f'DROP DATABASE "{missing}"'))

    exc = _raised(drop)
    assert exc.orig.sqlstate == "3D000"
    french = f"la base de données « {missing} » n'existe pas"
    refused = db._refusal(pg_db, _worded(exc, french))
    assert refused is not None and "refused the connection to postgresql" in refused
    assert french in refused
    # Another code with the same words is not a refusal.
    other = _worded(_raised(lambda: _execute(pg_db, "SELECT 1/0")), french)
    assert db._refusal(pg_db, other) is None


def test_a_failure_while_connecting_carries_no_code_so_the_english_words_decide(pg_db):
    """What psycopg 3.3 gives for a database that does not exist: no SQLSTATE (libpq keeps
    the server's code to itself), so the English fallback is what recognises it; a server
    speaking another language is waited out as before. If this fails, psycopg gives the
    code now: the fallback may go."""
    wrong = Database(pg_db.url.set(database=f"sw_no_such_database_{uuid.uuid4().hex[:8]}"))
    try:
        exc = _raised(wrong.ping)
        assert exc.orig.sqlstate is None and exc.orig.diag.sqlstate is None
        assert "refused the connection" in (db._refusal(wrong, exc) or "")
    finally:
        wrong.dispose()
