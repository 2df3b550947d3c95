"""The database cannot hang or break the service (issue 16, probe 5), on PostgreSQL.

- A database that stops answering in the middle of requests (a proxy the test controls
  keeps every connection open and forwards nothing: no error, no reset, only silence):
  every request that needs it answers a clean 503 problem with Retry-After within the
  configured bounds (a done plan cached here is still served, from memory),
  /healthz and /metrics within theirs, and the service is back by itself when the
  database answers again.
- Backends killed under load (pg_terminate_backend on every connection of the server,
  again and again, while clients read and write): every request gets a complete HTTP
  answer, 200 or a clean 503 (idempotent reads are retried once on a fresh connection);
  no connection is dropped without a response.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from api.app import create_app
from tests.integration.conftest import (
    PG_ADMIN_URL,
    assert_problem,
    example,
    migrate_with_profiles,
    schema_url,
    settings_for,
    wait_until,
)
from tests.integration.test_api_profiles import H200X
from tests.tcp_proxy import TcpProxy


def _fresh_schema() -> tuple[str, str]:
    schema = f"sw_rel_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    finally:
        admin.dispose()
    url = schema_url(schema)
    migrate_with_profiles(url)
    return schema, url


def _drop_schema(schema: str) -> None:
    admin = create_engine(PG_ADMIN_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture
def pg_schema(postgres_schema: str) -> Iterator[str]:
    """A migrated schema of its own on the test server (postgres_schema: skip if none)."""
    schema, url = _fresh_schema()
    try:
        yield url
    finally:
        _drop_schema(schema)


# Short bounds so that the test takes seconds; the defaults (statement 5 s, connection
# 10 s, request 15 s, health 1 s) are bounded the same way.
BOUNDS = {
    "db_statement_timeout_s": 1.0,
    "db_operation_timeout_s": 2.0,
    "request_timeout_s": 4.0,
    "health_timeout_s": 0.5,
}


def test_a_database_that_stops_answering_gives_clean_503s(pg_schema):
    target = make_url(PG_ADMIN_URL)
    proxy = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.up()
    url = make_url(pg_schema).set(host="127.0.0.1", port=proxy.port)
    app = create_app(settings_for(url.render_as_string(hide_password=False), **BOUNDS))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            created = client.post("/v1/plans", json=example("tiny-cpu"))
            assert created.status_code == 201, created.text
            location = created.headers["location"]
            assert client.get("/healthz").status_code == 200

            # Its JSON with the rejected configurations is not cached yet: read from the
            # database. The plain JSON is (the POST answered it).
            rejected = f"{location}?include_rejected=true"
            assert wait_until(lambda: app.state.stagewright.deletions.live)
            proxy.silence()
            # A done plan's cached answer needs no database while the feed of deletions
            # was heard from within SILENT_AFTER_S (api/services/plan_deletions.py).
            started = time.monotonic()
            cached = client.get(location)
            assert cached.status_code == 200 and cached.json()["status"] == "done"
            # Not after the watchdog cut a connection waiting on the silent database.
            assert time.monotonic() - started < BOUNDS["db_operation_timeout_s"]
            calls = {
                "read plan": lambda: client.get(rejected),
                "list hardware": lambda: client.get("/v1/hardware"),
                "write hardware": lambda: client.post("/v1/hardware", json=H200X),
                "plan": lambda: client.post("/v1/plans", json=example("tiny-cpu")),
                "list plans": lambda: client.get("/v1/plans"),
            }
            timed: dict[str, tuple[httpx.Response, float]] = {}

            def timed_call(name: str) -> None:
                started = time.monotonic()
                response = calls[name]()
                timed[name] = (response, time.monotonic() - started)

            with ThreadPoolExecutor(len(calls)) as pool:
                pending = [pool.submit(timed_call, name) for name in calls]
                # While those wait on a silent database, the probes answer within bounds.
                time.sleep(0.2)
                started = time.monotonic()
                health = client.get("/healthz")
                health_s = time.monotonic() - started
                started = time.monotonic()
                metrics = client.get("/metrics")
                metrics_s = time.monotonic() - started
                for future in pending:
                    future.result()
            assert_problem(health, 503, "database")
            assert health_s < BOUNDS["health_timeout_s"] + 2.0, health_s
            assert metrics.status_code == 200 and "stagewright_database_up 0" in metrics.text
            assert metrics_s < BOUNDS["health_timeout_s"] + 2.0, metrics_s
            for name, (response, seconds) in timed.items():
                assert response.status_code == 503, (name, response.text)
                assert response.headers["content-type"].startswith("application/problem+json")
                assert int(response.headers["retry-after"]) > 0, name
                assert "psycopg" not in response.text and "Traceback" not in response.text
                # The watchdog cuts a silent connection after db_operation_timeout_s (a read
                # may try once more on a fresh one); nothing waits past request_timeout_s.
                assert seconds < BOUNDS["request_timeout_s"] + 1.5, (name, seconds)

            proxy.speak()
            recovered = wait_until(lambda: client.get("/healthz").status_code == 200, 10, 0.1)
            assert recovered, "the service did not recover"
            assert client.get(location).json()["status"] == "done"
            again = client.post("/v1/plans", json=example("tiny-cpu"))
            assert again.status_code == 200 and again.headers["stagewright-cache"] == "hit"
    finally:
        proxy.down()


def _terminate_backends(application_name: str, stop: threading.Event) -> int:
    """pg_terminate_backend on every connection named ``application_name``, every 50 ms,
    until ``stop``; returns how many were killed."""
    admin = create_engine(PG_ADMIN_URL)
    killed = 0
    try:
        while not stop.is_set():
            with admin.begin() as conn:
                killed += len(
                    conn.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": application_name},
                    ).all()
                )
            stop.wait(0.05)
    finally:
        admin.dispose()
    return killed


def test_killed_backends_under_load_drop_no_connection(pg_schema, start_server, tmp_path):
    application_name = f"sw-rel-{uuid.uuid4().hex[:8]}"
    url = make_url(pg_schema).update_query_dict({"application_name": application_name})
    server = start_server(url.render_as_string(hide_password=False))
    with httpx.Client(base_url=server.url, timeout=60) as http:
        created = http.post("/v1/plans?wait_s=30", json=example("tiny-cpu"))
        assert created.status_code == 201, created.text
    location = created.headers["location"]

    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def client_loop(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    if n % 3 == 0:
                        body = dict(H200X, name=f"h-load-{i}", memory_gib=141 + n % 7)
                        response = http.post("/v1/hardware", json=body)
                    elif n % 3 == 1:
                        response = http.get(location)
                    else:
                        response = http.post("/v1/plans", json=example("tiny-cpu"))
                    outcome = str(response.status_code)
                    if response.status_code == 503:
                        assert response.headers.get("retry-after"), response.text
                        assert response.headers["content-type"].startswith(
                            "application/problem+json"
                        )
                except httpx.TransportError as exc:  # a connection closed without an answer
                    outcome = f"dropped: {type(exc).__name__}"
                with lock:
                    outcomes[outcome] += 1

    killer_result: list[int] = []
    killer = threading.Thread(
        target=lambda: killer_result.append(_terminate_backends(application_name, stop))
    )
    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(client_loop, i) for i in range(4)]
        killer.start()
        time.sleep(4)
        stop.set()
        for future in clients:
            future.result()
    killer.join()
    assert killer_result[0] > 0  # backends were killed while the clients worked
    dropped = {k: v for k, v in outcomes.items() if k.startswith("dropped")}
    assert not dropped, outcomes
    assert set(outcomes) <= {"200", "201", "503"}, outcomes
    assert outcomes["200"] + outcomes["201"] > 0, outcomes
    # The service is itself afterwards.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get(location).json()["status"] == "done"
    assert "Traceback" not in server.log_path.read_text()
