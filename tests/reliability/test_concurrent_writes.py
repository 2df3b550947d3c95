"""Concurrent writes lose nothing, on SQLite and PostgreSQL (issue 16, probe 4).

Twenty clients send at the same moment (a barrier releases them together); the service
runs their database work on its request threads, each on its own connection, so the
transactions really overlap. Expectations are counted by hand: twenty creates of one new
profile make one profile and twenty answers without an error; twenty different updates
raise its revision by twenty, and every answer reports a revision that was stored."""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from api.core.db import Database
from api.store.models import Job, PlanRecord
from planner.plan import plan as real_plan
from tests.integration.conftest import assert_problem, plan_status, tiny, wait_done, wait_until
from tests.integration.test_api_profiles import H200X, POINT

CLIENTS = 20


def _together(n: int, send: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """send(i) for i in 0..n-1 from n threads released at once."""
    barrier = threading.Barrier(n)

    def go(i: int) -> httpx.Response:
        barrier.wait()
        return send(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


def test_twenty_creates_of_one_new_profile_make_one(client):
    answers = _together(CLIENTS, lambda _: client.post("/v1/hardware", json=H200X))
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {201: 1, 200: CLIENTS - 1}, [a.text for a in answers if a.status_code >= 500]
    # The same body twenty times: one creation, nineteen "already so".
    assert {a.json()["revision"] for a in answers} == {1}
    assert client.get("/v1/hardware/h200x-test").json()["revision"] == 1


def test_twenty_different_updates_raise_the_revision_by_twenty(client):
    assert client.post("/v1/hardware", json=H200X).status_code == 201

    def update(i: int) -> httpx.Response:
        body = copy.deepcopy(H200X)
        body["inter_node"]["bandwidth_gbps"] = 60 + i  # each one a different profile
        return client.post("/v1/hardware", json=body)

    answers = _together(CLIENTS, update)
    assert [a.status_code for a in answers] == [200] * CLIENTS, [a.text for a in answers]
    revisions = sorted(a.json()["revision"] for a in answers)
    # Each write is one revision, each answer the revision its own write stored.
    assert revisions == list(range(2, 2 + CLIENTS))
    stored = client.get("/v1/hardware/h200x-test").json()
    assert stored["revision"] == 1 + CLIENTS
    # The answer that reported the last revision carries the profile that is stored.
    last = next(a.json() for a in answers if a.json()["revision"] == 1 + CLIENTS)
    assert last["inter_node"] == stored["inter_node"]


def test_twenty_layer_point_writes_raise_the_revision_by_twenty(client):
    before = client.get("/v1/hardware/cpu").json()["revision"]

    def write(i: int) -> httpx.Response:
        point = dict(POINT, forward_ms=3.0 + i / 100)  # the same shape, twenty values
        return client.post("/v1/profiles", json={"layers": [point]})

    answers = _together(CLIENTS, write)
    # The first write to land creates the point (201), the others replace it.
    assert Counter(a.status_code for a in answers) == {201: 1, 200: CLIENTS - 1}, [
        a.text for a in answers
    ]
    assert sorted(a.json()["created"] for a in answers) == [0] * (CLIENTS - 1) + [1]
    reported = sorted(a.json()["revisions"]["cpu"] for a in answers)
    assert reported == list(range(before + 1, before + 1 + CLIENTS))
    assert client.get("/v1/hardware/cpu").json()["revision"] == before + CLIENTS
    # One stored point of that shape (each write replaced it), with one of the values.
    layers = client.get("/v1/profiles", params={"gpu": "cpu", "limit": 1000}).json()["layers"]
    shape = [
        p for p in layers if p["hidden_size"] == 512 and p["seq_length"] == 128 and p["t"] == 1
    ]
    shape = [p for p in shape if p["micro_batch_size"] == 2 and p["precision"] == "fp32"]
    assert len(shape) == 1
    assert shape[0]["forward_ms"] in {3.0 + i / 100 for i in range(CLIENTS)}


def test_twenty_identical_plan_requests_start_one_search(make_client):
    searches: list[int] = []
    lock = threading.Lock()

    def counting(request: Any, store: Any) -> Any:
        with lock:
            searches.append(1)
        time.sleep(0.5)  # still searching when the others arrive
        return real_plan(request, store)

    client = make_client(planner=counting)
    answers = _together(CLIENTS, lambda _: client.post("/v1/plans", json=tiny()))
    assert all(a.status_code in (200, 201, 202) for a in answers), [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.headers["stagewright-cache"] == "miss" for a in answers) == 1
    assert wait_done(client, answers[0].json()["id"])["status"] == "done"
    assert len(searches) == 1
    assert client.get("/v1/plans").json()["total"] == 1


def test_the_queue_cap_is_exact(make_client, database_url):
    """Twenty different requests against a cap of five, while the only planner thread is
    held by a search that does not end: exactly five wait, the rest are 503."""
    release = threading.Event()

    def stuck(request: Any, store: Any) -> Any:
        release.wait(30)
        return real_plan(request, store)

    cap = 5
    client = make_client(planner=stuck, planner_threads=1, max_queued_jobs=cap)
    first = client.post("/v1/plans?wait_s=0", json=tiny(**{"training.global_batch_size": 4}))
    assert first.status_code == 202
    assert wait_until(lambda: plan_status(client, first.json()["id"]) == "running", 10, 0.05)
    try:
        answers = _together(
            CLIENTS,
            lambda i: client.post(
                "/v1/plans?wait_s=0", json=tiny(**{"training.global_batch_size": 8 * (i + 1)})
            ),
        )
        statuses = Counter(a.status_code for a in answers)
        assert statuses == {202: cap, 503: CLIENTS - cap}, statuses
        for refused in (a for a in answers if a.status_code == 503):
            assert_problem(refused, 503, f"{cap} searches are waiting")
            assert refused.headers["retry-after"]
        database = Database(database_url)
        try:
            with database.session() as session:
                queued = session.query(Job).filter(Job.status == "queued").count()
                plans = session.query(PlanRecord).count()
        finally:
            database.dispose()
        assert queued == cap and plans == 1 + cap
    finally:
        release.set()


@pytest.fixture(autouse=True)
def _backend_named(database_url):
    """Every test here runs once on SQLite and once on PostgreSQL (database_url's params)."""
    return database_url
