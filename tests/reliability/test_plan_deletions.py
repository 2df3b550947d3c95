"""Done plans are answered from memory without a database round trip while the feed of
plan deletions is live (PostgreSQL LISTEN/NOTIFY, api/services/plan_deletions.py), and a
plan deleted by any process stops being served within a bounded time: on PostgreSQL by the
notice, on SQLite (and whenever the feed is not live) by checking on every read.

The other process is played by a second connection deleting the row, as another server
process's DELETE does it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete, event, text
from sqlalchemy.engine import make_url

from api.app import create_app
from api.core.db import Database
from api.services import plan_deletions
from api.store import crud
from api.store.models import PlanRecord
from planner.plan import plan as real_plan
from tests.integration.conftest import (
    PG_ADMIN_URL,
    assert_problem,
    example,
    settings_for,
    wait_until,
)
from tests.tcp_proxy import TcpProxy

# A notice travels PostgreSQL -> this process's listener thread; well under this.
NOTICE_BOUND_S = 2.0


@contextmanager
def _statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends while the block runs."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


@contextmanager
def _another_process(url: str) -> Iterator[Database]:
    """The database as another server process (or an operator) reaches it."""
    other = Database(url)
    try:
        yield other
    finally:
        other.dispose()


def _delete_elsewhere(url: str, plan_id: str) -> None:
    with _another_process(url) as other, other.session(write=True) as session:
        assert crud.delete_plan(session=session, plan_id=plan_id)  # commits


def _cached_plan(client: TestClient) -> tuple[str, str]:
    """A done plan whose answer is cached, after the feed went live on PostgreSQL (going
    live forgets everything cached before)."""
    state = client.app.state.stagewright  # type: ignore[attr-defined]
    if state.database.dialect == "postgresql":
        assert wait_until(lambda: state.deletions.live)
    created = client.post("/v1/plans", json=example("tiny-cpu"))
    assert created.status_code == 201, created.text
    location, plan_id = created.headers["location"], created.json()["id"]
    assert client.get(location).status_code == 200
    assert state.plans.get(plan_id, False) is not None
    return location, plan_id


def _job_queue_only(statement: str) -> bool:
    """A statement on the jobs table that touches no plan (the job poller's)."""
    return bool(re.search(r"\bjobs\b", statement)) and not re.search(r"\bplans\b", statement)


def _backend(url: str) -> str:
    return make_url(url).get_backend_name()


def test_a_cached_read_asks_the_database_only_when_deletions_are_not_heard(
    make_client, database_url
):
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    location, plan_id = _cached_plan(client)
    timeline = f"{location}/timeline"
    assert client.get(timeline).status_code == 200  # cached too
    postgres = _backend(database_url) == "postgresql"
    if postgres:
        # The feed listens on a connection of its own, never one of the pool's. The job
        # queue's poller takes a pool connection for a moment on its own clock (on a loaded
        # machine one can be out right now), so the pool must come back to none out, which
        # it never would if the feed held one.
        pool = state.database.engine.pool
        assert wait_until(lambda: pool.checkedout() == 0, 5), pool.status()
    else:
        time.sleep(0.2)
        assert not state.deletions.live  # SQLite has no notices
    heard = f"stagewright_plan_deletions_heard {1 if postgres else 0}"
    assert heard in client.get("/metrics").text
    with _statements(state.database.engine) as sent:
        answers = [client.get(location) for _ in range(20)]
        assert client.get(timeline).status_code == 200
    assert {a.status_code for a in answers} == {200}
    assert len({a.content for a in answers}) == 1
    # PostgreSQL: no statement at all; SQLite: one primary-key lookup per read. The job
    # queue's poller asks about the jobs table alone on its own clock, whatever the reads
    # do; on a loaded machine a poll can fall inside this window, so it is not counted.
    for_reads = [s for s in sent if not _job_queue_only(s)]
    lookups = [s for s in for_reads if s.startswith("SELECT plans.id")]
    assert len(for_reads if postgres else lookups) == (0 if postgres else 21), for_reads

    _delete_elsewhere(database_url, plan_id)
    assert wait_until(lambda: client.get(location).status_code == 404, NOTICE_BOUND_S)
    assert_problem(client.get(location), 404, plan_id)
    assert_problem(client.get(timeline), 404, plan_id)
    assert state.plans.get(plan_id, False) is None
    assert state.timelines.get(plan_id, 0) is None


def _postgres_only(database_url: str) -> None:
    if _backend(database_url) != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite checks every read")


def test_an_answer_read_before_a_deletion_is_not_cached_after_it(
    make_client, database_url, monkeypatch
):
    """The deletion is applied here while a reader is between loading the plan and caching
    what it loaded: the reader answers (the plan existed when read) but caches nothing."""
    from api.services import plans, timelines

    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    if state.database.dialect == "postgresql":
        assert wait_until(lambda: state.deletions.live)
    created = client.post("/v1/plans?include_rejected=false", json=example("tiny-cpu"))
    location, plan_id = created.headers["location"], created.json()["id"]
    state.forget_plan(None)  # nothing cached: the next reads load the plan
    load_plan, compute = plans.load_plan, timelines._compute

    def load_then_forgotten(session: Any, wanted: str) -> Any:
        record = load_plan(session, wanted)
        state.forget_plan(wanted)  # as the feed does when the notice arrives
        return record

    def compute_then_forgotten(app_state: Any, wanted: str, candidate: int) -> Any:
        timeline = compute(app_state, wanted, candidate)
        state.forget_plan(wanted)
        return timeline

    monkeypatch.setattr(plans, "load_plan", load_then_forgotten)
    monkeypatch.setattr(timelines, "_compute", compute_then_forgotten)
    assert client.get(location).status_code == 200
    assert client.get(f"{location}/timeline").status_code == 200
    assert state.plans.get(plan_id, False) is None
    assert state.timelines.get(plan_id, 0) is None
    monkeypatch.undo()  # read again, nothing in between: cached
    assert client.get(location).status_code == 200
    assert state.plans.get(plan_id, False) is not None


def test_truncating_the_plans_forgets_every_cached_plan(make_client, database_url):
    _postgres_only(database_url)
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    location, plan_id = _cached_plan(client)
    with _another_process(database_url) as other, other.session() as session:
        session.execute(text("TRUNCATE plans CASCADE"))
        session.commit()
    assert wait_until(lambda: state.plans.get(plan_id, False) is None, NOTICE_BOUND_S)
    assert_problem(client.get(location), 404, plan_id)


def test_a_rolled_back_delete_forgets_nothing(make_client, database_url):
    _postgres_only(database_url)
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    location, plan_id = _cached_plan(client)
    with _another_process(database_url) as other, other.session(write=True) as session:
        gone = session.execute(delete(PlanRecord).where(PlanRecord.id == plan_id))
        assert gone.rowcount == 1  # type: ignore[attr-defined]
        session.rollback()
    time.sleep(0.3)  # a notice, had one been sent, would have arrived
    assert state.plans.get(plan_id, False) is not None
    assert client.get(location).status_code == 200


def _terminate_listeners(url: str) -> int:
    """pg_terminate_backend on every listening connection; how many there were."""
    with _another_process(url) as admin, admin.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = :name AND pid <> pg_backend_pid()"
            ),
            {"name": "stagewright plan deletions"},
        )
        return len(rows.all())


def test_a_feed_that_lost_its_connection_forgets_everything_and_listens_again(
    make_client, database_url
):
    _postgres_only(database_url)
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    location, plan_id = _cached_plan(client)
    assert _terminate_listeners(database_url) >= 1, "no listening connection"
    assert wait_until(lambda: not state.deletions.live, 2.0)
    assert wait_until(lambda: state.deletions.live, 10.0)  # reconnected
    # Deletions made while it was not listening were not heard: everything was forgotten.
    assert state.plans.get(plan_id, False) is None
    assert client.get(location).status_code == 200  # read again from the database
    _delete_elsewhere(database_url, plan_id)
    assert wait_until(lambda: client.get(location).status_code == 404, NOTICE_BOUND_S)


def test_a_feed_that_does_not_hear_its_own_probe_never_goes_live(
    database_url, make_client, monkeypatch
):
    """As behind a pooler on which LISTEN cannot work (PgBouncer in transaction mode): the
    connection answers, but notices sent on the channel never arrive. Cached reads then
    check the database, and a deletion elsewhere is seen at once."""
    _postgres_only(database_url)
    monkeypatch.setattr(plan_deletions, "_LISTEN", "LISTEN stagewright_somewhere_else")
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    created = client.post("/v1/plans", json=example("tiny-cpu"))
    assert created.status_code == 201
    location, plan_id = created.headers["location"], created.json()["id"]
    time.sleep(3 * plan_deletions.HEARTBEAT_S)  # three probes sent, none heard
    assert not state.deletions.live
    assert "stagewright_plan_deletions_heard 0" in client.get("/metrics").text
    assert state.plans.get(plan_id, False) is not None
    with _statements(state.database.engine) as sent:
        assert client.get(location).status_code == 200
    assert any(s.startswith("SELECT plans.id") for s in sent)  # checked
    _delete_elsewhere(database_url, plan_id)
    assert_problem(client.get(location), 404, plan_id)


class _BehindAPooler:
    """A psycopg connection as a pooler hands it out: the server process it reports at
    connect (the pooler's own key) is not the one answering."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.info = type("Info", (), {"backend_pid": -1})()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __enter__(self) -> _BehindAPooler:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


def test_a_feed_through_a_pooler_never_goes_live(database_url, make_client, monkeypatch):
    _postgres_only(database_url)
    direct = Database.dedicated_connection
    monkeypatch.setattr(
        Database,
        "dedicated_connection",
        lambda self, name: _BehindAPooler(direct(self, name)),
    )
    client = make_client(planner=real_plan)
    time.sleep(3 * plan_deletions.HEARTBEAT_S)
    assert not client.app.state.stagewright.deletions.live


def test_a_silent_feed_is_not_trusted_after_a_bound(postgres_schema, monkeypatch):
    from tests.integration.conftest import migrate_with_profiles, schema_url

    monkeypatch.setattr(plan_deletions, "SILENT_AFTER_S", 1.5)
    url = schema_url(postgres_schema)
    migrate_with_profiles(url)
    target = make_url(PG_ADMIN_URL)
    proxy = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.up()
    proxied = make_url(url).set(host="127.0.0.1", port=proxy.port)
    app = create_app(settings_for(proxied.render_as_string(hide_password=False)))
    feed = app.state.stagewright.deletions
    try:
        with TestClient(app, raise_server_exceptions=False):
            assert wait_until(lambda: feed.live)
            proxy.silence()
            silenced_at = time.monotonic()
            assert wait_until(lambda: not feed.live, 5.0)
            # Trusted at most SILENT_AFTER_S after the last heartbeat it heard.
            assert time.monotonic() - silenced_at <= 1.5 + 0.5
            proxy.speak()
            assert wait_until(lambda: feed.live, 5.0)
    finally:
        proxy.down()


def test_a_shutdown_does_not_wait_out_the_listeners_heartbeat(database_url, monkeypatch):
    """The listener waits for notices in short slices and sees the stop between them: with
    a 30 s heartbeat a shutdown that waited for it would take up to 31 s (the join's bound)."""
    _postgres_only(database_url)
    monkeypatch.setattr(plan_deletions, "HEARTBEAT_S", 30.0)
    app = create_app(settings_for(database_url))
    feed = app.state.stagewright.deletions
    with TestClient(app, raise_server_exceptions=False):
        assert wait_until(lambda: feed.live)
        closing = time.monotonic()
    assert time.monotonic() - closing < 5.0
    assert not feed.live
