"""A server process keeps its PostgreSQL connections open: one per thread that may use the
database, so a busy service does not open and close connections (a backend fork each) in
its stride."""

from __future__ import annotations

import threading

from sqlalchemy import event, text

from api.app import create_app
from api.core.db import Database
from tests.integration.conftest import schema_url, settings_for


def _connections_opened(database: Database, threads: int, rounds: int) -> int:
    """``rounds`` times, every one of ``threads`` threads holds a session at once and then
    all return them (bursts, as requests come); the connections the pool opened meanwhile."""
    opened = 0
    lock = threading.Lock()

    @event.listens_for(database.engine, "connect")
    def _count(*_: object) -> None:
        nonlocal opened
        with lock:
            opened += 1

    together = threading.Barrier(threads)

    def work() -> None:
        for _ in range(rounds):
            with database.session() as session:
                session.execute(text("SELECT 1"))
                together.wait()  # all hold one now
            together.wait()  # all returned theirs

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return opened


def test_as_many_threads_as_connections_reuse_them(postgres_schema):
    database = Database(schema_url(postgres_schema), connections=12)
    try:
        # Before, a pool of 5 (and 10 more when busy) closed the 7 connections opened past
        # it each time they were returned: 5 + 7 x 10 = 75 opened here.
        assert _connections_opened(database, threads=12, rounds=10) == 12
    finally:
        database.dispose()


def test_the_service_sizes_its_pool_to_the_threads_that_use_it(postgres_schema):
    settings = settings_for(schema_url(postgres_schema), request_threads=9, planner_threads=3)
    app = create_app(settings)
    try:
        # 9 request threads, 3 planner threads, the job poller and the health probe.
        assert app.state.stagewright.database.engine.pool.size() == 9 + 3 + 2
    finally:
        app.state.stagewright.health.close()
        app.state.stagewright.database.dispose()
