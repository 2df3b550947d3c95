"""Every candidate inspectable, a Gantt chart readable at every scale, charts that do not
mislead: the plan page as a person uses it, in headless Chromium."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from planner.schedules import generate
from tests.browser.conftest import make_plan, screenshots

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TINY = {
    "model": {
        "name": "tiny-gpt",
        "num_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1024,
    },
    "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
    "training": {"global_batch_size": 96, "precision": "fp32"},
}


def _tiny(**search: object) -> dict:  # type: ignore[type-arg]
    return {**TINY, "search": {"micro_batch_sizes": [1], "top_k": 20, **search}}


def _rank_of(plan: dict, **config: object) -> int:  # type: ignore[type-arg]
    """1-based rank of the first ranked candidate whose config has these values."""
    for rank, candidate in enumerate(plan["candidates"], start=1):
        if all(candidate["config"][k] == v for k, v in config.items()):
            return rank
    raise AssertionError(f"no candidate with {config}")


def _data(page, selector: str, name: str):  # type: ignore[no-untyped-def]
    return json.loads(page.get_attribute(selector, f"data-{name}"))


def _pixel(page, selector: str, x: float, y: float) -> str:  # type: ignore[no-untyped-def]
    """The colour (#rrggbb) a canvas shows at CSS pixel (x, y)."""
    return page.eval_on_selector(
        selector,
        """(c, [x, y]) => {
             const r = window.devicePixelRatio || 1;
             const ctx = c.getContext('2d');
             const d = ctx.getImageData(Math.round(x * r), Math.round(y * r), 1, 1).data;
             const hex = (v) => v.toString(16).padStart(2, '0');
             return '#' + hex(d[0]) + hex(d[1]) + hex(d[2]);
           }""",
        [x, y],
    )


def _time_x(page, t: float) -> float:  # type: ignore[no-untyped-def]
    left, right, _ = _data(page, "#gantt", "frame")
    start, end = _data(page, "#gantt", "view")
    return left + (t - start) / (end - start) * (right - left)


def test_any_ranked_candidate_opens_with_its_own_schedule_and_memory(server, page):
    plan = make_plan(server, _tiny(schedules=["1f1b", "gpipe"]))
    rank = next(
        r
        for r, c in enumerate(plan["candidates"], start=1)
        if r > 1 and c["config"]["p"] > 1 and c["config"]["schedule"] == "gpipe"
    )
    chosen = plan["candidates"][rank - 1]
    config = chosen["config"]
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#gantt[data-actions-per-device]")
    page.click(f"#candidates tr[data-candidates='{rank}']")
    page.wait_for_url(f"**/#/plans/{plan['id']}/candidates/{rank}")
    page.wait_for_function(
        f"document.querySelector('#gantt-heading').dataset.microbatches == "
        f"{config['num_microbatches']}"
    )
    assert f"Candidate #{rank}" in page.inner_text("#detail-title")
    assert f"p{config['p']} d{config['d']}" in page.inner_text("#detail-title")
    assert page.query_selector(f"#candidates tr.selected[data-candidates='{rank}']")

    def check_detail() -> None:
        # The Gantt chart draws this candidate's schedule: every compute action per device.
        shown = _data(page, "#gantt", "actions-per-device")
        schedule = generate(config["schedule"], config["p"], config["num_microbatches"])
        assert shown == [sum(1 for a in row if a.kind.is_compute) for row in schedule.actions]
        # Memory bars and the per-device table: one per pipeline device, with its totals.
        bars = page.query_selector_all("#memory-bars .mem-bar")
        assert len(bars) == config["p"]
        totals = [float(b.get_attribute("data-total")) for b in bars]
        assert totals == pytest.approx(chosen["predicted"]["memory_gib_per_device"], abs=0.01)
        assert len(page.query_selector_all("#breakdown tbody tr")) == config["p"]
        # Memory over the step: one curve per device, never above its planned peak.
        curves = page.query_selector_all("#memory-time .mem-curve")
        assert len(curves) == config["p"]
        for curve, total in zip(curves, totals, strict=True):
            assert float(curve.get_attribute("data-peak")) <= total + 0.01
        # The launch block is this candidate's.
        assert chosen["launch"]["torchrun"][0] in page.inner_text("#launch")
        assert page.get_attribute("#launch-json", "href") == (
            f"/v1/plans/{plan['id']}/candidates/{rank - 1}/launch"
        )

    check_detail()
    # The URL names the candidate: a reload (or a shared link) shows the same one.
    page.reload()
    page.wait_for_selector("#gantt[data-actions-per-device]")
    assert f"Candidate #{rank}" in page.inner_text("#detail-title")
    check_detail()
    screenshots(page, "candidate-detail")


def test_gpipe_memory_curve_holds_every_microbatch_before_the_first_backward(server, page):
    """GPipe saves all m micro-batches of its stage before any backward: each device's
    curve climbs in m equal steps from its lowest level to its peak (a hand count)."""
    plan = make_plan(
        server,
        {**_tiny(schedules=["gpipe"]), "training": {**TINY["training"], "global_batch_size": 8}},
    )
    rank = _rank_of(plan, p=4)
    page.goto(f"{server}/#/plans/{plan['id']}/candidates/{rank}")
    page.wait_for_selector("#memory-time .mem-curve")
    timeline = page.evaluate(
        f"fetch('/v1/plans/{plan['id']}/timeline?candidate={rank - 1}').then(r => r.json())"
    )
    m = plan["candidates"][rank - 1]["config"]["num_microbatches"]
    for device in timeline["devices"]:
        levels = [level for _, level in device["memory_curve"]]
        rises = [b - a for a, b in zip(levels, levels[1:], strict=False) if b > a + 1e-9]
        assert len(rises) >= m and max(levels) - min(levels) == pytest.approx(
            sum(rises[:m]), rel=1e-3
        )
        assert rises[:m] == pytest.approx([rises[0]] * m, rel=1e-3)


def test_a_rejected_configuration_shows_its_memory(server, page):
    plan = make_plan(server, json.loads(Path("examples/gpt3-96b-32xa100.json").read_text()))
    oom = [
        (n, r)
        for n, r in enumerate(plan["rejected"], start=1)
        if r["predicted"] and r["reason"].startswith("out of memory:")
    ]
    n, rejected = oom[len(oom) // 2]
    page.goto(f"{server}/#/plans/{plan['id']}/rejected/{n}")
    page.wait_for_selector("#rejected-bars .mem-bar", timeout=60_000)
    assert page.inner_text("#rejected-reason") == rejected["reason"]
    bars = page.query_selector_all("#rejected-bars .mem-bar")
    assert len(bars) == rejected["config"]["p"]
    totals = [float(b.get_attribute("data-total")) for b in bars]
    # The memory the search rejected it for, device by device.
    assert totals == pytest.approx(rejected["predicted"]["memory_gib_per_device"], abs=0.01)
    # Its row is shown (on its page of the table) and marked.
    assert page.query_selector(f"#rejected tr.selected[data-rejected='{n}']")
    screenshots(page, "rejected-detail")


def test_gantt_overview_busy_and_idle_at_96_microbatches(server, page):
    plan = make_plan(server, _tiny(schedules=["1f1b"]))
    rank = _rank_of(plan, p=4, num_microbatches=96)
    page.goto(f"{server}/#/plans/{plan['id']}/candidates/{rank}")
    page.wait_for_selector("#gantt-overview[data-busy]")
    timeline = page.evaluate(
        f"fetch('/v1/plans/{plan['id']}/timeline?candidate={rank - 1}').then(r => r.json())"
    )
    # Busy share per device: the union of its actions over the makespan.
    expected = []
    for device in timeline["devices"]:
        spans = sorted((a[3], a[4]) for a in device["actions"])
        busy, reach = 0.0, -math.inf
        for s, e in spans:
            if e > reach:
                busy += e - max(s, reach)
                reach = e
        expected.append(busy / timeline["makespan"])
    assert _data(page, "#gantt-overview", "busy") == pytest.approx(expected, abs=1e-3)
    # The last device waits for the first forward to cross three stages: shaded idle there;
    # then its first forward in the forward colour.
    colors = _data(page, "#gantt", "colors")
    row_h = float(page.get_attribute("#gantt", "data-row-h"))
    last = timeline["devices"][3]["actions"][0]
    y = 3 * row_h + row_h / 2
    assert _pixel(page, "#gantt", _time_x(page, last[3] / 2), y) == "#e4e6eb"
    assert _pixel(page, "#gantt", _time_x(page, (last[3] + last[4]) / 2), y) == colors["F"]
    # The legend lists the kinds present, no more (1F1B: forward, fused backward, step).
    kinds = {a[0] for d in timeline["devices"] for a in d["actions"]}
    assert set(_data(page, "#gantt", "kinds")) == kinds == {"F", "BW", "STEP"}
    legend = [
        s.get_attribute("data-kind") for s in page.query_selector_all("#gantt-legend [data-kind]")
    ]
    assert sorted(legend) == sorted(kinds)
    # Round ticks, all inside the frame, the last one too.
    _, _, width = _data(page, "#gantt", "frame")
    ticks = _data(page, "#gantt", "ticks")
    assert len(ticks) >= 3
    for _, left, right in ticks:
        assert 0 <= left and right <= width
    step = ticks[1][0] - ticks[0][0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 6) in (1, 2, 5)
    assert all(abs(v / step - round(v / step)) < 1e-6 for v, _, _ in ticks)
    # Labels: none crammed into 96-wide micro-batches at the whole step; zoomed in they fit.
    whole = int(page.get_attribute("#gantt", "data-labels"))
    for _ in range(4):
        page.click("#gantt-zoom-in")
    zoomed = int(page.get_attribute("#gantt", "data-labels"))
    assert zoomed > 0 and zoomed > whole
    page.click("#gantt-whole")
    screenshots(page, "gantt-96-microbatches")


def test_v_shape_chunks_in_two_shades(server, page):
    plan = make_plan(server, _tiny(schedules=["v-half"]))
    rank = _rank_of(plan, p=4)
    page.goto(f"{server}/#/plans/{plan['id']}/candidates/{rank}")
    page.wait_for_selector("#gantt[data-kinds]")
    kinds = _data(page, "#gantt", "kinds")
    assert {"F", "F2", "B", "B2", "W", "W2"} <= set(kinds)
    colors = _data(page, "#gantt", "colors")
    assert colors["F"] != colors["F2"] and colors["B"] != colors["B2"]
    legend = page.inner_text("#gantt-legend")
    assert "forward, chunk 1" in legend and "forward, chunk 2" in legend
    # Device 0's second chunk is stage 2p-1 = 7 (the V): its forward is in the second shade.
    timeline = page.evaluate(
        f"fetch('/v1/plans/{plan['id']}/timeline?candidate={rank - 1}').then(r => r.json())"
    )
    assert timeline["devices"][0]["stages"] == [0, 7]
    for _ in range(3):
        page.click("#gantt-zoom-in")
    page.click("#gantt-whole")
    row_h = float(page.get_attribute("#gantt", "data-row-h"))
    first = next(a for a in timeline["devices"][0]["actions"] if a[0] == "F" and a[1] == 7)
    middle = (first[3] + first[4]) / 2
    # At the whole step a forward can be a couple of pixels wide, its edges blended into the
    # sample: scroll to zoom in on it (the wheel zooms about the pointer) until it is wide.
    box = page.locator("#gantt").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + _time_x(page, middle), box["y"] + row_h / 2)
    for _ in range(8):
        page.mouse.wheel(0, -100)
    assert _time_x(page, first[4]) - _time_x(page, first[3]) >= 8
    x = _time_x(page, middle)
    assert _pixel(page, "#gantt", x, row_h / 2 + 3) == colors["F2"]
    screenshots(page, "gantt-v-half")


def test_2bw_heading_counts_what_is_drawn(server, page):
    plan = make_plan(server, _tiny(schedules=["2bw"], allow_stale_weights=True))
    rank = _rank_of(plan, p=4, num_microbatches=96)
    page.goto(f"{server}/#/plans/{plan['id']}/candidates/{rank}")
    page.wait_for_selector("#gantt[data-actions-per-device]")
    timeline = page.evaluate(
        f"fetch('/v1/plans/{plan['id']}/timeline?candidate={rank - 1}').then(r => r.json())"
    )
    drawn = len({a[2] for d in timeline["devices"] for a in d["actions"]})
    assert drawn == 192
    heading = page.inner_text("#gantt-heading")
    assert "192 micro-batches" in heading and "2 batches of 96" in heading
    assert int(page.get_attribute("#gantt-heading", "data-microbatches")) == drawn


def test_scatter_and_rejected_table_do_not_mislead(server, page):
    plan = make_plan(server, json.loads(Path("examples/gpt3-96b-32xa100.json").read_text()))
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#scatter .pt-oom")
    # Out-of-memory points at their real value: ordered as their memory, not pinned.
    points = page.eval_on_selector_all(
        "#scatter .pt-oom", "ns => ns.map(n => [Number(n.dataset.gib), Number(n.dataset.x)])"
    )
    assert len(points) == sum(1 for r in plan["rejected"] if r["predicted"])
    points.sort()
    for (gib_a, x_a), (gib_b, x_b) in zip(points, points[1:], strict=False):
        assert x_a <= x_b + 1e-6
        if gib_b > gib_a * 1.05:
            assert x_b > x_a
    assert len({round(x) for _, x in points}) > 5
    assert page.query_selector("#oom-band")
    # Round ticks on both axes.
    for cls in ("tick-x:not(.tick-band)", "tick-y"):
        values = page.eval_on_selector_all(
            f"#scatter .{cls}", "ns => ns.map(n => Number(n.dataset.value))"
        )
        step = values[1] - values[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 5), values
        assert all(abs(v / step - round(v / step)) < 1e-6 for v in values)
    # The frontier has a line of its own in the legend.
    assert page.query_selector("#scatter-legend [data-legend='frontier'] svg line")
    # Rejections grouped by reason with their counts (numbers in a reason are details).
    kinds = Counter(
        re.sub(r"\b\d+(?:\.\d+)?\b", "n", re.split(r"[:;(]", r["reason"])[0]).strip()
        for r in plan["rejected"]
    )
    rows = page.eval_on_selector_all(
        "#rejected-reasons tbody tr",
        "rs => rs.map(r => [r.dataset.kind, Number(r.cells[1].innerText.replace(/,/g, ''))])",
    )
    assert dict(rows) == dict(kinds)
    # Paged through every row.
    seen: set[int] = set()
    while True:
        seen |= {
            int(n)
            for n in page.eval_on_selector_all(
                "#rejected tbody tr", "rs => rs.map(r => r.dataset.rejected)"
            )
        }
        if page.get_attribute("#rejected-next", "disabled") is not None:
            break
        page.click("#rejected-next")
    assert seen == set(range(1, len(plan["rejected"]) + 1))
    screenshots(page, "plan-charts")


def test_context_parallel_candidates_show_their_cp(server, page):
    """A plan that searches cp = 2 (long sequences) names cp in the candidates table and in
    each candidate's configuration, as the CLI does; a plan without cp has no cp column."""
    request = {
        **TINY,
        # bf16: context parallelism runs only on Megatron-LM, whose flash attention has no
        # fp32 kernel.
        "training": {**TINY["training"], "flash_attention": True, "precision": "bf16"},
        "search": {"micro_batch_sizes": [1], "top_k": 20, "context_parallel": [2]},
    }
    plan = make_plan(server, request)
    assert plan["candidates"] and all(c["config"]["cp"] == 2 for c in plan["candidates"])
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#candidates tr[data-candidates='1']")
    headers = [h.strip() for h in page.locator("#candidates thead th").all_inner_texts()]
    column = headers.index("cp")
    assert headers[column - 1] == "t"
    first = page.locator("#candidates tr[data-candidates='1'] td").all_inner_texts()
    assert first[column].strip() == "2"
    page.click("#candidates tr[data-candidates='1']")
    page.wait_for_selector("#detail-title")
    config = plan["candidates"][0]["config"]
    assert f"t{config['t']} cp2 p{config['p']} d{config['d']}" in page.inner_text("#detail-title")

    plain = make_plan(server, _tiny(schedules=["1f1b"]))
    page.goto(f"{server}/#/plans/{plain['id']}")
    page.wait_for_selector("#candidates tr[data-candidates='1']")
    headers = [h.strip() for h in page.locator("#candidates thead th").all_inner_texts()]
    assert "cp" not in headers and "t" in headers


def test_an_adaptive_plan_draws_its_chosen_schedule_and_says_what_was_not_searched(server, page):
    from planner.launch.config import ScheduleReference

    body = _tiny(schedules=["v-adaptive"], micro_batch_sizes=[1, 2, 4])
    body["training"] = {**TINY["training"], "global_batch_size": 13}  # only mb 1 with d 1
    plan = make_plan(server, body)
    best = plan["best"]
    page.goto(f"{server}/#/plans/{plan['id']}")
    notes = page.wait_for_selector("#plan-notes").inner_text()
    assert notes.splitlines() == [f"• {note}" for note in plan["notes"]]
    assert "micro-batch sizes 2, 4 not searched" in notes
    # The Gantt chart draws the schedule the plan's search chose, as the executor builds it.
    canvas = page.wait_for_selector("#gantt[data-actions-per-device]", timeout=60_000)
    shown = json.loads(canvas.get_attribute("data-actions-per-device"))
    built = ScheduleReference.model_validate(best["launch"]["executor_config"]["schedule"]).build()
    assert shown == [sum(1 for a in row if a.kind.is_compute) for row in built.actions]


def test_a_plan_page_shows_the_servers_warnings_and_why_nothing_fits(server, page):
    # A model far too big for the cpu profile's memory, and a CP-SAT time limit above the
    # server's 30 s cap: the server lowers it and says so; nothing fits, and the page says
    # why in the CLI's words (the API's own warning, without its query-parameter hint).
    body = {
        **TINY,
        "model": {**TINY["model"], "hidden_size": 16384, "num_attention_heads": 32},
        "search": {
            "micro_batch_sizes": [1],
            "schedules": ["1f1b"],
            "method": "cpsat",
            "time_limit_s": 45,
        },
    }
    plan = make_plan(server, body)
    assert plan["best"] is None and len(plan["warnings"]) == 2
    lowered, no_fit = plan["warnings"]
    page.goto(f"{server}/#/plans/{plan['id']}")
    shown = page.wait_for_selector("#plan-warnings").inner_text()
    assert shown.splitlines() == [f"• {lowered}"]
    assert "lowered to this server's cap of 30 s" in shown
    banner = page.inner_text("#no-fit")
    assert banner.startswith("No configuration fits in memory (")
    assert "more GPUs (cluster.num_nodes)" in banner
    assert no_fit.split(" ?include_rejected")[0] in banner and "include_rejected" not in banner
    assert "The rejected list below says why for each" in banner
    # No empty best-candidate section on a plan without one.
    assert page.locator("#best").count() == 0

    fits = make_plan(server, _tiny(schedules=["1f1b"]))
    assert fits["best"] is not None and fits["warnings"] == []
    page.goto(f"{server}/#/plans/{fits['id']}")
    page.wait_for_selector("#best")
    assert page.locator("#plan-warnings").count() == 0 and page.locator("#no-fit").count() == 0
