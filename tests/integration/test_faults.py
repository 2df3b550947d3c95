"""Faults: a server killed in the middle of a search, a clean stop, and a database that goes
away and comes back."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from api.app import create_app
from api.core.db import Database
from api.store.models import Job
from tests.integration.conftest import (
    PG_ADMIN_URL,
    assert_problem,
    example,
    migrate_with_profiles,
    plan_status,
    settings_for,
    wait_done,
    wait_until,
)
from tests.tcp_proxy import TcpProxy

# GPT-3 175B on 1,024 A100s, every schedule, refined with CP-SAT for 8 s: a search long
# enough to stop and kill a server in the middle of (the grid alone takes under a second).
SLOW = example("gpt3-175b-1024xa100")
SLOW["search"] = {**SLOW["search"], "method": "cpsat", "time_limit_s": 8.0}


def _job(url: str) -> Job:
    database = Database(url)
    try:
        with database.session() as session:
            job = session.scalar(select(Job))
            assert job is not None
            return job
    finally:
        database.dispose()


def _wait_running(http: httpx.Client, plan_id: str) -> None:
    started = wait_until(lambda: plan_status(http, plan_id) == "running", 30, 0.05)
    assert started, "the job never started"


def test_a_search_survives_a_clean_stop_and_a_crash(tmp_path, start_server):
    url = f"sqlite:///{tmp_path / 'fault.db'}"
    env = {"STAGEWRIGHT_JOB_POLL_S": "0.2"}

    first = start_server(url, env=env)
    with httpx.Client(base_url=first.url, timeout=30) as http:
        submitted = http.post("/v1/plans", params={"wait_s": 0}, json=SLOW)
        assert submitted.status_code == 202
        plan_id = submitted.json()["id"]
        _wait_running(http, plan_id)
    first.stop()  # SIGTERM: the job goes straight back to the queue, not counted
    job = _job(url)
    assert (job.status, job.attempts, job.claim) == ("queued", 0, None)

    second = start_server(url, env=env)
    with httpx.Client(base_url=second.url, timeout=30) as http:
        _wait_running(http, plan_id)
        time.sleep(0.5)  # well inside the search
    second.kill()  # SIGKILL: nothing runs on the way out
    assert _job(url).status == "running"

    third = start_server(url, env=env)
    with httpx.Client(base_url=third.url, timeout=30) as http:
        # The dead process's job is taken back at once (its pid is gone on this host).
        done = wait_done(http, plan_id, timeout_s=90)
        assert done["status"] == "done", done
        assert len(done["candidates"]) == 10 and done["stats"]["evaluated"] == 3168
        # One search, even after two interruptions: the request is answered from the store.
        again = http.post("/v1/plans", json=SLOW)
        assert again.status_code == 200 and again.json()["id"] == plan_id
    job = _job(url)
    assert job.status == "done" and job.attempts == 2


def test_missing_sqlite_database_is_503_until_it_is_there(tmp_path):
    folder = tmp_path / "volume"
    url = f"sqlite:///{folder / 'stagewright.db'}"
    app = create_app(settings_for(url))
    with TestClient(app, raise_server_exceptions=False) as client:
        for response in (
            client.get("/healthz"),
            client.get("/v1/plans"),
            client.get("/v1/hardware"),
            client.post("/v1/plans", json=example("tiny-cpu")),
        ):
            assert_problem(response, 503, "database is unreachable", "retry")
            assert response.headers["retry-after"] == "5"
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and "stagewright_database_up 0" in metrics.text
        # The volume is mounted and the database restored: no restart needed.
        folder.mkdir()
        migrate_with_profiles(url)
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/plans", json=example("tiny-cpu")).status_code == 201


@pytest.fixture
def postgres_via_proxy(postgres_schema):
    """A migrated schema reached through a proxy the test can cut."""
    schema = f"{postgres_schema}_fault_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    target = make_url(PG_ADMIN_URL)
    proxy = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.up()
    url = (
        target.set(host="127.0.0.1", port=proxy.port)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    migrate_with_profiles(url)
    try:
        yield url, proxy
    finally:
        proxy.down()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_postgres_outage_is_503_and_the_service_recovers(postgres_via_proxy):
    url, proxy = postgres_via_proxy
    app = create_app(settings_for(url))
    with TestClient(app, raise_server_exceptions=False) as client:
        created = client.post("/v1/plans", json=example("tiny-cpu"))
        assert created.status_code == 201
        location = created.headers["location"]

        proxy.down()
        started = time.monotonic()
        for response in (
            client.get("/healthz"),
            client.get(location),
            client.post("/v1/plans", json=example("tiny-cpu")),
            client.post("/v1/hardware", json={}),  # 422 needs no database
        ):
            if response.status_code != 422:
                body = assert_problem(response, 503, "database is unreachable")
                assert body["type"] == "urn:stagewright:problem:database-unavailable"
                assert "psycopg" not in response.text and "127.0.0.1" not in response.text
        assert time.monotonic() - started < 15  # refused at once, not a long hang
        assert "stagewright_database_up 0" in client.get("/metrics").text

        proxy.up()
        assert client.get("/healthz").status_code == 200
        assert client.get(location).json()["status"] == "done"
        again = client.post("/v1/plans", json=example("tiny-cpu"))
        assert again.status_code == 200 and again.headers["stagewright-cache"] == "hit"
