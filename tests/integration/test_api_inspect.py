"""What the dashboard reads beyond the plan: a rejected configuration's memory, a timeline's
memory curves and counts, and the API documentation pages with their own assets."""

from __future__ import annotations

import pytest

from tests.integration.conftest import assert_problem, example, tiny


def _check_memory(client, plan, index):  # type: ignore[no-untyped-def]
    response = client.get(f"/v1/plans/{plan['id']}/rejected/{index}")
    assert response.status_code == 200, response.text
    body = response.json()
    rejected = plan["rejected"][index]
    assert body["config"] == rejected["config"] and body["index"] == index
    assert len(body["memory"]) == body["config"]["p"]
    totals = rejected["predicted"]["memory_gib_per_device"]
    for device, total in zip(body["memory"], totals, strict=True):
        parts = ("parameters", "gradients", "optimizer", "activations", "allowance")
        assert sum(device[k] for k in parts) == pytest.approx(device["total"], rel=1e-9)
        if rejected["reason"].startswith("out of memory:"):  # counted as the search did
            assert device["total"] == pytest.approx(total, abs=0.01)
        else:  # the search stopped at the weights; the answer adds the activations
            assert device["total"] >= total - 0.01 and device["activations"] > 0


def test_a_rejected_configuration_answers_its_memory_per_device(client):
    plan = client.post("/v1/plans?include_rejected=true", json=example("gpt3-13b-8xa100")).json()
    rejected = plan["rejected"]
    for kind in ("out of memory:", "out of memory before any activation"):
        found = [i for i, r in enumerate(rejected) if r["reason"].startswith(kind)]
        assert found, kind
        _check_memory(client, plan, found[0])
    unpriced = [i for i, r in enumerate(rejected) if not r["predicted"]]
    if unpriced:
        assert_problem(
            client.get(f"/v1/plans/{plan['id']}/rejected/{unpriced[0]}"), 409, "before pricing"
        )
    assert_problem(
        client.get(f"/v1/plans/{plan['id']}/rejected/{len(rejected)}"),
        404,
        f"0..{len(rejected) - 1}",
    )


def test_a_timeline_counts_what_it_draws_and_has_memory_curves(client):
    plan = client.post(
        "/v1/plans", json=tiny(**{"search.schedules": ["2bw"], "search.top_k": 3})
    ).json()
    index, chosen = next((i, c) for i, c in enumerate(plan["candidates"]) if c["config"]["p"] > 1)
    timeline = client.get(f"/v1/plans/{plan['id']}/timeline?candidate={index}").json()
    drawn = {a[2] for d in timeline["devices"] for a in d["actions"]}
    assert timeline["num_batches"] == 2
    assert timeline["num_microbatches"] == len(drawn) == 2 * chosen["config"]["num_microbatches"]
    for device, total in zip(
        timeline["devices"], chosen["predicted"]["memory_gib_per_device"], strict=True
    ):
        curve = device["memory_curve"]
        assert curve[0][0] == 0 and all(
            a[0] <= b[0] for a, b in zip(curve, curve[1:], strict=False)
        )
        assert max(v for _, v in curve) <= total + 1e-3
        assert device["memory"]["total"] == pytest.approx(total, abs=0.01)


@pytest.mark.parametrize(
    ("page", "asset"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")]
)
def test_the_documentation_pages_use_their_own_assets(client, page, asset):
    html = client.get(page).text
    assert f"/docs-assets/{asset}" in html
    assert "cdn.jsdelivr" not in html and "fonts.googleapis" not in html
    response = client.get(f"/docs-assets/{asset}")
    assert response.status_code == 200 and len(response.content) > 100_000
