"""A 422 is as small as the mistake is simple, however large the body: the problem lists the
first 20 invalid fields and counts the others, cuts a long value or key it echoes, a list
stops at its first invalid entry, and a list or object over its limit is refused before its
entries are checked (a body of 30,000 empty entries was a 20 MB answer naming 210,000
errors), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from api.problems import ERRORS_LISTED
from tests.integration.conftest import assert_problem, example
from tests.integration.test_api_profiles import H200X
from tests.integration.test_api_request_bodies import SIMULATE
from tests.integration.test_measured_runs import RUN


def _with(section: str, **fields: Any) -> dict[str, Any]:
    """The tiny CPU request with ``fields`` added to ``section``."""
    request = example("tiny-cpu")
    request[section] = {**request.get(section, {}), **fields}
    return request


# -- the problem document is bounded ----------------------------------------------------------


def test_many_invalid_fields_list_the_first_twenty_and_count_the_rest(client):
    unknown = {f"typo_{i}": 1 for i in range(500)}
    response = client.post("/v1/plans", json=_with("model", **unknown))
    problem = assert_problem(
        response, 422, "body.model.typo_0", "(and 495 more; errors lists the first 20)"
    )
    assert problem["type"] == "urn:stagewright:problem:validation-error"
    assert len(problem["errors"]) == ERRORS_LISTED == 20
    assert problem["errors"][0]["loc"] == ["body", "model", "typo_0"]
    assert problem["errors_not_listed"] == 480
    assert len(response.content) < 5_000  # was 50 kB: one entry per key


def test_many_unknown_query_parameters_list_the_first_twenty(client):
    """3,000 unknown query parameters answered 460 kB, each naming what the endpoint takes."""
    query = "&".join(f"p{i:04d}=1" for i in range(3000))
    response = client.get(f"/v1/plans?{query}")
    problem = assert_problem(response, 422, "unknown query parameter 'p0000'", "(and 2995 more;")
    assert [error["loc"] for error in problem["errors"]] == [
        ["query", f"p{i:04d}"] for i in range(20)
    ]
    assert problem["errors_not_listed"] == 2980
    assert len(response.content) < 6_000


def test_a_few_invalid_fields_are_all_listed_and_nothing_is_counted(client):
    response = client.post("/v1/plans", json=_with("model", typo_a=1, typo_b=2))
    problem = assert_problem(response, 422, "typo_a", "typo_b")
    assert [error["loc"][-1] for error in problem["errors"]] == ["typo_a", "typo_b"]
    assert "errors_not_listed" not in problem


def test_a_long_refused_value_is_cut_where_the_answer_echoes_it(client):
    name = "x" * 500_000
    response = client.post("/v1/plans", json=_with("search", schedules=[name]))
    problem = assert_problem(response, 422, "unknown schedule", "(500000 characters)")
    (error,) = problem["errors"]
    assert error["loc"] == ["body", "search", "schedules", 0]
    assert "(500000 characters)" in error["msg"] and "choose one of" in error["msg"]
    assert len(response.content) < 5_000  # was 1 MB: the name twice


def test_a_long_unknown_key_is_cut_in_the_location(client):
    key = "k" * 500_000
    response = client.post("/v1/plans", json=_with("model", **{key: 1}))
    problem = assert_problem(response, 422, "(500000 characters)")
    (error,) = problem["errors"]
    assert error["loc"][:2] == ["body", "model"]
    assert error["loc"][2] == "k" * 64 + "... (500000 characters)"
    assert len(response.content) < 5_000


# -- a list stops at its first invalid entry, an object over its size before its entries -----


def _locations(problem: dict[str, Any]) -> list[list[Any]]:
    return [error["loc"] for error in problem["errors"]]


def test_a_list_of_invalid_layer_points_is_checked_up_to_the_first(client):
    response = client.post("/v1/profiles", json={"layers": [{}] * 50})
    problem = assert_problem(response, 422, "body.layers.0.gpu: Field required")
    assert {tuple(loc[:3]) for loc in _locations(problem)} == {("body", "layers", 0)}
    assert "errors_not_listed" not in problem  # was 350 errors: 7 per point


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("micro_batch_sizes", ["a", "b", 2]),
        ("context_parallel", ["a", "b"]),
        ("num_chunks", ["a", "b"]),
        ("recompute", ["sometimes", "never"]),
        ("schedules", ["1f1b", "zero-bubble", "pipedream"]),
    ],
)
def test_a_search_list_is_checked_up_to_its_first_invalid_entry(client, field, values):
    response = client.post("/v1/plans", json=_with("search", **{field: values}))
    problem = assert_problem(response, 422, f"body.search.{field}.")
    (error,) = problem["errors"]
    assert error["loc"][:3] == ["body", "search", field]


def test_a_measured_runs_list_of_stages_is_checked_up_to_its_first_invalid_entry(client):
    run = {**RUN, "config": {**RUN["config"], "layers_per_stage": ["a"] * 500}}
    problem = assert_problem(client.post("/v1/measurements", json={"runs": [run]}), 422)
    stages = [loc for loc in _locations(problem) if "layers_per_stage" in loc]
    assert stages == [["body", "runs", 0, "config", "layers_per_stage", 0]]


def test_a_plan_measurement_is_checked_up_to_its_first_invalid_peak(client):
    body = {"step_time_s": 1.0, "peak_activation_bytes": ["a"] * 1000}
    problem = assert_problem(client.post("/v1/plans/any/measurements", json=body), 422)
    assert _locations(problem) == [["body", "peak_activation_bytes", 0]]


@pytest.mark.parametrize(
    ("field", "entries", "limit"),
    [
        ("peak_flops", {f"fp{i}": 1.0e15 for i in range(1000)}, 3),
        ("parameters", {f"p{i}": "high" for i in range(1000)}, 256),
    ],
)
def test_a_hardware_object_over_its_size_is_refused_before_its_entries(
    client, field, entries, limit
):
    response = client.post("/v1/hardware", json={**H200X, field: entries})
    problem = assert_problem(response, 422, f"body.{field}: Dictionary should have at most")
    (error,) = problem["errors"]  # was 1,000 entries: one per made-up key or value
    assert error["loc"] == ["body", field]
    assert error["msg"] == f"Dictionary should have at most {limit} items, not 1000"


# -- a list over its server's limit is refused before its entries are checked -----------------


@pytest.mark.parametrize("length", [17, 150_000])
def test_micro_batch_sizes_over_the_limit_are_refused_before_their_entries(client, length):
    """The 16-entry limit was checked after every entry: 150,000 strings answered 17.9 MB
    of 'Input should be a valid integer' and never said the list was too long."""
    response = client.post("/v1/plans", json=_with("search", micro_batch_sizes=["a"] * length))
    problem = assert_problem(
        response,
        422,
        f"search.micro_batch_sizes: {length} sizes is above this server's limit of 16 entries",
        f"STAGEWRIGHT_MAX_LIST_ITEMS={length} ",
    )
    assert problem["type"] == "urn:stagewright:problem:limit-exceeded"
    assert [error["type"] for error in problem["errors"]] == ["limit"]


def test_chunk_counts_over_the_limit_are_refused_before_their_entries(make_client):
    client = make_client(max_list_items=3)
    request = _with("search", schedules=["interleaved"], num_chunks=["two"] * 4)
    problem = assert_problem(
        client.post("/v1/plans", json=request), 422, "4 chunk counts", "limit of 3 entries"
    )
    assert problem["type"] == "urn:stagewright:problem:limit-exceeded"


def test_layer_points_over_the_limit_are_refused_before_their_entries(make_client):
    client = make_client(max_profile_points=2)
    response = client.post("/v1/profiles", json={"layers": [{}] * 3})
    problem = assert_problem(
        response,
        422,
        "3 layer points is above this server's limit of 2 per request",
        "STAGEWRIGHT_MAX_PROFILE_POINTS=3 ",
    )
    assert [error["loc"] for error in problem["errors"]] == [["body", "layers"]]
    document = client.get("/openapi.json").json()["components"]["schemas"]
    layers = document.get("ProfilesIn-Input", document.get("ProfilesIn"))["properties"]["layers"]
    assert layers["maxItems"] == 2


def test_measured_runs_are_checked_up_to_the_first_invalid_run(client):
    """A thousand runs of empty sections were 18,000 errors from a 76 kB body."""
    empty = {"model": {}, "cluster": {}, "training": {}, "config": {}, "measured": {}}
    response = client.post("/v1/measurements", json={"runs": [RUN, empty, empty, RUN, empty]})
    problem = assert_problem(response, 422, "body.runs.1.model.name: Field required")
    assert {tuple(loc[:3]) for loc in _locations(problem)} == {("body", "runs", 1)}


def test_a_list_of_stage_times_over_its_limit_is_refused_unread(client):
    """Each time was looked at before the 4,096-entry limit: a list of 100,000 (and a true
    at its end) took a tenth of a second on the event loop to be called 'not a number'."""
    forward = [1.0] * 100_000 + [True]
    response = client.post("/v1/simulate", json={**SIMULATE, "forward": forward})
    problem = assert_problem(response, 422, "at most 4096 items")
    assert "not true" not in problem["detail"]
