"""Done plans are answered from a per-process cache of their JSON, never after they are
gone: a plan deleted by another server process (here: straight in the database, as another
process's DELETE does it) is 404 here too, on SQLite and PostgreSQL (there as soon as the
deletion's notice arrives: test_plan_deletions.py)."""

from __future__ import annotations

import threading
from typing import Any

from api.core.db import Database
from api.store import crud
from planner.plan import plan as real_plan
from tests.integration.conftest import assert_problem, example, wait_done, wait_until


def test_a_cached_plan_deleted_by_another_process_is_404(make_client, database_url):
    client = make_client(planner=real_plan)
    state = client.app.state.stagewright
    if state.database.dialect == "postgresql":  # going live forgets what was cached before
        assert wait_until(lambda: state.deletions.live)
    created = client.post("/v1/plans", json=example("tiny-cpu"))
    assert created.status_code == 201
    location, plan_id = created.headers["location"], created.json()["id"]
    cache = client.app.state.stagewright.plans
    first = client.get(location)
    assert first.status_code == 200 and cache.get(plan_id, False) is not None
    again = client.get(location)
    assert again.content == first.content  # the cached bytes, the same document
    hit = client.post("/v1/plans", json=example("tiny-cpu"))
    assert hit.status_code == 200 and hit.headers["stagewright-cache"] == "hit"
    assert hit.json() == first.json()

    other = Database(database_url)  # another process's connection
    try:
        with other.session(write=True) as session:
            assert crud.delete_plan(session=session, plan_id=plan_id)
    finally:
        other.dispose()
    assert wait_until(lambda: client.get(location).status_code == 404, 2.0)
    assert_problem(client.get(location), 404, plan_id)
    assert cache.get(plan_id, False) is None
    # The same request is searched again: a new plan, not the deleted one from the cache.
    fresh = client.post("/v1/plans", json=example("tiny-cpu"))
    assert fresh.status_code == 201 and fresh.json()["id"] != plan_id


def test_only_done_plans_are_cached(make_client):
    release = threading.Event()

    def held(request: Any, store: Any) -> Any:
        release.wait(30)
        return real_plan(request, store)

    client = make_client(planner=held)
    response = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu"))
    assert response.status_code == 202
    plan_id = response.json()["id"]
    cache = client.app.state.stagewright.plans
    assert client.get(response.headers["location"]).json()["status"] in ("queued", "running")
    assert cache.get(plan_id, False) is None
    release.set()
    assert wait_done(client, plan_id)["status"] == "done"
    assert client.get(response.headers["location"]).json()["status"] == "done"
    assert cache.get(plan_id, False) is not None
