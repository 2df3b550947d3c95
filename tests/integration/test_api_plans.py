"""/v1/plans and /v1/plans/{id}/measurements over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time

import pytest

from api.store import crud
from planner.assemble import no_fit_hint
from planner.errors import StagewrightError
from planner.plan import plan as real_plan
from planner.profiles import JsonProfileStore, hardware_from_dict
from planner.schedules import generate
from planner.specs import CandidateConfig, Plan, PlanRequest
from tests.integration.conftest import assert_problem, example, tiny, wait_done

PLAN_KEYS = {"id", "request", "best", "candidates", "rejected", "stats"}
STATUS_KEYS = {"status", "created_at", "updated_at", "finished_at", "warnings", "error"}


def test_post_plans_answers_201_with_the_plan_and_a_location(client):
    response = client.post("/v1/plans", json=example("tiny-cpu"))
    assert response.status_code == 201, response.text
    body = response.json()
    assert PLAN_KEYS | STATUS_KEYS <= set(body)
    assert body["status"] == "done"
    assert response.headers["location"] == f"/v1/plans/{body['id']}"
    assert response.headers["stagewright-cache"] == "miss"
    # The body is a Plan: the planner's own model validates it.
    plan = Plan.model_validate({k: body[k] for k in Plan.model_fields})
    assert plan.best is not None and plan.best == plan.candidates[0]
    assert plan.request == PlanRequest.model_validate(example("tiny-cpu"))
    assert body["rejected"] == []  # like `stagewright plan` without --all
    assert body["finished_at"].endswith("Z")


def test_the_service_plans_like_the_cli(client):
    """Same request, same store contents: the SQL-backed answer equals the JSON-backed one."""
    body = client.post("/v1/plans", json=example("gpt3-13b-8xa100")).json()
    expected = real_plan(PlanRequest.model_validate(example("gpt3-13b-8xa100")))
    assert [c["config"] for c in body["candidates"]] == [
        c.config.model_dump(mode="json") for c in expected.candidates
    ]
    assert body["best"]["predicted"] == expected.best.predicted.model_dump(mode="json")


def test_include_rejected_lists_every_rejection(client):
    body = client.post("/v1/plans?include_rejected=true", json=example("tiny-cpu")).json()
    assert body["rejected"] and all({"config", "reason"} <= set(r) for r in body["rejected"])
    again = client.get(f"/v1/plans/{body['id']}", params={"include_rejected": True}).json()
    assert again["rejected"] == body["rejected"]
    assert client.get(f"/v1/plans/{body['id']}").json()["rejected"] == []


def test_a_done_plan_without_candidates_says_why_and_what_may_help(client):
    """GPT-3 13B on one GPU fits in no configuration: the done plan's warnings carry the
    CLI's hint (the same function), leaving out what the request already uses."""
    data = example("gpt3-13b-8xa100")
    data["cluster"].update(num_nodes=1, gpus_per_node=1)
    data["search"].update(schedules=["1f1b"], recompute=["full"])
    data["training"]["distributed_optimizer"] = True
    body = client.post("/v1/plans", json=data).json()
    assert body["status"] == "done" and body["candidates"] == [] and body["best"] is None
    hint = no_fit_hint(PlanRequest.model_validate(data))
    (warning,) = body["warnings"]
    assert warning.startswith("No configuration fits in memory (")
    assert warning.endswith(f"{hint} ?include_rejected=true lists why each was rejected.")
    assert "more GPUs (cluster.num_nodes)" in hint
    assert "recompute" not in hint and "distributed_optimizer" not in hint
    assert client.get(f"/v1/plans/{body['id']}").json()["warnings"] == body["warnings"]


def test_a_plan_whose_configurations_are_all_refused_before_memory_offers_no_memory_saving(
    client,
):
    data = example("tiny-cpu")
    data["search"] = {"schedules": ["v-zb"], "runtime": "megatron", "micro_batch_sizes": [1]}
    body = client.post("/v1/plans", json=data).json()
    assert body["status"] == "done" and body["best"] is None
    (warning,) = body["warnings"]
    assert warning.startswith("No configuration can run: all ")
    assert "Megatron-LM has no V-ZB schedule" in warning
    assert "may help" not in warning  # no memory saving is offered: memory was not the reason


def test_identical_request_is_answered_from_the_store(client):
    first = client.post("/v1/plans", json=example("tiny-cpu"))
    # Same request with keys in another order and defaults spelled out.
    data = example("tiny-cpu")
    data["search"] = dict(reversed(list(data["search"].items())), time_limit_s=10.0)
    second = client.post("/v1/plans", json=data)
    assert second.status_code == 200
    assert second.headers["stagewright-cache"] == "hit"
    assert second.json()["id"] == first.json()["id"]
    assert second.json()["candidates"] == first.json()["candidates"]
    metrics = client.get("/metrics").text
    assert 'stagewright_plan_cache_total{result="hit"} 1' in metrics
    assert 'stagewright_plan_cache_total{result="miss"} 1' in metrics


def test_a_profile_change_invalidates_the_cache(client):
    first = client.post("/v1/plans", json=example("tiny-cpu")).json()
    point = {
        "gpu": "cpu",
        "precision": "fp32",
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "micro_batch_size": 1,
        "forward_ms": 1.0,
        "backward_ms": 2.0,
        "weight_ms": 1.5,
    }
    assert client.post("/v1/profiles", json={"layers": [point]}).status_code == 201
    second = client.post("/v1/plans", json=example("tiny-cpu"))
    assert second.status_code == 201  # searched again, on the new profile
    assert second.json()["id"] != first["id"]
    assert second.json()["hardware_revision"] == first["hardware_revision"] + 1
    # The measured point is used: the plan's times changed.
    assert second.json()["best"]["predicted"] != first["best"]["predicted"]


def test_wait_zero_answers_202_and_the_plan_is_polled(make_client):
    release = threading.Event()

    def slow(request, store):
        release.wait(30)
        return real_plan(request, store)

    client = make_client(planner=slow)
    response = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu"))
    assert response.status_code == 202
    location = response.headers["location"]
    body = response.json()
    assert body["status"] in ("queued", "running")
    assert body["best"] is None and body["candidates"] == [] and body["stats"] is None
    polled = client.get(location)
    assert polled.status_code == 200 and polled.headers["retry-after"] == "1"
    # An identical request while it runs joins it instead of starting a second search.
    joined = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu"))
    assert joined.status_code == 202 and joined.json()["id"] == body["id"]
    release.set()
    done = wait_done(client, body["id"])
    assert done["status"] == "done" and done["best"] is not None
    listed = client.get("/v1/plans", params={"status": "done"}).json()
    assert [item["id"] for item in listed["items"]] == [body["id"]]


def test_get_plan_404_for_unknown_and_malformed_ids(client):
    assert_problem(client.get(f"/v1/plans/{'0' * 32}"), 404, "no plan with id", "GET /v1/plans")
    assert_problem(client.get("/v1/plans/not-an-id"), 404, "no plan with id")
    assert_problem(client.get("/v1/plans/%00"), 404)


def test_list_plans_filters_and_pages(client):
    ids = []
    for batch in (16, 20, 24):
        body = client.post("/v1/plans", json=tiny(**{"training.global_batch_size": batch})).json()
        ids.append(body["id"])
    client.post("/v1/plans", json=example("gpt3-13b-8xa100"))
    page = client.get("/v1/plans", params={"gpu": "cpu", "limit": 2}).json()
    assert page["total"] == 3 and page["limit"] == 2
    assert [item["id"] for item in page["items"]] == ids[::-1][:2]  # newest first
    rest = client.get("/v1/plans", params={"gpu": "cpu", "limit": 2, "offset": 2}).json()
    assert [item["id"] for item in rest["items"]] == [ids[0]]
    item = page["items"][0]
    assert item["status"] == "done" and item["model_name"] == "tiny-gpt"
    assert item["num_gpus"] == 4 and item["best_config"]["t"] >= 1
    assert item["best_predicted"]["samples_per_s"] > 0
    assert client.get("/v1/plans", params={"model": "gpt3-13b"}).json()["total"] == 1
    assert client.get("/v1/plans", params={"status": "failed"}).json()["total"] == 0


def test_list_plans_rejects_bad_filters(client):
    body = assert_problem(client.get("/v1/plans", params={"limit": 0}), 422, "limit")
    assert body["errors"][0]["loc"] == ["query", "limit"]
    assert_problem(client.get("/v1/plans", params={"status": "finished"}), 422, "status")
    assert_problem(client.get("/v1/plans", params={"gpu": "A100!"}), 422, "gpu")


def test_invalid_request_is_422_with_every_field_named(client):
    data = example("tiny-cpu")
    data["model"]["hidden_size"] = 250  # not divisible by 8 heads
    body = assert_problem(client.post("/v1/plans", json=data), 422, "num_attention_heads")
    assert body["errors"][0]["loc"][:2] == ["body", "model"]
    assert "Value error" not in body["detail"]
    data = example("tiny-cpu")
    del data["cluster"]
    data["search"]["method"] = "annealing"
    data["extra"] = 1
    body = assert_problem(client.post("/v1/plans", json=data), 422)
    locs = {tuple(e["loc"]) for e in body["errors"]}
    assert {("body", "cluster"), ("body", "search", "method"), ("body", "extra")} <= locs
    assert body["type"] == "urn:stagewright:problem:validation-error"


def test_malformed_json_is_400(client):
    response = client.post(
        "/v1/plans", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert_problem(response, 400, "not valid JSON")


def test_unknown_gpu_lists_the_known_ones(client):
    body = assert_problem(
        client.post("/v1/plans", json=tiny(**{"cluster.gpu": "tpu-v9"})),
        422,
        "unknown GPU 'tpu-v9'",
        "a100-sxm-80g",
        "POST /v1/hardware",
    )
    assert body["type"] == "urn:stagewright:problem:unknown-hardware"
    assert_problem(
        client.post("/v1/plans", json=tiny(**{"cluster.gpu": "A100 \x00"})), 422, "unknown GPU"
    )


def test_unsupported_precision_fails_before_any_job(client):
    data = example("gpt3-13b-8xa100")
    data["cluster"]["gpu"] = "v100-32g"
    assert_problem(client.post("/v1/plans", json=data), 422, "bf16", "fp16")
    assert client.get("/v1/plans").json()["total"] == 0


def test_search_space_limits_are_422_with_the_limit(make_client):
    client = make_client(max_gpus=64, max_top_k=5, max_global_batch_size=64)
    body = assert_problem(
        client.post(
            "/v1/plans",
            json=tiny(
                **{
                    "cluster.num_nodes": 100,
                    "search.top_k": 6,
                    "training.global_batch_size": 128,
                    "model.num_layers": 5000,
                }
            ),
        ),
        422,
        "limit of 64",
        "limit of 5",
        "limit of 1024",
    )
    assert body["type"] == "urn:stagewright:problem:limit-exceeded"
    locs = [e["loc"] for e in body["errors"]]
    assert ["body", "search", "top_k"] in locs and ["body", "cluster"] in locs
    sizes = tiny(**{"search.micro_batch_sizes": list(range(1, 18))})
    assert_problem(client.post("/v1/plans", json=sizes), 422, "limit of 16 entries")
    chunks = tiny(**{"search.num_chunks": list(range(2, 19))})
    assert_problem(client.post("/v1/plans", json=chunks), 422, "17 chunk counts", "limit of 16")
    assert_problem(
        client.post("/v1/plans?wait_s=31", json=example("tiny-cpu")), 422, "limit of 30 s"
    )


def test_a_request_without_top_k_gets_a_server_limit_below_the_default(make_client):
    """With STAGEWRIGHT_MAX_TOP_K under 10, every request that named no top_k was refused
    with 'top_k: 10 is above this server's limit of 3', a value it never sent."""
    client = make_client(planner=real_plan, max_top_k=3)
    request = example("tiny-cpu")
    del request["search"]["top_k"]
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["request"]["search"]["top_k"] == 3 and len(plan["candidates"]) == 3
    assert (
        "search.top_k not given: 3 candidates (this server's limit) rather than the "
        "default 10" in plan["warnings"]
    )
    # A top_k the client sends is its own: over the limit, still refused.
    request["search"]["top_k"] = 4
    assert_problem(client.post("/v1/plans", json=request), 422, "top_k: 4 is above", "of 3")
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    top_k = schemas.get("SearchSpec-Input", schemas.get("SearchSpec"))["properties"]["top_k"]
    assert (top_k["default"], top_k["maximum"]) == (3, 3)


def test_cpsat_time_is_capped_with_a_warning(make_client):
    seen = []

    def record(request, store):
        seen.append(request.search.time_limit_s)
        return real_plan(request, store)

    client = make_client(planner=record, max_cpsat_time_s=3)
    request = tiny(**{"search.method": "cpsat", "search.time_limit_s": 300})
    body = client.post("/v1/plans", json=request).json()
    assert seen == [3.0]
    assert body["request"]["search"]["time_limit_s"] == 3.0
    assert body["warnings"] == ["search.time_limit_s 300 s lowered to this server's cap of 3 s"]


def test_body_over_the_limit_is_413_with_the_limit(make_client):
    client = make_client(max_body_bytes=4096)
    data = example("tiny-cpu")
    data["model"]["name"] = "x" * 5000
    problem = assert_problem(client.post("/v1/plans", json=data), 413, "at most 4,096 bytes")
    assert "and the request body is 5," in problem["detail"]

    def chunks():
        yield b'{"model": {"name": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}}'

    chunked = client.post(
        "/v1/plans", content=chunks(), headers={"content-type": "application/json"}
    )
    # It read "the request body is larger than that; ...": "that" named nothing.
    problem = assert_problem(chunked, 413)
    assert problem["detail"] == (
        "this server accepts a request body of at most 4,096 bytes, and the request body "
        "(sent without a Content-Length) grew past that; send fewer entries per request "
        "(e.g. split a profile upload)"
    )


def test_full_queue_is_503_with_retry_after(make_client, database_url):
    client = make_client(max_queued_jobs=1, job_poll_s=3600)
    time.sleep(0.3)  # the poller has made its first round and sleeps
    database = client.app.state.stagewright.database
    with database.session(write=True) as session:
        crud.admit_plan(
            session=session,
            request=example("tiny-cpu"),
            request_hash="f" * 64,
            model_name="waiting",
            gpu="cpu",
            num_gpus=4,
            method="grid",
            hardware_revision=1,
            warnings=[],
            created_by=None,
            max_queued=1,
        )
    response = client.post("/v1/plans", json=tiny(**{"training.global_batch_size": 20}))
    # The detail's wait is the header's (it said "retry in a minute" beside 30 s).
    problem = assert_problem(response, 503, "1 search is waiting, this server's limit")
    seconds = response.headers["retry-after"]
    assert problem["detail"].endswith(f"; retry in {seconds} s") and seconds == "30"


def test_a_planner_error_in_the_job_is_422_and_stored(make_client):
    def refuse(request, store):
        raise StagewrightError("this model cannot be split that way; use fewer stages")

    client = make_client(planner=refuse)
    response = client.post("/v1/plans", json=example("tiny-cpu"))
    body = assert_problem(response, 422, "use fewer stages")
    plan_id = response.headers["location"].rsplit("/", 1)[1]
    assert body["instance"] == f"/v1/plans/{plan_id}"
    stored = client.get(f"/v1/plans/{plan_id}").json()
    assert stored["status"] == "failed" and stored["error"]["detail"] == body["detail"]
    # A failed plan is not reused: the same request is searched again.
    assert client.post("/v1/plans", json=example("tiny-cpu")).status_code == 422
    assert client.get("/v1/plans").json()["total"] == 2


@pytest.mark.parametrize(
    "path", ["/measurements", "/timeline", "/candidates/0/launch", "/launch.tar.gz", "/rejected/0"]
)
def test_a_failed_plan_says_it_failed_not_to_poll_until_done(make_client, path):
    """A failed plan's measurements, timeline and launch files were refused with 'poll GET
    /v1/plans/{id} until status is 'done'': it never will be, and '{id}' was printed as
    is."""

    def refuse(request, store):
        raise StagewrightError("this model cannot be split that way; use fewer stages")

    client = make_client(planner=refuse)
    plan_id = client.post("/v1/plans", json=example("tiny-cpu")).headers["location"][-32:]
    url = f"/v1/plans/{plan_id}{path}"
    answer = client.post(url, json={"step_time_s": 1.0}) if "meas" in path else client.get(url)
    body = assert_problem(
        answer, 409, f"plan {plan_id} failed", f"GET /v1/plans/{plan_id}", "submit"
    )
    assert "poll" not in body["detail"] and "{id}" not in body["detail"]


def test_a_plan_still_searching_names_its_own_id_to_poll(make_client):
    release = threading.Event()

    def slow(request, store):
        release.wait(30)
        return real_plan(request, store)

    client = make_client(planner=slow)
    plan_id = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu")).json()["id"]
    answer = client.get(f"/v1/plans/{plan_id}/timeline")
    release.set()
    assert_problem(answer, 409, f"poll GET /v1/plans/{plan_id} until status is 'done'")


def test_a_planner_bug_is_500_without_internals(make_client):
    def crash(request, store):
        raise ZeroDivisionError("secret internals")

    client = make_client(planner=crash)
    body = assert_problem(client.post("/v1/plans", json=example("tiny-cpu")), 500, "error id")
    assert "secret" not in json.dumps(body) and body["error_id"] in body["detail"]


def test_a_search_prices_with_the_profiles_its_plan_was_admitted_on(make_client):
    """A profile edited while a search waits does not leak into it: the job prices with the
    snapshot of the revision the plan names, and the plan equals one made directly on
    those profiles."""
    release = threading.Event()
    stores = []

    def slow(request, store):
        release.wait(30)
        stores.append(store)
        return real_plan(request, store)

    client = make_client(planner=slow)
    pending = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu")).json()
    before = client.get("/v1/hardware/cpu").json()
    faster = {k: before[k] for k in HARDWARE_IN}
    faster["peak_flops"] = {k: 2 * v for k, v in before["peak_flops"].items()}
    assert client.post("/v1/hardware", json=faster).status_code == 200
    release.set()
    done = wait_done(client, pending["id"])
    assert done["hardware_revision"] == before["revision"] == pending["hardware_revision"]
    assert stores[0].hardware("cpu").peak_flops == before["peak_flops"]
    direct = real_plan(PlanRequest.model_validate(example("tiny-cpu")), profiles_with(before))
    assert done["best"]["predicted"] == json.loads(direct.best.model_dump_json())["predicted"]


HARDWARE_IN = (
    "name",
    "description",
    "peak_flops",
    "memory_gib",
    "usable_memory_gib",
    "memory_bandwidth_gbps",
    "intra_node",
    "inter_node",
    "source",
)


def profiles_with(hardware: dict) -> JsonProfileStore:  # noqa: N802
    """The bundled profiles, with the cpu hardware as ``hardware`` (a GET /v1/hardware
    answer) says: its stored profile, without what the store adds to it (a hardware.json
    entry has no revision, origin or update time)."""
    store = JsonProfileStore.load()
    added = ("revision", "origin", "updated_at")
    store.add_hardware(hardware_from_dict({k: v for k, v in hardware.items() if k not in added}))
    return store


# -- measurements ---------------------------------------------------------------------------


def test_measurements_are_stored_next_to_the_prediction(client):
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    predicted = plan["candidates"][1]["predicted"]["iteration_time_s"]
    report = {
        "candidate": 1,
        "step_time_s": predicted * 1.1,
        "peak_activation_bytes": [1000, 900, 800, 700],
        "data": {"executor": "gloo", "losses": [2.3, 2.1]},
    }
    response = client.post(f"/v1/plans/{plan['id']}/measurements", json=report)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["plan_id"] == plan["id"] and body["candidate"] == 1
    assert body["predicted_iteration_time_s"] == pytest.approx(predicted)
    assert body["step_time_error"] == pytest.approx(0.1)
    assert body["data"] == report["data"]
    listed = client.get(f"/v1/plans/{plan['id']}/measurements").json()
    assert [m["id"] for m in listed] == [body["id"]]


def test_measurements_error_paths(make_client):
    release = threading.Event()

    def slow(request, store):
        release.wait(30)
        return real_plan(request, store)

    client = make_client(planner=slow)
    missing = f"/v1/plans/{'a' * 32}/measurements"
    assert_problem(client.post(missing, json={"step_time_s": 1.0}), 404, "no plan")
    assert_problem(client.get(missing), 404, "no plan")
    pending = client.post("/v1/plans?wait_s=0", json=example("tiny-cpu")).json()
    url = f"/v1/plans/{pending['id']}/measurements"
    assert_problem(client.post(url, json={"step_time_s": 1.0}), 409, "until status is 'done'")
    release.set()
    wait_done(client, pending["id"])
    body = assert_problem(
        client.post(url, json={"step_time_s": 1.0, "candidate": 99}), 422, "numbered 0 to 4"
    )
    assert body["errors"][0]["loc"] == ["body", "candidate"]
    assert_problem(client.post(url, json={"step_time_s": -1}), 422, "step_time_s")
    assert_problem(client.post(url, json={"step_time_s": 1, "rank": 0}), 422, "rank")
    nan = client.post(
        url, content=b'{"step_time_s": NaN}', headers={"content-type": "application/json"}
    )
    assert_problem(nan, 422, "step_time_s")


def test_peak_activation_bytes_need_one_entry_per_rank(client):
    """A list of 9 peaks for a plan on 4 ranks was stored as given: which rank each is
    cannot be told, and nothing said so."""
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    url = f"/v1/plans/{plan['id']}/measurements"
    body = assert_problem(
        client.post(url, json={"step_time_s": 1.0, "peak_activation_bytes": list(range(9))}),
        422,
        "9 entries",
        "runs on 4 ranks",
        "one per rank",
    )
    assert body["errors"][0]["loc"] == ["body", "peak_activation_bytes"]
    assert client.get(url).json() == []
    for peaks in ([], [10, 20, 30, 40]):
        stored = client.post(url, json={"step_time_s": 1.0, "peak_activation_bytes": peaks})
        assert stored.status_code == 201, stored.text
        assert stored.json()["peak_activation_bytes"] == peaks


# -- launch artefacts, timelines, deletion ---------------------------------------------------


def test_a_candidates_launch_artefacts_are_materialized_on_demand(client):
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    stored = plan["candidates"][1]
    assert "actions" not in stored["launch"]["executor_config"]["schedule"]
    response = client.get(f"/v1/plans/{plan['id']}/candidates/1/launch")
    assert response.status_code == 200, response.text
    launch = response.json()
    config = CandidateConfig.model_validate(stored["config"])
    schedule = generate(config.schedule, config.p, config.num_microbatches)
    assert launch["executor_config"]["schedule"] == schedule.to_dict()
    assert len(launch["executor_config"]["placement"]["ranks"]) == config.t * config.p * config.d
    assert launch["torchrun"] == stored["launch"]["torchrun"]
    assert_problem(
        client.get(f"/v1/plans/{plan['id']}/candidates/99/launch"), 404, "ranked candidates"
    )


def test_a_plans_launch_files_download_as_emit_writes_them(client):
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    response = client.get(f"/v1/plans/{plan['id']}/launch.tar.gz")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert f"stagewright-plan-{plan['id']}.tar.gz" in response.headers["content-disposition"]
    root = f"stagewright-plan-{plan['id']}"
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        names = set(archive.getnames())
        assert {f"{root}/plan.json", f"{root}/README.md"} <= names
        for index, candidate in enumerate(plan["candidates"], start=1):
            folder = f"{root}/candidate-{index}"
            script = archive.getmember(f"{folder}/run-node0.sh")
            assert script.mode == 0o755
            text = archive.extractfile(script).read().decode()  # type: ignore[union-attr]
            assert candidate["launch"]["torchrun"][0] in text
            config = json.loads(archive.extractfile(f"{folder}/executor-config.json").read())  # type: ignore[union-attr]
            assert "actions" in config["schedule"]  # written out, not the plan's reference
    assert_problem(client.get(f"/v1/plans/{'a' * 32}/launch.tar.gz"), 404, "no plan")


def test_a_timeline_is_windowed_and_says_where_to_continue(client):
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    url = f"/v1/plans/{plan['id']}/timeline"
    whole = client.get(url).json()
    assert whole["mode"] == "actions" and not whole["truncated"]
    every = sorted(a[3] for d in whole["devices"] for a in d["actions"])
    first = client.get(url, params={"limit": 5}).json()
    assert first["truncated"] and sum(len(d["actions"]) for d in first["devices"]) == 5
    assert first["next_start_s"] == every[5]
    later = client.get(url, params={"start_s": every[-1]}).json()
    assert all(a[4] >= every[-1] for d in later["devices"] for a in d["actions"])
    assert whole["profiles"] == {"gpu": "cpu", "revision": plan["hardware_revision"]}


def test_a_timeline_window_that_ends_before_it_starts_is_refused(client):
    """?start_s=5&end_s=1 answered 200 with no action on any device, as if the schedule
    were empty there."""
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    url = f"/v1/plans/{plan['id']}/timeline"
    body = assert_problem(
        client.get(url, params={"start_s": 5, "end_s": 1}),
        422,
        "query.end_s: end_s 1 is before start_s 5",
    )
    assert body["errors"][0]["loc"] == ["query", "end_s"]
    point = client.get(url, params={"start_s": 0.1, "end_s": 0.1})  # an instant is a window
    assert point.status_code == 200, point.text


def test_a_plan_is_deleted_with_its_measurements(client):
    plan = client.post("/v1/plans", json=example("tiny-cpu")).json()
    client.post(f"/v1/plans/{plan['id']}/measurements", json={"step_time_s": 1.0})
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    assert_problem(client.get(f"/v1/plans/{plan['id']}"), 404, "no plan")
    assert_problem(client.delete(f"/v1/plans/{plan['id']}"), 404, "no plan")
    # The request is searched again (the deleted plan answered it).
    assert client.post("/v1/plans", json=example("tiny-cpu")).status_code == 201
