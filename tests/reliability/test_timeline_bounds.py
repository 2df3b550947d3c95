"""A candidate's timeline is bounded, cached and computed off the event loop (issue 16,
probe 3): the dashboard's timeline of a 64-stage pipeline with 16,384 micro-batches once
took 14 s, 68 MB and 2.4 GB on every call."""

from __future__ import annotations

import threading
import time
from typing import Any

from planner.plan import plan as real_plan
from tests.reliability.test_cost_bounds import _big_request


def _deep_pipeline_request() -> dict[str, Any]:
    """64 GPUs, batch 16,384 in micro-batches of 1: every layout of 1F1B, the deepest
    (p = 64, d = 1) among them with m = 16,384."""
    request = _big_request(64, top_k=30)
    request["model"].update(num_layers=64, hidden_size=1024, num_attention_heads=16)
    request["model"]["seq_length"] = 512
    request["search"].update(schedules=["1f1b"], recompute=["full"])
    return request


def test_the_timeline_of_a_huge_schedule_is_a_bounded_cached_summary(make_client):
    client = make_client(planner=real_plan)
    created = client.post("/v1/plans", json=_deep_pipeline_request())
    assert created.status_code == 201, created.text
    candidates = created.json()["candidates"]
    index = next(
        i
        for i, c in enumerate(candidates)
        if c["config"]["p"] == 64 and c["config"]["num_microbatches"] == 16384
    )
    url = f"{created.headers['location']}/timeline?candidate={index}"

    health: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            health.append(time.perf_counter() - started)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        started = time.perf_counter()
        first = client.get(url)
        first_s = time.perf_counter() - started
    finally:
        done.set()
        prober.join()
    assert first.status_code == 200, first.text
    body = first.json()
    # 64 x 16,384 x 2 actions: too many to draw one by one, so a per-device summary.
    assert body["mode"] == "summary" and body["num_actions"] >= 64 * 16384 * 2
    assert len(body["devices"]) == 64
    assert len(first.content) < 1_000_000
    # Was 14 s, 68 MB and 2.4 GB; a summary costs little, but this machine may be busy.
    assert first_s < 30.0, first_s
    # The summary is priced like the plan: its makespan is the candidate's step time.
    step = candidates[index]["predicted"]["iteration_time_s"]
    assert abs(body["makespan"] - step) <= 0.05 * step
    # /healthz answered while the timeline was computed (off the event loop).
    assert health and max(health) < 5.0, max(health)

    started = time.perf_counter()
    again = client.get(url)
    again_s = time.perf_counter() - started
    assert again.content == first.content
    assert again_s < first_s or again_s < 0.05  # from the cache, not recomputed


def test_an_action_timeline_is_windowed(make_client):
    client = make_client(planner=real_plan)
    created = client.post("/v1/plans", json=_deep_pipeline_request())
    candidates = created.json()["candidates"]
    small = next(
        i
        for i, c in enumerate(candidates)
        if c["config"]["p"] * c["config"]["num_microbatches"] <= 4096
    )
    url = f"{created.headers['location']}/timeline?candidate={small}&limit=100"
    page = client.get(url).json()
    assert page["mode"] == "actions"
    shown = sum(len(d["actions"]) for d in page["devices"])
    assert shown == 100 and page["truncated"] is True
    following = client.get(f"{url}&start_s={page['next_start_s']}").json()
    actions = [a for d in following["devices"] for a in d["actions"]]
    # The next page is the window from next_start_s: actions running then or later,
    # the first one not shown (starting at next_start_s) among them.
    assert all(a[4] >= page["next_start_s"] for a in actions)
    assert any(a[3] == page["next_start_s"] for a in actions)
    shown_before = {tuple(a) for d in page["devices"] for a in d["actions"]}
    assert any(tuple(a) not in shown_before for a in actions)
