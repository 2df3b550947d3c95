"""/v1/simulate, /healthz, /metrics, /docs, unknown routes and methods, and write
authentication, over HTTP."""

from __future__ import annotations

import pytest

from planner.memory_sweep import memory_sweep
from planner.schedules import SCHEDULE_NAMES, PassTimes, generate, schedule_family
from planner.simulate import Durations, simulate
from tests.integration.conftest import assert_problem, example

CONTRACT_PATHS = {
    ("post", "/v1/plans"),
    ("get", "/v1/plans"),
    ("get", "/v1/plans/{plan_id}"),
    ("post", "/v1/simulate"),
    ("get", "/v1/hardware"),
    ("post", "/v1/hardware"),
    ("get", "/v1/profiles"),
    ("post", "/v1/profiles"),
    ("post", "/v1/plans/{plan_id}/measurements"),
    ("get", "/v1/schedules"),
    ("get", "/healthz"),
    ("get", "/metrics"),
}


def test_simulate_returns_the_cli_contract(client):
    body = {
        "schedule": "1f1b",
        "num_devices": 4,
        "num_microbatches": 8,
        "forward": 1.0,
        "backward": 1.0,
        "weight": 1.0,
        "comm": 0.05,
    }
    response = client.post("/v1/simulate", json=body)
    assert response.status_code == 200, response.text
    expected = simulate(generate("1f1b", 4, 8), Durations(1.0, 1.0, 1.0, comm=0.05))
    assert response.json() == expected.to_contract()
    assert response.json()["peak_activation_fraction"][0] == 1.0


def test_simulate_per_stage_times_and_schedule_options(client):
    body = {
        "schedule": "v-half",
        "num_devices": 4,
        "num_microbatches": 8,
        "forward": [1, 1, 1, 1, 1, 1, 1, 1.2],
        "backward": 1,
        "weight": 0.5,
    }
    assert client.post("/v1/simulate", json=body).status_code == 200
    bpipe = {
        "schedule": "bpipe",
        "num_devices": 8,
        "num_microbatches": 16,
        "forward": 1,
        "backward": 2,
        "transfer": 0.5,
        "overlap_transfers": False,
    }
    result = client.post("/v1/simulate", json=bpipe).json()
    assert max(result["peak_activation_fraction"]) < 1.0  # activation balancing


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"forward": [1, 1, 1]}, "got 3 values for 4 stages"),
        ({"schedule": "interleaved", "num_microbatches": 6}, "multiple"),
        ({"num_devices": 64, "num_microbatches": 512}, "limit of 16384"),
        ({"schedule": "pipedream"}, "schedule"),
        ({"schedule": "v-half", "num_chunks": 2}, "v-half has no parameter num_chunks"),
        ({"num_batches": 3}, "1f1b has no parameter num_batches"),
        ({"forward": -1}, "forward"),
        ({"num_devices": 0}, "num_devices"),
        # Once accepted and ignored: transfers exist only where activations move.
        (
            {"transfer": 0.5},
            "transfer does not apply to 1f1b: only schedules that move activations between "
            "devices have EVICT/LOAD transfers (bpipe, bpipe-interleaved); leave it out",
        ),
        ({"schedule": "v-zb", "overlap_transfers": False}, "overlap_transfers does not apply"),
        # Blocking transfers of no time block nothing: once accepted and without effect.
        (
            {"schedule": "bpipe", "overlap_transfers": False},
            "overlap_transfers false needs transfer above 0: it makes bpipe's EVICT/LOAD "
            "transfers block the device for the time they take, and at transfer 0 (the "
            "default) they take none, so it would change nothing; give transfer (the time of "
            "one EVICT or LOAD) too, or leave overlap_transfers false out",
        ),
        (
            {"schedule": "bpipe-interleaved", "transfer": 0.0, "overlap_transfers": False},
            "overlap_transfers false needs transfer above 0",
        ),
    ],
)
def test_simulate_errors(client, change, needle):
    body = {"schedule": "1f1b", "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body["backward"] = 1
    body.update(change)
    assert_problem(client.post("/v1/simulate", json=body), 422, needle)


def test_a_client_sending_every_field_at_its_default_is_answered(client):
    """Generated clients send every field: transfer 0 and overlap_transfers true change
    nothing for a schedule without transfers, so they are not refused."""
    body = {"schedule": "1f1b", "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body |= {"backward": 1, "transfer": 0.0, "overlap_transfers": True}
    assert client.post("/v1/simulate", json=body).status_code == 200


def test_a_client_sending_the_defaults_the_openapi_declares_is_answered(client):
    """Generated clients send every field at the default the OpenAPI document declares:
    num_chunks and num_batches were declared with a default of 2 and memory_limit as
    nullable, and each was refused ("1f1b has no parameter num_chunks") by every schedule
    that does not take it. The declared defaults must be answered for every schedule."""
    schema = client.get("/openapi.json").json()["components"]["schemas"]["SimulateRequest"]
    # An optional field without a declared default is nullable: its default is null.
    optional = set(schema["properties"]) - set(schema["required"])
    defaults = {name: schema["properties"][name].get("default") for name in optional}
    assert {"num_chunks", "num_batches", "memory_limit"} <= set(defaults)
    base = {"num_devices": 4, "num_microbatches": 8, "forward": 1, "backward": 2}
    for name in SCHEDULE_NAMES:
        # A parameter with no default must be given (the adaptive schedules' memory limit).
        needed = {p.name: 1.0 for p in schedule_family(name).parameters if p.default is None}
        body = defaults | base | {"schedule": name} | needed
        response = client.post("/v1/simulate", json=body)
        assert response.status_code == 200, (name, response.text)
        alone = client.post("/v1/simulate", json=base | {"schedule": name} | needed)
        assert response.json() == alone.json(), name


@pytest.mark.parametrize(
    ("schedule", "field", "value"),
    [("1f1b", "num_chunks", 2), ("v-half", "num_batches", 2), ("gpipe", "memory_limit", 0.5)],
)
def test_a_value_for_a_parameter_the_schedule_lacks_is_still_refused(
    client, schedule, field, value
):
    body = {"schedule": schedule, "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body |= {"backward": 1, field: value}
    assert_problem(
        client.post("/v1/simulate", json=body), 422, f"{schedule} has no parameter {field}"
    )


@pytest.mark.parametrize(
    ("schedule", "field"), [("interleaved", "num_chunks"), ("2bw", "num_batches")]
)
def test_a_null_parameter_is_the_schedules_default(client, schedule, field):
    body = {"schedule": schedule, "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body |= {"backward": 1, field: None}
    response = client.post("/v1/simulate", json=body)
    assert response.status_code == 200, response.text
    expected = simulate(generate(schedule, 4, 8), Durations(1, 1))
    assert response.json() == expected.to_contract()
    assert client.post("/v1/simulate", json=body | {field: 2}).json() == response.json()


def test_the_cell_limit_counts_a_null_num_chunks_at_its_default(client):
    body = {"schedule": "interleaved", "num_devices": 64, "num_microbatches": 256}
    body |= {"forward": 1, "backward": 1, "num_chunks": None}
    assert_problem(
        client.post("/v1/simulate", json=body),
        422,
        "num_devices x num_microbatches x num_chunks = 32768 is above",
    )


@pytest.mark.parametrize("bad", [-1, [1, -1, 1, 1]])
def test_a_negative_time_gets_one_message_not_one_per_union_branch(client, bad):
    body = {"schedule": "1f1b", "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body["backward"] = bad
    problem = assert_problem(
        client.post("/v1/simulate", json=body),
        422,
        "body.backward: times are seconds from 0 to 1e9",
        "got -1",
    )
    assert "valid array" not in problem["detail"] and len(problem["errors"]) == 1


def test_a_parameter_the_schedule_lacks_is_titled_as_a_schedule_problem(client):
    body = {"schedule": "v-half", "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body |= {"backward": 1, "num_chunks": 2}
    problem = assert_problem(client.post("/v1/simulate", json=body), 422, "num_chunks")
    assert problem["title"] == "Schedule cannot be built"


def test_simulate_passes_the_parameters_a_family_takes(client):
    body = {"schedule": "interleaved", "num_devices": 2, "num_microbatches": 4, "forward": 1}
    body |= {"backward": 1, "num_chunks": 3}
    response = client.post("/v1/simulate", json=body)
    assert response.status_code == 200, response.text
    expected = simulate(generate("interleaved", 2, 4, num_chunks=3), Durations(1, 1))
    assert response.json() == expected.to_contract()


def test_simulate_adaptive_schedules_with_a_memory_limit(client):
    body = {"schedule": "v-adaptive", "num_devices": 4, "num_microbatches": 8, "forward": 1}
    body |= {"backward": 1.2, "weight": 0.8, "comm": 0.1, "memory_limit": 0.75}
    response = client.post("/v1/simulate", json=body)
    assert response.status_code == 200, response.text
    times = PassTimes(1.0, 1.2, 0.8, 0.1)
    schedule = generate("v-adaptive", 4, 8, memory_limit=0.75, times=times)
    expected = simulate(schedule, Durations(1.0, 1.2, 0.8, comm=0.1))
    assert response.json() == expected.to_contract()
    assert max(response.json()["peak_activation_fraction"]) <= 0.75
    zb = body | {"schedule": "zb-adaptive", "memory_limit": 1}
    assert max(client.post("/v1/simulate", json=zb).json()["peak_activation_fraction"]) <= 1


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"schedule": "v-adaptive", "memory_limit": 0.2}, "smallest feasible memory_limit is"),
        ({"schedule": "zb-adaptive", "memory_limit": 0.1}, "memory_limit is 0.25"),
        ({"schedule": "v-adaptive"}, "v-adaptive needs memory_limit"),
        ({"schedule": "v-half", "memory_limit": 0.5}, "v-half has no parameter memory_limit"),
    ],
)
def test_simulate_memory_limit_errors(client, change, needle):
    body = {"num_devices": 4, "num_microbatches": 8, "forward": 1, "backward": 1} | change
    assert_problem(client.post("/v1/simulate", json=body), 422, needle)


def test_memory_sweep_is_the_figure_of_the_cli(client):
    body = {"num_devices": 4, "num_microbatches": 8, "forward": 1, "backward": 1, "weight": 1}
    response = client.post("/v1/simulate/memory-sweep", json=body)
    assert response.status_code == 200, response.text
    expected = memory_sweep(4, 8, PassTimes(1.0, 1.0, 1.0))
    assert response.json() == expected.to_dict()
    assert_problem(
        client.post("/v1/simulate/memory-sweep", json=body | {"num_devices": 64}),
        422,
        "num_devices",
    )
    too_many = body | {"num_devices": 16, "num_microbatches": 64}
    assert_problem(client.post("/v1/simulate/memory-sweep", json=too_many), 422, "above 512")


@pytest.mark.parametrize("field", ["forward", "backward", "weight"])
def test_memory_sweep_times_per_stage_say_the_stages_are_v_stages(client, field):
    """Four times for 4 devices were refused as "forward times: got 4 values for 8
    stages", which did not say where 8 came from (the CLI's --plot says it since b4fb896)."""
    body = {"num_devices": 4, "num_microbatches": 8, "forward": 1, "backward": 1}
    response = client.post("/v1/simulate/memory-sweep", json=body | {field: [1, 2, 3, 4]})
    problem = assert_problem(
        response,
        422,
        f"{field} needs one time or 8 (one per V stage, 2 a device), got 4",
    )
    assert problem["title"] == "Invalid request"
    per_v_stage = client.post("/v1/simulate/memory-sweep", json=body | {field: [1] * 8})
    assert per_v_stage.status_code == 200, per_v_stage.text


def test_schedules_lists_the_registry(client):
    response = client.get("/v1/schedules")
    assert response.status_code == 200
    listed = response.json()
    assert [f["name"] for f in listed] == list(SCHEDULE_NAMES)
    by_name = {f["name"]: f for f in listed}
    assert by_name["2bw"]["semantics"] == "stale" and by_name["2bw"]["weight_versions"] == 2
    assert by_name["v-zb"]["split_backward"] and by_name["v-zb"]["placement"] == "v"
    assert by_name["bpipe"]["transfers"] and by_name["bpipe"]["runtimes"] == ["stagewright"]
    assert by_name["1f1b"]["runtimes"] == ["stagewright", "torch", "megatron"]
    assert by_name["interleaved"]["parameters"][0]["name"] == "num_chunks"


def test_simulate_rejects_non_finite_numbers(client):
    raw = b'{"schedule": "1f1b", "num_devices": 2, "num_microbatches": 2, "forward": Infinity,'
    raw += b' "backward": 1}'
    response = client.post(
        "/v1/simulate", content=raw, headers={"content-type": "application/json"}
    )
    assert_problem(response, 422, "forward")


def test_healthz(client, database_url):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["database"] == database_url.split(":")[0].split("+")[0]
    assert body["jobs_queued"] == 0 and body["version"]


def test_metrics_in_prometheus_text_format(client):
    client.post("/v1/plans", json=example("tiny-cpu"))
    client.get(f"/v1/plans/{'0' * 32}")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text
    assert "# TYPE stagewright_http_requests_total counter" in text
    assert 'stagewright_http_requests_total{method="POST",route="/v1/plans",status="201"} 1' in text
    # One series per route template, not per plan id.
    assert 'route="/v1/plans/{plan_id}",status="404"} 1' in text
    assert 'stagewright_jobs{status="done"} 1' in text
    assert "stagewright_database_up 1" in text
    assert 'stagewright_jobs_finished_total{status="done"} 1' in text
    assert "stagewright_job_duration_seconds_count 1" in text


def test_docs_openapi_and_root(client):
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    operations = {(m, p) for p, item in schema["paths"].items() for m in item}
    assert CONTRACT_PATHS <= operations
    assert schema["components"]["schemas"]["Problem"]["properties"]["detail"]
    post_plans = schema["paths"]["/v1/plans"]["post"]
    assert {"200", "201", "202", "401", "413", "422", "503"} <= set(post_plans["responses"])
    assert post_plans["security"] == [{"bearer": []}]
    root = client.get("/")  # the dashboard
    assert root.status_code == 200 and root.headers["content-type"].startswith("text/html")
    assert "/static/app.js" in root.text


def test_unknown_route_and_method_are_problems(client):
    assert_problem(client.get("/v2/nothing"), 404, "/docs")
    response = client.delete("/v1/hardware")
    assert_problem(response, 405, "DELETE is not allowed", "GET")
    assert "POST" in response.headers["allow"]


def test_writes_need_the_token_when_one_is_set(make_client):
    client = make_client(api_token="s3cret-token")
    missing = client.post("/v1/plans", json=example("tiny-cpu"))
    assert_problem(missing, 401, "Authorization: Bearer")
    assert missing.headers["www-authenticate"] == 'Bearer realm="stagewright"'
    wrong = client.post("/v1/simulate", json={}, headers={"Authorization": "Bearer nope"})
    assert_problem(wrong, 401, "missing or wrong")
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    basic = client.post("/v1/hardware", json={}, headers={"Authorization": "Basic czNjcmV0"})
    assert_problem(basic, 401)
    # Checked before the body: an unauthenticated client cannot make it parse anything.
    huge = client.post("/v1/profiles", content=b"x" * 2_000_000)
    assert_problem(huge, 401)
    good = client.post(
        "/v1/plans",
        json=example("tiny-cpu"),
        headers={"Authorization": "Bearer s3cret-token"},
    )
    assert good.status_code == 201
    # Reads stay open.
    assert client.get("/v1/plans").status_code == 200
    assert client.get(good.headers["location"]).status_code == 200
    assert client.get("/metrics").status_code == 200
