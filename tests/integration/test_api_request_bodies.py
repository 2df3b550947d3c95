"""Request bodies the service used to reinterpret without a word, each now a 422 problem that
says what to change, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.core.db import Database
from api.store.models import PlanRecord
from planner.plan import plan as real_plan
from tests.integration.conftest import assert_problem, example
from tests.integration.test_api_profiles import H200X, POINT
from tests.reliability.test_inputs import RUN

JSON = {"content-type": "application/json"}
SIMULATE = {
    "schedule": "1f1b",
    "num_devices": 2,
    "num_microbatches": 4,
    "forward": 1.0,
    "backward": 2.0,
}


def _post(client: TestClient, path: str, text: str) -> Any:
    return client.post(path, content=text.encode(), headers=JSON)


def _twice(text: str, given: str, again: str) -> str:
    """``text`` with ``again`` written right after its only ``given``: a key given twice."""
    assert text.count(given) == 1, given
    return text.replace(given, f"{given}, {again}")


# -- 1. a key given twice ---------------------------------------------------------------------


def test_a_plan_request_with_a_key_given_twice_is_refused_naming_it(client):
    text = _twice(
        json.dumps(example("tiny-cpu")), '"global_batch_size": 16', '"global_batch_size": 32'
    )
    body = assert_problem(
        _post(client, "/v1/plans", text),
        422,
        "body.training: global_batch_size is given twice; keep one",
    )
    assert body["type"] == "urn:stagewright:problem:validation-error"
    assert body["errors"] == [
        {
            "loc": ["body", "training"],
            "msg": "global_batch_size is given twice; keep one",
            "type": "duplicate_key",
        }
    ]
    assert client.get("/v1/plans").json()["total"] == 0  # nothing was planned


@pytest.mark.parametrize(
    ("path", "document", "given", "again", "message"),
    [
        (
            "/v1/simulate",
            SIMULATE,
            '"forward": 1.0',
            '"forward": 3.0',
            "body: forward is given twice; keep one",
        ),
        (
            "/v1/simulate/memory-sweep",
            {"num_devices": 4, "num_microbatches": 8, "forward": 1.0, "backward": 1.0},
            '"num_devices": 4',
            '"num_devices": 8',
            "body: num_devices is given twice; keep one",
        ),
        (
            "/v1/hardware",
            H200X,
            '"memory_gib": 141.0',
            '"memory_gib": 80.0',
            "body: memory_gib is given twice; keep one",
        ),
        (
            "/v1/hardware",
            H200X,
            '"latency_us": 3',
            '"latency_us": 30',
            "body.intra_node: latency_us is given twice; keep one",
        ),
        (
            "/v1/profiles",
            {"layers": [POINT]},
            '"forward_ms": 3.0',
            '"forward_ms": 30.0',
            "body.layers.0: forward_ms is given twice; keep one",
        ),
        (
            "/v1/measurements",
            {"runs": [RUN]},
            '"step_time_s": 12.5',
            '"step_time_s": 1.5',
            "body.runs.0.measured: step_time_s is given twice; keep one",
        ),
    ],
)
def test_every_body_with_a_key_given_twice_is_refused_naming_it(
    client, path, document, given, again, message
):
    stored = client.get("/v1/measurements").json()["total"]
    text = _twice(json.dumps(document), given, again)
    assert_problem(_post(client, path, text), 422, message)
    assert client.get("/v1/hardware/h200x-test").status_code == 404  # nothing stored
    assert client.get("/v1/measurements").json()["total"] == stored


def test_a_measurement_with_a_key_given_twice_is_refused(make_client):
    client = make_client(planner=real_plan)
    created = client.post("/v1/plans", json=example("tiny-cpu"))
    assert created.status_code == 201, created.text
    url = f"{created.headers['location']}/measurements"
    assert_problem(
        _post(client, url, '{"step_time_s": 1.0, "step_time_s": 2.0}'),
        422,
        "body: step_time_s is given twice; keep one",
    )
    assert client.get(url).json() == []


def test_a_body_nested_too_deep_is_a_400_saying_so(client):
    text = '{"runs": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert_problem(_post(client, "/v1/measurements", text), 400, "too deep")


def test_a_body_without_repeats_is_read_as_before(client):
    response = client.post("/v1/simulate", json=SIMULATE)
    assert response.status_code == 200, response.text
    assert response.json()["makespan"] == 15.0


# -- 2. true and false where a number belongs -----------------------------------------------


@pytest.mark.parametrize(
    ("path", "document", "message"),
    [
        (
            "/v1/plans",
            {**example("tiny-cpu"), "model": {**example("tiny-cpu")["model"], "num_layers": True}},
            "body.model.num_layers: a number is needed, not true",
        ),
        (
            "/v1/plans",
            {**example("tiny-cpu"), "search": {"micro_batch_sizes": [1, False]}},
            "body.search.micro_batch_sizes: a number is needed, not false (entry 1)",
        ),
        (
            "/v1/simulate",
            {**SIMULATE, "num_devices": True},
            "body.num_devices: a number is needed, not true",
        ),
        (
            "/v1/simulate",
            {**SIMULATE, "forward": [1.0, True]},
            "body.forward: a number is needed, not true (entry 1)",
        ),
        ("/v1/hardware", {**H200X, "memory_gib": True}, "body.memory_gib: a number is needed"),
        (
            "/v1/profiles",
            {"layers": [{**POINT, "micro_batch_size": True}]},
            "body.layers.0.micro_batch_size: a number is needed, not true",
        ),
        (
            "/v1/measurements",
            {"runs": [{**RUN, "config": {**RUN["config"], "t": True}}]},
            "body.runs.0.config.t: a number is needed, not true",
        ),
    ],
)
def test_a_boolean_for_a_number_is_refused_naming_the_field(client, path, document, message):
    assert_problem(client.post(path, json=document), 422, message)


# -- 3. search.time_limit_s with the grid ---------------------------------------------------


def test_a_time_limit_with_the_grid_is_refused_saying_what_to_change(client):
    body = {**example("tiny-cpu")}
    body["search"] = {**body["search"], "time_limit_s": 60}
    problem = assert_problem(
        client.post("/v1/plans", json=body),
        422,
        "body.search: time_limit_s 60 is the time budget of the CP-SAT refinement, which "
        "method grid does not run; set search.method to cpsat",
    )
    assert problem["errors"][0]["loc"] == ["body", "search"]
    assert client.get("/v1/plans").json()["total"] == 0


def test_requests_the_service_echoes_are_accepted_again(make_client):
    client = make_client(planner=real_plan, max_cpsat_time_s=3)
    first = client.post("/v1/plans", json=example("tiny-cpu"))
    assert first.status_code == 201, first.text
    echoed = first.json()["request"]
    assert echoed["search"]["method"] == "grid" and echoed["search"]["time_limit_s"] == 10.0
    again = client.post("/v1/plans", json=echoed)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    # A CP-SAT request over the server's cap is echoed with the cap; posted again, it plans.
    cpsat = example("tiny-cpu")
    cpsat["search"] = {**cpsat["search"], "schedules": ["1f1b"], "method": "cpsat"}
    cpsat["search"]["time_limit_s"] = 300
    lowered = client.post("/v1/plans", json=cpsat)
    assert lowered.status_code == 201, lowered.text
    assert lowered.json()["request"]["search"]["time_limit_s"] == 3.0
    posted = client.post("/v1/plans", json=lowered.json()["request"])
    assert posted.status_code in (200, 201), posted.text


def test_a_plan_stored_with_a_time_limit_and_the_grid_still_serves(make_client, database_url):
    """Plans stored before the check (the service accepted such requests) keep their launch
    artefacts, timelines and inspection."""
    client = make_client(planner=real_plan)
    created = client.post("/v1/plans", json=example("tiny-cpu"))
    assert created.status_code == 201, created.text
    plan_id = created.json()["id"]
    database = Database(database_url)
    try:
        with database.session() as session:
            record = session.get(PlanRecord, plan_id)
            assert record is not None and record.result is not None
            result = json.loads(json.dumps(record.result))
            result["request"]["search"]["time_limit_s"] = 60.0
            record.result = result
            session.commit()
    finally:
        database.dispose()
    fresh = make_client(planner=real_plan)  # no cached answers
    launch = fresh.get(f"/v1/plans/{plan_id}/candidates/0/launch")
    assert launch.status_code == 200, launch.text
    assert fresh.get(f"/v1/plans/{plan_id}/launch.tar.gz").status_code == 200
    timeline = fresh.get(f"/v1/plans/{plan_id}/timeline")
    assert timeline.status_code == 200, timeline.text
    shown = fresh.get(f"/v1/plans/{plan_id}")
    assert shown.status_code == 200 and shown.json()["request"]["search"]["time_limit_s"] == 60


# -- 4. NaN and Infinity --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_time_limit_is_refused_as_not_finite(client, value):
    data = example("tiny-cpu")
    data["search"] = {**data["search"], "method": "cpsat", "time_limit_s": "@"}
    text = json.dumps(data).replace('"@"', value)
    problem = assert_problem(
        _post(client, "/v1/plans", text),
        422,
        "body.search.time_limit_s: Input should be a finite number",
    )
    assert "less than" not in problem["detail"] and "greater than" not in problem["detail"]
    assert client.get("/v1/plans").json()["total"] == 0
