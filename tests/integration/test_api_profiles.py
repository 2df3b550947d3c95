"""/v1/hardware and /v1/profiles over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.integration.conftest import assert_problem, example

H200X: dict[str, Any] = {
    "name": "h200x-test",
    "description": "a test accelerator",
    "peak_flops": {"bf16": 1.0e15, "fp32": 6.0e13},
    "memory_gib": 141.0,
    "usable_memory_gib": 139.0,
    "memory_bandwidth_gbps": 4800,
    "intra_node": {"kind": "nvlink4", "bandwidth_gbps": 450, "latency_us": 3},
    "inter_node": {"kind": "infiniband-ndr", "bandwidth_gbps": 50, "latency_us": 5},
    "source": "made up for a test",
}
SMALL_MODEL: dict[str, Any] = {
    "name": "m",
    "num_layers": 8,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 512,
    "vocab_size": 1000,
}
POINT: dict[str, Any] = {
    "gpu": "cpu",
    "precision": "fp32",
    "hidden_size": 512,
    "num_attention_heads": 8,
    "seq_length": 128,
    "micro_batch_size": 2,
    "forward_ms": 3.0,
    "backward_ms": 4.0,
    "weight_ms": 3.5,
    "activation_bytes": 1.5e6,
    "source": "test",
}


def test_hardware_lists_the_bundled_profiles(client):
    response = client.get("/v1/hardware")
    assert response.status_code == 200
    names = [h["name"] for h in response.json()]
    assert names == sorted(names) and {"a100-sxm-80g", "cpu", "v100-16g"} <= set(names)
    a100 = client.get("/v1/hardware/a100-sxm-80g").json()
    assert a100["peak_flops"]["bf16"] == 312e12 and a100["origin"] == "bundled"
    assert a100["intra_node"] == {"kind": "nvlink3", "bandwidth_gbps": 300.0, "latency_us": 3.0}
    assert a100["revision"] == 1


def test_hardware_404(client):
    assert_problem(client.get("/v1/hardware/tpu-v9"), 404, "no hardware profile 'tpu-v9'")
    assert_problem(client.get("/v1/hardware/Not%20A%20Name"), 404, "GET /v1/hardware")


def test_post_hardware_creates_replaces_and_keeps_revisions(client):
    created = client.post("/v1/hardware", json=H200X)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/v1/hardware/h200x-test"
    assert created.json()["revision"] == 1 and created.json()["origin"] == "api"
    same = client.post("/v1/hardware", json=H200X)
    assert same.status_code == 200 and same.json()["revision"] == 1  # nothing changed
    changed = copy.deepcopy(H200X)
    changed["inter_node"]["bandwidth_gbps"] = 100
    replaced = client.post("/v1/hardware", json=changed)
    assert replaced.status_code == 200 and replaced.json()["revision"] == 2
    assert client.get("/v1/hardware/h200x-test").json()["inter_node"]["bandwidth_gbps"] == 100
    # Plans can use it at once.
    request = {
        "model": SMALL_MODEL,
        "cluster": {"gpu": "h200x-test", "num_nodes": 1, "gpus_per_node": 2},
        "training": {"global_batch_size": 8},
    }
    plan = client.post("/v1/plans", json=request)
    assert plan.status_code == 201 and plan.json()["hardware_revision"] == 2


def test_post_hardware_validation(client):
    bad = dict(H200X, usable_memory_gib=200)
    assert_problem(client.post("/v1/hardware", json=bad), 422, "usable_memory_gib 200")
    body = assert_problem(client.post("/v1/hardware", json=dict(H200X, name="H200 X")), 422)
    assert body["errors"][0]["loc"] == ["body", "name"]
    assert_problem(
        client.post("/v1/hardware", json=dict(H200X, peak_flops={"int4": 1e15})), 422, "int4"
    )
    assert_problem(client.post("/v1/hardware", json=dict(H200X, peak_flops={})), 422)
    assert_problem(client.post("/v1/hardware", json=dict(H200X, memory_gib=-1)), 422)
    assert_problem(client.post("/v1/hardware", json=dict(H200X, source="a\x00b")), 422, "source")
    assert client.get("/v1/hardware/h200x-test").status_code == 404


def test_post_hardware_with_parameters_and_plans_use_them(client):
    """A posted profile's parameter overrides are stored, shown, and priced with: halving the
    GEMM and memory efficiencies of a profile without layer points or compute facts (and
    without launch overheads) doubles the predicted compute."""
    request = {
        "model": SMALL_MODEL,
        "cluster": {"gpu": "h200x-test", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"global_batch_size": 8, "distributed_optimizer": False},
        "search": {"micro_batch_sizes": [8], "recompute": ["none"]},
    }
    times = {}
    for efficiency in (0.6, 0.3):
        parameters = {
            "gemm_efficiency": efficiency,
            "memory_efficiency": efficiency,
            "kernel_launch_us": 0.0,
        }
        body = dict(H200X, parameters=parameters)
        stored = client.post("/v1/hardware", json=body)
        assert stored.status_code in (200, 201), stored.text
        shown = client.get("/v1/hardware/h200x-test").json()
        assert shown["parameters"] == parameters
        assert shown["calibration"] is None
        plan = client.post("/v1/plans", json=request).json()
        best = plan["best"]["breakdown"][0]
        times[efficiency] = best["compute_s"]
    # One device, no tensor parallelism: every kernel is FLOPs / (peak x GEMM efficiency) or
    # bytes / (bandwidth x memory efficiency).
    assert times[0.3] == pytest.approx(2 * times[0.6], rel=1e-9)


def test_post_hardware_with_compute_facts_stores_them_and_the_tile_model_uses_them(client):
    """The compute block is stored and shown; with it, a GEMM of the same FLOPs prices by
    its tiles: one SM and a 1024 x 1024 tile make every layer GEMM a whole number of tiles."""
    request = {
        "model": SMALL_MODEL,
        "cluster": {"gpu": "h200x-test", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"global_batch_size": 8, "distributed_optimizer": False},
        "search": {"micro_batch_sizes": [8], "recompute": ["none"]},
    }
    compute = {
        "sm_count": 132,
        "l2_bandwidth_gbps": None,
        "gemm_tiles": [[256, 128], [128, 128]],
        "source": "made up",
    }
    without = client.post("/v1/hardware", json=H200X)
    assert without.status_code in (200, 201), without.text
    assert without.json()["compute"] is None
    plain = client.post("/v1/plans", json=request).json()["best"]["breakdown"][0]["compute_s"]
    stored = client.post("/v1/hardware", json=dict(H200X, compute=compute))
    assert stored.status_code == 200, stored.text
    assert client.get("/v1/hardware/h200x-test").json()["compute"] == compute
    tiled = client.post("/v1/plans", json=request).json()["best"]["breakdown"][0]["compute_s"]
    # Tile and wave quantization and the pipeline fill only ever add time.
    assert tiled > plain
    bad = dict(compute, gemm_tiles=[[0, 128]])
    response = client.post("/v1/hardware", json=dict(H200X, compute=bad))
    assert response.status_code == 422
    assert "gemm_tiles" in response.text


def test_post_hardware_rejects_unknown_or_out_of_bound_parameters(client):
    assert_problem(
        client.post("/v1/hardware", json=dict(H200X, parameters={"warp_efficiency": 0.5})),
        422,
        "unknown cost-model parameter 'warp_efficiency'",
    )
    assert_problem(
        client.post("/v1/hardware", json=dict(H200X, parameters={"workspace_gib": 100})),
        422,
        "workspace_gib = 100",
    )
    assert client.get("/v1/hardware/h200x-test").status_code == 404


def test_profiles_list_filter_and_page(client):
    everything = client.get("/v1/profiles").json()
    assert everything["total_layers"] == 14 and len(everything["layers"]) == 14
    assert {link["scope"] for link in everything["links"]} == {"intra_node", "inter_node"}
    a100 = client.get("/v1/profiles", params={"gpu": "a100-sxm-80g", "limit": 5}).json()
    assert len(a100["layers"]) == 5 and a100["total_layers"] == 14
    assert all(p["gpu"] == "a100-sxm-80g" for p in a100["layers"])
    assert [link["gpu"] for link in a100["links"]] == ["a100-sxm-80g"] * 2
    page2 = client.get("/v1/profiles", params={"gpu": "a100-sxm-80g", "offset": 5}).json()
    assert {p["id"] for p in page2["layers"]}.isdisjoint({p["id"] for p in a100["layers"]})
    assert client.get("/v1/profiles", params={"gpu": "cpu"}).json()["layers"] == []
    assert_problem(client.get("/v1/profiles", params={"limit": 5000}), 422, "limit")
    assert_problem(client.get("/v1/profiles", params={"gpu": "bad name"}), 422, "gpu")


def test_post_profiles_upserts_by_shape(client):
    first = client.post("/v1/profiles", json={"layers": [POINT]})
    assert first.status_code == 201, first.text
    assert first.json() == {"created": 1, "updated": 0, "unchanged": 0, "revisions": {"cpu": 2}}
    again = client.post("/v1/profiles", json={"layers": [POINT]})
    assert again.status_code == 200
    assert again.json() == {"created": 0, "updated": 0, "unchanged": 1, "revisions": {"cpu": 2}}
    faster = client.post("/v1/profiles", json={"layers": [dict(POINT, forward_ms=2.5)]})
    assert faster.json() == {"created": 0, "updated": 1, "unchanged": 0, "revisions": {"cpu": 3}}
    stored = client.get("/v1/profiles", params={"gpu": "cpu"}).json()["layers"]
    assert len(stored) == 1 and stored[0]["forward_ms"] == 2.5
    assert stored[0]["ffn_hidden_size"] == 2048 and stored[0]["origin"] == "api"


def test_a_layer_shape_given_twice_in_one_upload_is_refused_naming_both(client):
    """Two points of one shape in one request were both 'stored', the first replaced by
    the second ('created 1, updated 1'): the first one's times were lost without a word."""
    slower = dict(POINT, forward_ms=9.0)
    spelled_out = dict(POINT, ffn_hidden_size=4 * POINT["hidden_size"], weight_ms=1.0)
    for second in (slower, spelled_out, POINT):
        body = assert_problem(
            client.post("/v1/profiles", json={"layers": [POINT, dict(POINT, t=2), second]}),
            422,
            "body.layers: layers[2] has the same shape",
            "as layers[0]; send each shape once",
        )
        assert body["errors"][0]["loc"] == ["body", "layers"]
    assert client.get("/v1/profiles", params={"gpu": "cpu"}).json()["total_layers"] == 0
    assert client.get("/v1/hardware/cpu").json()["revision"] == 1


def test_a_link_given_twice_in_one_upload_is_refused_naming_both(client):
    link = {"gpu": "cpu", "scope": "inter_node", "kind": "eth", "bandwidth_gbps": 12.5}
    links = [dict(link, latency_us=20), dict(link, scope="intra_node", latency_us=1)]
    body = assert_problem(
        client.post("/v1/profiles", json={"links": [*links, dict(link, latency_us=30)]}),
        422,
        "body.links: links[2] has the same gpu and scope as links[0]; send each link once",
    )
    assert body["errors"][0]["loc"] == ["body", "links"]
    assert client.get("/v1/hardware/cpu").json()["inter_node"]["kind"] == "loopback-gloo"


def test_post_profiles_links(client):
    link = {
        "gpu": "cpu",
        "scope": "inter_node",
        "kind": "ethernet-100g",
        "bandwidth_gbps": 12.5,
        "latency_us": 20,
    }
    response = client.post("/v1/profiles", json={"links": [link]})
    assert response.status_code == 200  # the link existed: replaced, nothing created
    assert response.json()["updated"] == 1 and response.json()["revisions"] == {"cpu": 2}
    assert client.get("/v1/hardware/cpu").json()["inter_node"]["kind"] == "ethernet-100g"


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        (
            {"t": 3, "num_attention_heads": 16, "hidden_size": 1024},
            ["t = 3 does not divide num_attention_heads 16 or ffn_hidden_size 4096"],
        ),
        (
            {"num_attention_heads": 7, "hidden_size": 1024},
            ["hidden_size 1024 is not divisible by num_attention_heads 7"],
        ),
        ({"t": 2, "ffn_hidden_size": 1001}, ["t = 2 does not divide ffn_hidden_size 1001"]),
        (
            {"t": 2, "sequence_parallel": True, "seq_length": 127},
            ["t = 2 does not divide seq_length 127", "sequence_parallel"],
        ),
    ],
)
def test_a_layer_point_no_model_can_have_is_refused_naming_it(client, changes, needles):
    """t = 3 with 16 heads, or 7 heads of a hidden size of 1024, were stored (201) and
    raised the profile's revision, dropping its cached plans, where a plan request refuses
    such a model (or never searches such a t)."""
    revision = client.get("/v1/hardware/cpu").json()["revision"]
    stored = client.get("/v1/profiles", params={"gpu": "cpu"}).json()["total_layers"]
    layers = [POINT, dict(POINT, micro_batch_size=4) | changes]
    response = client.post("/v1/profiles", json={"layers": layers})
    problem = assert_problem(response, 422, *(f"body.layers.1: {n}" for n in needles[:1]))
    for needle in needles[1:]:
        assert needle in problem["detail"]
    assert problem["errors"][0]["loc"] == ["body", "layers", 1]
    assert client.get("/v1/hardware/cpu").json()["revision"] == revision
    assert client.get("/v1/profiles", params={"gpu": "cpu"}).json()["total_layers"] == stored


def test_a_layer_point_is_refused_in_the_words_of_the_plan_request(client):
    point = dict(POINT, num_attention_heads=7, hidden_size=1024)
    refused = assert_problem(client.post("/v1/profiles", json={"layers": [point]}), 422)
    request = example("tiny-cpu")
    request["model"] |= {"num_attention_heads": 7, "hidden_size": 1024}
    planned = assert_problem(client.post("/v1/plans", json=request), 422)
    assert refused["errors"][0]["msg"] == planned["errors"][0]["msg"]


def test_post_profiles_errors(make_client):
    client = make_client(max_profile_points=2)
    assert_problem(client.post("/v1/profiles", json={}), 422, "nothing to store")
    assert_problem(
        client.post("/v1/profiles", json={"layers": [dict(POINT, gpu="tpu-v9")]}),
        422,
        "'tpu-v9'",
        "POST /v1/hardware",
    )
    assert_problem(
        client.post(
            "/v1/profiles",
            json={"layers": [dict(POINT, micro_batch_size=mb) for mb in (1, 2, 4)]},
        ),
        422,
        "limit of 2 per request",
    )
    body = assert_problem(
        client.post("/v1/profiles", json={"layers": [dict(POINT, forward_ms=0)]}), 422
    )
    assert body["errors"][0]["loc"] == ["body", "layers", 0, "forward_ms"]
    assert_problem(
        client.post("/v1/profiles", json={"links": [{"gpu": "cpu", "scope": "rack", "kind": "x"}]}),
        422,
    )
