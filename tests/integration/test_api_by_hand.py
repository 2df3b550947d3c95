"""Requests as people and scripts write them by hand (`curl -d @file` without a JSON
Content-Type, a query parameter given twice, HEAD from a load balancer, NaN typed into a
query): each either answered as it means or refused with a problem that says what to
change, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, Query
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from api.app import create_app
from api.core.config import Settings
from api.query_parameters import no_unknown_query_parameters
from api.services import measured_runs
from planner.plan import plan as real_plan
from tests.integration.conftest import assert_problem, example
from tests.integration.test_api_profiles import H200X, POINT
from tests.integration.test_api_request_bodies import SIMULATE
from tests.integration.test_measured_runs import RUN as MEASURED_RUN
from tests.reliability.test_inputs import RUN

BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/plans", example("tiny-cpu")),
    ("/v1/simulate", SIMULATE),
    (
        "/v1/simulate/memory-sweep",
        {"num_devices": 4, "num_microbatches": 4, "forward": 1.0, "backward": 1.0},
    ),
    ("/v1/hardware", H200X),
    ("/v1/profiles", {"layers": [POINT]}),
    ("/v1/measurements", {"runs": [RUN]}),
]


# -- a JSON body sent as something else ------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"],
)
@pytest.mark.parametrize(("path", "body"), BODIES, ids=[p for p, _ in BODIES])
def test_a_json_body_sent_as_another_media_type_is_415_saying_which_header(
    client, database_url, path, body, content_type
):
    """`curl -d @request.json URL` sends application/x-www-form-urlencoded: the JSON was
    answered 'Input should be a valid dictionary or object to extract fields from'."""
    response = client.post(path, content=json.dumps(body), headers={"content-type": content_type})
    problem = assert_problem(
        response, 415, content_type.split(";")[0], "Content-Type: application/json"
    )
    assert problem["type"] == "urn:stagewright:problem:unsupported-media-type"
    assert client.get("/v1/plans").json()["total"] == 0


def test_a_json_body_without_a_content_type_is_415_saying_which_header(client):
    """FastAPI reads a body without a Content-Type as bytes, not JSON: it was answered
    'Input should be a valid dictionary or object to extract fields from' too."""
    response = client.post("/v1/simulate", content=json.dumps(SIMULATE))
    assert_problem(response, 415, "without a Content-Type", "Content-Type: application/json")


def test_json_media_types_are_read_as_json(client):
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = client.post(
            "/v1/simulate", content=json.dumps(SIMULATE), headers={"content-type": content_type}
        )
        assert response.status_code == 200, (content_type, response.text)
    # An empty body keeps its own answer, whatever it is labelled.
    empty = client.post("/v1/simulate", content=b"", headers={"content-type": "text/plain"})
    assert_problem(empty, 400, "the request body is empty")


@pytest.mark.parametrize(("path", "body"), BODIES, ids=[p for p, _ in BODIES])
def test_a_write_without_a_body_says_the_body_is_empty_and_what_to_send(client, path, body):
    """`curl -X POST URL` without -d read as 'not valid JSON (EOF while parsing a value at
    line 1 column 0)'."""
    for headers in ({}, {"content-type": "application/json"}):
        problem = assert_problem(
            client.post(path, content=b"", headers=headers),
            400,
            "the request body is empty; send a JSON object (",
            ", described at /docs) with Content-Type: application/json",
        )
        assert problem["type"] == "urn:stagewright:problem:empty-body"
        assert "EOF" not in problem["detail"]
    assert client.get("/v1/plans").json()["total"] == 0


def test_the_openapi_document_lists_415_on_every_write():
    document = create_app(Settings(database_url="sqlite://")).openapi()
    for path, _ in BODIES:
        assert "415" in document["paths"][path]["post"]["responses"], path
    assert "415" in document["paths"]["/v1/plans/{plan_id}/measurements"]["post"]["responses"]


# -- a query parameter given twice -------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/v1/plans?status=done&status=failed", "status"),
        ("/v1/plans?limit=1&limit=50", "limit"),
        ("/v1/measurements?gpu=cpu&gpu=a100-sxm-80g", "gpu"),
        ("/v1/profiles?offset=0&offset=10", "offset"),
    ],
)
def test_a_query_parameter_given_twice_is_refused_naming_it(client, url, name):
    """The last of the two was used and the first dropped without a word."""
    body = assert_problem(client.get(url), 422, f"query parameter {name!r} is given 2 times")
    assert body["errors"] == [
        {
            "loc": ["query", name],
            "msg": f"query parameter {name!r} is given 2 times; give it once",
            "type": "repeated_query_parameter",
        }
    ]


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/v1/measurements?source=", "source"),  # listed every run
        ("/v1/measurements?model=", "model"),  # listed none
        ("/v1/measurements?gpu=", "gpu"),  # "hardware names are lower-case letters, ..."
        ("/v1/plans?model=", "model"),  # listed none
        ("/v1/plans?gpu=&limit=5", "gpu"),
        ("/v1/plans?status=", "status"),
        ("/v1/profiles?gpu=", "gpu"),
        ("/v1/plans?limit=", "limit"),
    ],
)
def test_an_empty_query_parameter_is_refused_saying_to_leave_it_out(client, url, name):
    """An empty filter meant three things: every run (source), nothing (model), a broken
    name rule (gpu)."""
    assert client.post("/v1/measurements", json={"runs": [MEASURED_RUN]}).status_code == 201
    body = assert_problem(client.get(url), 422, f"query parameter {name!r} is empty")
    assert body["errors"] == [
        {
            "loc": ["query", name],
            "msg": f"query parameter {name!r} is empty; give it a value, or leave the "
            "parameter out",
            "type": "empty_query_parameter",
        }
    ]
    assert client.get(url.replace(f"{name}=", "other=")).status_code == 422  # unknown
    assert client.get(url.split("?")[0]).status_code == 200


def test_a_plan_post_with_a_repeated_wait_is_refused_before_any_search(make_client):
    client = make_client(planner=real_plan)
    refused = client.post("/v1/plans?wait_s=0&wait_s=20", json=example("tiny-cpu"))
    assert_problem(refused, 422, "'wait_s' is given 2 times")
    assert client.get("/v1/plans").json()["total"] == 0


def test_a_list_query_parameter_may_still_be_given_several_times():
    """The refusal is for parameters that take one value: a route that declares a list
    (none of the API's does today) reads every value, so repeating it is how to give it."""
    app = FastAPI(dependencies=[Depends(no_unknown_query_parameters)])

    @app.get("/tags")
    def tags(tag: Annotated[list[str] | None, Query()] = None, limit: int = 5) -> dict[str, Any]:
        return {"tag": tag, "limit": limit}

    with TestClient(app) as local:
        assert local.get("/tags?tag=a&tag=b").json() == {"tag": ["a", "b"], "limit": 5}
        assert local.get("/tags?limit=1&limit=2").status_code == 422


# -- HEAD ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/healthz", "/metrics", "/v1/plans", "/v1/hardware/cpu", "/v1/schedules", "/"]
)
def test_head_answers_as_get_without_a_body(client, path):
    """HEAD, which load balancers and uptime checks send, was 405 on every endpoint (even
    /healthz) though HTTP requires it wherever GET is served."""
    got = client.get(path)
    head = client.head(path)
    assert head.status_code == got.status_code == 200, head.text
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_is_counted_under_its_route(client):
    client.head("/v1/hardware/cpu")
    text = client.get("/metrics").text
    line = (
        'stagewright_http_requests_total{method="HEAD",route="/v1/hardware/{name}",status="200"} 1'
    )
    assert line in text


def test_head_of_a_missing_plan_is_404_and_head_of_a_write_only_route_is_405(client):
    missing = client.head(f"/v1/plans/{'a' * 32}")
    assert missing.status_code == 404 and missing.content == b""
    refused = client.head("/v1/simulate")
    assert refused.status_code == 405 and refused.content == b""
    assert refused.headers["allow"] == "POST"
    # A GET route's 405 lists HEAD beside GET.
    listed = client.put("/v1/hardware/cpu")
    body = assert_problem(listed, 405, "PUT is not allowed", "GET, HEAD")
    assert listed.headers["allow"] == "GET, HEAD" and body["status"] == 405


def test_head_needs_the_read_scope_like_get(make_client):
    client = make_client(api_tokens="ci:write:w; dash:read:r")
    assert client.head("/v1/plans").status_code == 401
    assert client.head("/v1/plans", headers={"Authorization": "Bearer r"}).status_code == 200


# -- numbers in the query ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
@pytest.mark.parametrize(
    "url",
    [
        "/v1/plans/{plan}/timeline?start_s={value}",
        "/v1/plans/{plan}/timeline?end_s={value}",
    ],
)
def test_a_non_finite_number_in_the_query_is_refused_as_not_finite(client, url, value):
    """?start_s=nan was refused as 'Input should be less than or equal to 1000000000'."""
    plan = "a" * 32
    response = client.get(url.format(plan=plan, value=value))
    assert_problem(response, 422, "finite number")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_wait_is_refused_as_not_finite(make_client, value):
    client = make_client(planner=real_plan)
    response = client.post(f"/v1/plans?wait_s={value}", json=example("tiny-cpu"))
    assert_problem(response, 422, "query.wait_s", "finite number")
    assert client.get("/v1/plans").json()["total"] == 0


# -- names and text -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "body", "where"),
    [
        ("GET", "/v1/plans?gpu=A100", None, "query.gpu"),
        ("GET", "/v1/profiles?gpu=CPU", None, "query.gpu"),
        ("GET", "/v1/measurements?gpu=a100%20sxm", None, "query.gpu"),
        ("POST", "/v1/hardware", dict(H200X, name="H200X"), "body.name"),
        ("POST", "/v1/profiles", {"layers": [dict(POINT, gpu="CPU")]}, "body.layers.0.gpu"),
    ],
)
def test_a_hardware_name_out_of_its_rule_says_the_rule(client, method, url, body, where):
    """These said "String should match pattern '^[a-z0-9][a-z0-9._-]{0,63}$'", where a
    plan request's cluster.gpu says what names are made of."""
    response = client.request(method, url, json=body)
    problem = assert_problem(response, 422, f"{where}: hardware names are lower-case letters")
    assert "pattern" not in problem["detail"] and "GET /v1/hardware lists them" in problem["detail"]


@pytest.mark.parametrize("name", ["model", "source"])
def test_a_nul_in_a_measurements_filter_is_refused_alike_on_every_backend(client, name):
    """?model=a%00b listed nothing on SQLite and was a 422 'the database cannot store a
    value of this request' on PostgreSQL, for a read."""
    response = client.get(f"/v1/measurements?{name}=a%00b")
    assert_problem(response, 422, f"query.{name}: a NUL character", "leave it out")
    assert_problem(client.get("/v1/plans?model=a%00b"), 422, "query.model: a NUL character")


def _with_nul(body: dict[str, Any], path: str) -> dict[str, Any]:
    """A deep copy of ``body`` with "a\x00b" at ``path`` (dotted; numbers index lists)."""
    out: Any = json.loads(json.dumps(body))
    *parents, leaf = path.split(".")
    target = out
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[leaf] = "a\x00b"
    return out


_LINK = {"gpu": "cpu", "scope": "intra_node", "kind": "shm", "bandwidth_gbps": 10}
_LINK |= {"latency_us": 1, "source": "test"}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/plans", example("tiny-cpu"), "model.name"),
        ("/v1/measurements", {"runs": [RUN]}, "runs.0.model.name"),
        ("/v1/measurements", {"runs": [RUN]}, "runs.0.source"),
        ("/v1/hardware", H200X, "description"),
        ("/v1/hardware", H200X, "source"),
        ("/v1/hardware", H200X, "intra_node.kind"),
        ("/v1/profiles", {"layers": [POINT]}, "layers.0.source"),
        ("/v1/profiles", {"links": [_LINK]}, "links.0.kind"),
        ("/v1/profiles", {"links": [_LINK]}, "links.0.source"),
    ],
)
def test_a_nul_in_any_free_text_of_a_body_is_refused_alike(client, path, body, field):
    """A model name holding a NUL was stored (201): the plan's listing showed it without
    the NUL (the store strips it) while its request kept it, and ?model= refuses a NUL, so
    the plan could not be found by its name. Every text a body carries into the store is
    refused as hardware descriptions and run sources were."""
    response = client.post(path, json=_with_nul(body, field))
    assert_problem(response, 422, f"body.{field}: a NUL character (\\u0000) cannot be stored")
    assert client.get("/v1/plans").json()["total"] == 0


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"k\x00": "v"}, "data has a key 'k\\x00'"),
        ({"k": "v\x00"}, "data['k']"),
        ({"k": [{"deep": ["x", "a\x00"]}]}, "data['k'][0]['deep'][1]"),
    ],
)
def test_a_nul_in_a_plan_measurements_data_is_refused(client, data, where):
    """{"data": {"k\u0000": "v\u0000"}} was stored (201) on SQLite and PostgreSQL."""
    plan = client.post("/v1/plans", json=example("tiny-cpu"))
    assert plan.status_code == 201, plan.text
    url = f"/v1/plans/{plan.json()['id']}/measurements"
    response = client.post(url, json={"step_time_s": 0.4, "data": data})
    assert_problem(response, 422, f"body.data: {where}", "a NUL character (\\u0000)")
    assert client.get(url).json() == []
    fine = client.post(url, json={"step_time_s": 0.4, "data": {"k": "v"}})
    assert fine.status_code == 201, fine.text


# -- a database that cannot write --------------------------------------------------------


@pytest.mark.parametrize(
    "reason, fix",
    [
        ("database or disk is full", "check the free space (and quotas) of its file system"),
        ("disk I/O error", "check the free space (and quotas) of its file system"),
        ("attempt to write a readonly database", "check that this user may write the database"),
    ],
)
def test_a_database_that_cannot_write_says_what_the_operator_must_fix(
    client, monkeypatch, reason, fix
):
    """A full disk used to be answered "the database is unreachable or not ready; retry in
    a few seconds", which no retry mends: the 503 stays (the client may retry later), and
    says that the write failed and what the operator must fix."""

    def no_room(*_args: Any, **_kwargs: Any) -> None:
        raise OperationalError(
            "INSERT INTO measured_runs ...", {}, sqlite3.OperationalError(reason)
        )

    monkeypatch.setattr(measured_runs, "add_measured_runs", no_room)
    response = client.post("/v1/measurements", json={"runs": [MEASURED_RUN]})
    body = assert_problem(response, 503, "could not write", fix)
    assert body["type"].endswith("database-unavailable") and "unreachable" not in body["detail"]
    assert response.headers["Retry-After"]


# -- a trailing slash, a pasted-over id ------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "meant"),
    [
        ("GET", "/v1/plans/", "/v1/plans"),
        ("POST", "/v1/plans/", "/v1/plans"),
        ("GET", "/v1/hardware/cpu/", "/v1/hardware/cpu"),
        ("GET", "/healthz/", "/healthz"),
    ],
)
def test_a_trailing_slash_is_404_naming_the_path_without_it(client, method, path, meant):
    """It was a 307 to the path without the slash: curl printed nothing (it does not follow
    redirects unless told), and behind a TLS-terminating proxy the Location named the
    proxy's inner http:// address. Nothing is created by the refused POST."""
    response = client.request(method, path, json=example("tiny-cpu") if method == "POST" else None)
    assert_problem(response, 404, f"the path has no trailing slash: {meant}")
    assert "location" not in response.headers
    assert client.get("/v1/plans").json()["total"] == 0


def test_an_unknown_path_with_a_trailing_slash_points_to_the_docs(client):
    assert_problem(client.get("/v1/nothing/"), 404, "'/v1/nothing/'", "described at /docs")


@pytest.mark.parametrize(
    ("path", "slug"),
    [("/v1/plans/", "plan-not-found"), ("/v1/hardware/", "hardware-not-found")],
)
def test_a_long_id_is_echoed_once_in_full(client, path, slug):
    """A 5,000-character id came back whole in the detail and again in ``instance``."""
    pasted = "f" * 5000
    body = assert_problem(client.get(path + pasted), 404, "(5000 characters)")
    assert body["type"] == f"urn:stagewright:problem:{slug}"
    assert body["instance"] == path + pasted
    assert len(body["detail"]) < 300
