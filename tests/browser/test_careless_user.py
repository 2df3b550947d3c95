"""The dashboard as a hurried person uses it: clicking on before a page has loaded, the
back button and reload in the middle of a form, values typed or pasted that the form cannot
read, a service that does not answer, only the keyboard, a phone. Headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.conftest import make_plan, screenshots
from tests.browser.test_inspect import TINY as INSPECT_TINY

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# The test_inspect model at a batch of 16, two micro-batch sizes and two schedules.
TINY = {
    "model": INSPECT_TINY["model"],
    "cluster": INSPECT_TINY["cluster"],
    "training": {**INSPECT_TINY["training"], "global_batch_size": 16},
    "search": {"micro_batch_sizes": [1, 2], "schedules": ["1f1b", "v-half"], "top_k": 6},
}

# Delays the answer to every fetch whose URL contains window.__slow (set by the test) by
# 1.5 s, inside the page: what a loaded server or a slow link does to one request.
SLOW_FETCH = """
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const answer = await realFetch(...args);
  if (window.__slow && String(args[0]).includes(window.__slow))
    await new Promise((r) => setTimeout(r, 1500));
  return answer;
};
"""


def _posts_to(page, path: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The bodies of the POST requests the page sends to `path` from now on."""
    sent: list[str] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.post_data or "")
            if r.method == "POST" and r.url.split("?")[0].endswith(path)
            else None
        ),
    )
    return sent


def _shown(page) -> dict:  # type: ignore[no-untyped-def, type-arg]
    page.click("#json-show")
    return json.loads(page.input_value("#request-json"))  # type: ignore[no-any-return]


def test_a_slow_page_does_not_replace_the_page_moved_to(server, page):
    page.add_init_script(SLOW_FETCH)
    page.goto(server + "/#/")
    page.wait_for_selector("h1:has-text('Plans')")
    page.evaluate("window.__slow = '/openapi.json'")
    page.click("a[data-nav=new]")  # the form waits for the request schema...
    page.click("a[data-nav=plans]")  # ...and the person has gone back to the plans
    page.wait_for_timeout(2500)
    assert page.url.endswith("#/")
    assert page.inner_text("h1") == "Plans"
    assert page.query_selector("#plan-form") is None


def test_a_missing_plan_says_what_to_do(server, page):
    page.goto(server + "/#/plans/0123456789abcdef0123456789abcdef/candidates/2")
    banner = page.wait_for_selector(".banner.bad")
    text = banner.inner_text()
    assert "0123456789abcdef0123456789abcdef" in text
    assert "mistyped" in text or "deleted" in text
    assert banner.query_selector("a[href='#/']") is not None


def test_an_unreachable_service_is_said_not_hung(server, page):
    plan_id = "0123456789abcdef0123456789abcdef"
    page.route(f"**/v1/plans/{plan_id}*", lambda route: route.abort())
    page.goto(f"{server}/#/plans/{plan_id}")
    banner = page.wait_for_selector(".banner.bad", timeout=5000)
    assert "reach" in banner.inner_text()
    page.unroute(f"**/v1/plans/{plan_id}*")
    # A proxy's error page is not shown as HTML source.
    page.route(
        f"**/v1/plans/{plan_id}*",
        lambda route: route.fulfill(
            status=502,
            content_type="text/html",
            body="<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
        ),
    )
    page.reload()
    banner = page.wait_for_selector(".banner.bad:has-text('502')", timeout=5000)
    assert "<" not in banner.inner_text()
    # A request sent while the service is down gives the button back and says why.
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    page.route("**/v1/plans", lambda route: route.abort())
    page.click("#submit")
    banner = page.wait_for_selector("#form-error:not([hidden])", timeout=5000)
    assert "reach" in banner.inner_text()
    assert page.is_enabled("#submit") and page.inner_text("#submit") == "Plan it"


def test_the_form_keeps_what_was_typed_across_back_and_reload(server, page):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    page.fill("#model\\.name", "my-model")
    page.fill("#model\\.num_layers", "12")
    page.fill("#search\\.micro_batch_sizes", "1, 2")
    page.check("#search\\.schedules input[value='gpipe']")
    page.uncheck("#search\\.schedules input[value='v-zb']")
    page.select_option("#training\\.precision", "fp16")
    typed = {
        "model.name": "my-model",
        "model.num_layers": "12",
        "search.micro_batch_sizes": "1, 2",
        "training.precision": "fp16",
    }

    def check() -> None:
        page.wait_for_selector("#submit")
        for field, value in typed.items():
            assert page.input_value("#" + field.replace(".", "\\.")) == value, field
        assert page.is_checked("#search\\.schedules input[value='gpipe']")
        assert not page.is_checked("#search\\.schedules input[value='v-zb']")

    page.click("a[data-nav=hardware]")  # to look up a GPU's name
    page.wait_for_selector("#profiles")
    page.go_back()
    check()
    page.reload()
    check()
    # And a way back to the example.
    page.click("#form-reset")
    assert page.input_value("#model\\.name") == "gpt3-13b"
    page.reload()
    page.wait_for_selector("#submit")
    assert page.input_value("#model\\.name") == "gpt3-13b"


def test_typed_values_the_form_cannot_read_are_marked_not_dropped(server, page):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    sent = _posts_to(page, "/v1/plans")
    # A number field holding what is not a number reads as empty in the browser: it used
    # to be left out of the request, so the field silently took its default.
    page.click("#search\\.top_k")
    page.keyboard.press("Control+A")
    page.keyboard.type("1e")
    page.click("#submit")
    error = page.wait_for_selector("[data-error='search.top_k']:not(:empty)")
    assert "number" in error.inner_text()
    assert page.get_attribute("#search\\.top_k", "aria-invalid") == "true"
    assert sent == []
    page.fill("#search\\.top_k", "5")
    # A list written as JSON, or with semicolons, is read as the numbers it holds.
    page.fill("#search\\.micro_batch_sizes", "[1, 2]")
    page.click("#json-paste summary")
    assert _shown(page)["search"]["micro_batch_sizes"] == [1, 2]
    page.fill("#search\\.micro_batch_sizes", "1; 4")
    assert _shown(page)["search"]["micro_batch_sizes"] == [1, 4]
    # A word in a list of numbers is named at its field, and nothing is sent.
    page.fill("#search\\.micro_batch_sizes", "1, two")
    page.click("#submit")
    error = page.wait_for_selector("[data-error='search.micro_batch_sizes']:not(:empty)")
    assert "two" in error.inner_text()
    assert sent == []
    # An emptied required field says it is required (not "Input should be a valid string").
    page.fill("#search\\.micro_batch_sizes", "")
    page.fill("#model\\.name", "")
    page.click("#submit")
    error = page.wait_for_selector("[data-error='model.name']:not(:empty)")
    assert "required" in error.inner_text().lower()
    assert sent == []
    page.fill("#model\\.name", "x")
    page.click("#submit")
    page.wait_for_url("**/#/plans/*", timeout=60_000)
    assert len(sent) == 1


@pytest.mark.parametrize(
    ("patch", "named"),
    [
        ({"cluster": {"gpu": "h100"}}, "h100"),
        ({"training": {"precision": "FP16"}}, "FP16"),
        ({"search": {"micro_batch_sizes": 2}}, "search.micro_batch_sizes"),
        ({"search": {"schedules": "v-zb"}}, "search.schedules"),
        ({"search": {"schedules": ["1f1b", "zb-v"]}}, "zb-v"),
        ({"training": {"flash_attention": "no"}}, "training.flash_attention"),
        ({"model": {"num_layers": "eight"}}, "model.num_layers"),
    ],
)
def test_a_pasted_value_the_form_cannot_hold_is_named(server, page, patch, named):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    request = json.loads(json.dumps(TINY))
    for group, values in patch.items():
        request[group].update(values)
    page.click("#json-paste summary")
    page.fill("#request-json", json.dumps(request))
    page.click("#json-fill")
    assert named in page.inner_text("#json-error")
    # Nothing was filled: the form still holds the preset, not half of the paste.
    assert page.input_value("#model\\.name") == "gpt3-13b"


def test_the_memory_sweep_does_not_read_an_empty_field_as_zero(server, page):
    page.goto(server + "/#/memory")
    page.wait_for_selector("#sweep-table tbody tr")
    sent = _posts_to(page, "/v1/simulate/memory-sweep")
    page.fill("#sweep\\.f", "")
    page.click("#sweep-submit")
    banner = page.wait_for_selector("#sweep-error:not([hidden])")
    assert "F" in banner.inner_text() and "number" in banner.inner_text()
    assert sent == []
    # The server's answer names the field as the page labels it, not the API's name.
    page.fill("#sweep\\.f", "12.96")
    page.fill("#sweep\\.devices", "1")
    page.click("#sweep-submit")
    page.wait_for_function("document.querySelector('#sweep-error').textContent.includes('2')")
    text = page.inner_text("#sweep-error")
    assert "devices" in text and "body." not in text and "num_devices" not in text
    assert page.get_attribute("#sweep\\.devices", "aria-invalid") == "true"
    # What was typed survives a look at another page and the back button.
    page.fill("#sweep\\.devices", "4")
    page.click("a[data-nav=hardware]")
    page.wait_for_selector("#profiles")
    page.go_back()
    page.wait_for_selector("#sweep-table tbody tr")
    assert page.input_value("#sweep\\.devices") == "4"


def test_every_candidate_and_rejected_row_opens_from_the_keyboard(server, page):
    plan = make_plan(server, TINY)
    assert len(plan["candidates"]) >= 2 and plan["rejected"]
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#candidates tbody tr")
    target = f"#/plans/{plan['id']}/candidates/2"
    for _ in range(120):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == target:
            break
    else:
        raise AssertionError("Tab never reaches the second candidate")
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail-title:has-text('Candidate #2')")
    assert page.url.endswith(target)
    # A rejected configuration has its link too, and a column sorts from the keyboard.
    assert page.query_selector(f"#rejected a[href='#/plans/{plan['id']}/rejected/1']")
    page.focus("#candidates th:has-text('peak GiB') button")
    page.keyboard.press("Enter")
    assert page.get_attribute("#candidates th:has-text('peak GiB')", "aria-sort") == "ascending"


def _focused_pick(page):  # type: ignore[no-untyped-def]
    return page.evaluate("document.activeElement.getAttribute('data-pick')")


def test_the_charts_points_open_from_the_keyboard_with_one_tab_stop(server, page):
    plan = make_plan(server, TINY)
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#scatter .pt-pick")
    # Every ranked candidate and every rejected one with a prediction is a point that opens.
    drawn = page.eval_on_selector_all(
        "#scatter .pt-pick",
        "ns => ns.map(n => [n.dataset.pick, Number(n.getAttribute('cx') ?? n.dataset.x)])",
    )
    expected = {f"candidates/{i}" for i in range(1, len(plan["candidates"]) + 1)}
    expected |= {f"rejected/{i}" for i, r in enumerate(plan["rejected"], 1) if r["predicted"]}
    assert {pick for pick, _ in drawn} == expected and len(drawn) == len(expected) > 2
    x_of = dict(drawn)
    # One stop in the Tab order, on the first candidate.
    assert page.eval_on_selector_all("#scatter [tabindex='0']", "ns => ns.length") == 1
    for _ in range(200):
        page.keyboard.press("Tab")
        if page.evaluate("!!document.activeElement.closest('#scatter')"):
            break
    else:
        raise AssertionError("Tab never reaches the chart")
    assert _focused_pick(page) == "candidates/1"
    # Home, then the right arrow visits every point once, left to right as drawn; at the
    # end it stays.
    page.keyboard.press("Home")
    visited = [_focused_pick(page)]
    for _ in range(len(drawn) - 1):
        page.keyboard.press("ArrowRight")
        visited.append(_focused_pick(page))
    assert sorted(visited) == sorted(expected)
    assert [x_of[v] for v in visited] == sorted(x_of[v] for v in visited)
    page.keyboard.press("ArrowRight")
    assert _focused_pick(page) == visited[-1]
    # Tab leaves the chart from wherever the arrows left the focus.
    page.keyboard.press("Tab")
    assert not page.evaluate("!!document.activeElement.closest('#scatter')")
    page.keyboard.press("Shift+Tab")
    assert _focused_pick(page) == visited[-1]
    # Enter opens the focused point's candidate, as a click does.
    second = visited.index("candidates/2")
    page.keyboard.press("End")
    for _ in range(len(visited) - 1 - second):
        page.keyboard.press("ArrowLeft")
    assert _focused_pick(page) == "candidates/2"
    page.keyboard.press("Enter")
    page.wait_for_selector("#detail-title:has-text('Candidate #2')")
    assert page.url.endswith(f"#/plans/{plan['id']}/candidates/2")


# Names every control that a screen reader would announce without one, and every text
# below the WCAG AA contrast ratio against its background.
A11Y = """() => {
  const problems = [];
  const named = (n) => n.getAttribute('aria-label') || n.getAttribute('aria-labelledby')
    || (n.labels && n.labels.length)
    || (['BUTTON', 'A', 'SUMMARY'].includes(n.tagName) && n.textContent.trim());
  for (const n of document.querySelectorAll('input, select, textarea, button, a[href], summary'))
    if (!named(n)) problems.push('no name: ' + n.outerHTML.slice(0, 80));
  for (const l of document.querySelectorAll('label[for]')) {
    const t = document.getElementById(l.htmlFor);
    if (!t || !t.labels || ![...t.labels].includes(l))
      problems.push('label for nothing: ' + l.htmlFor);
  }
  const names = {};
  for (const b of document.querySelectorAll('button:not(th button)')) {  // a heading's: its table
    const name = b.getAttribute('aria-label') || b.textContent.trim();
    names[name] = (names[name] || 0) + 1;
  }
  for (const [name, count] of Object.entries(names))
    if (count > 1) problems.push(`${count} buttons named "${name}"`);
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const linear = (x) => (x /= 255) <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
  const lum = ([r, g, b]) => 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
  const background = (e) => {
    for (; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || c[3] > 0.5) return c;
    }
    return [255, 255, 255];
  };
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const e = walk.currentNode.parentElement, text = walk.currentNode.textContent.trim();
    if (!text || e.closest('svg') || !e.offsetParent) continue;
    const [a, b] = [lum(rgb(getComputedStyle(e).color)), lum(background(e))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const big = parseFloat(getComputedStyle(e).fontSize) >= 24;
    if (ratio < (big ? 3 : 4.5))
      problems.push(`contrast ${ratio.toFixed(2)}: "${text.slice(0, 30)}"`);
  }
  return problems;
}"""


def test_every_control_has_a_name_and_text_is_readable(server, page):
    plan = make_plan(server, TINY)
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    page.click("#json-paste summary")
    assert page.evaluate(A11Y) == []
    assert page.get_by_role("group", name="schedules").count() == 1
    assert page.get_by_role("textbox", name="request as JSON").count() == 1
    # A field's hint and error are read with it.
    described = page.get_attribute("#model\\.hidden_size", "aria-describedby") or ""
    assert "model.hidden_size-hint" in described.split()
    page.goto(f"{server}/#/plans/{plan['id']}/candidates/2")
    page.wait_for_selector("#gantt[data-actions-per-device]")
    assert page.evaluate(A11Y) == []


# The smallest text on any chart of the page, in screen pixels: a chart is drawn in its
# viewBox's units and scaled to its box, its text with it (at 375 px it was 6 px).
SMALLEST_CHART_TEXT = """() => {
  let smallest = Infinity;
  for (const svg of document.querySelectorAll("svg[viewBox]")) {
    const drawn = svg.viewBox.baseVal.width, shown = svg.getBoundingClientRect().width;
    for (const text of svg.querySelectorAll("text"))
      smallest = Math.min(smallest, parseFloat(getComputedStyle(text).fontSize) * shown / drawn);
  }
  return smallest;
}"""


def test_every_page_fits_a_phone(server, page):
    body = json.loads(Path("examples/gpt3-96b-32xa100.json").read_text())
    plan = make_plan(server, body)
    page.set_viewport_size({"width": 375, "height": 740})
    overflow = "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    for where, ready in [
        ("#/", "#plans"),
        ("#/new", "#submit"),
        ("#/hardware", "#profiles"),
        ("#/memory", "#sweep-table tbody tr"),
        (f"#/plans/{plan['id']}/candidates/2", "#gantt[data-actions-per-device]"),
        (f"#/plans/{plan['id']}/rejected/1", "#rejected-breakdown"),
    ]:
        page.goto(f"{server}/{where}")
        page.reload()
        page.wait_for_selector(ready)
        page.wait_for_timeout(300)
        assert page.evaluate(overflow) <= 0, where
        assert page.evaluate(SMALLEST_CHART_TEXT) >= 9, where
    screenshots(page, "phone-rejected-detail")


def test_the_by_schedule_table_opens_sorted_by_step_time(server, page):
    """It opened sorted by the best configuration's text (the step time's column index less
    one, from before the weights column came in), an order that says nothing of speed."""
    plan = make_plan(
        server,
        {**TINY, "search": {**TINY["search"], "schedules": ["1f1b", "gpipe", "v-half", "v-zb"]}},
    )
    page.goto(f"{server}/#/plans/{plan['id']}")
    page.wait_for_selector("#by-schedule tbody tr")
    heading = page.query_selector("#by-schedule th[aria-sort]")
    assert heading is not None and heading.inner_text() == "step s"
    assert heading.get_attribute("aria-sort") == "ascending"
    shown = [
        row.query_selector_all("td")[0].inner_text()
        for row in page.query_selector_all("#by-schedule tbody tr")
    ]
    expected = [
        s["schedule"]
        for s in sorted(
            plan["by_schedule"],
            key=lambda s: (
                float("inf") if s["best_iteration_time_s"] is None else s["best_iteration_time_s"]
            ),
        )
    ]
    assert shown == expected


@pytest.mark.parametrize(
    "link, said",
    [
        ("/#/plans/zz%20", "zz%20"),  # was read as plan "zz"
        ("/#/plans/0123456789abcdef0123456789abcdef/candidates/2x", "a plan's links are"),
    ],
)
def test_a_mistyped_plan_link_is_said_whole(server, page, link, said):
    page.goto(server + link)
    banner = page.wait_for_selector(".banner.bad")
    assert said in banner.inner_text()
    assert banner.query_selector("a[href='#/']") is not None


def test_a_waiting_plan_keeps_refreshing_through_a_dropped_network(server, page):
    """A plan page refreshes while its search runs; one refresh that found no service (a
    dropped Wi-Fi, a restarting service behind its proxy) ended the refreshing for good,
    with the page showing the error until reloaded."""
    plan_id = "0123456789abcdef0123456789abcdef"
    queued = json.dumps({"id": plan_id, "status": "queued"})
    answers = iter(["queued", "abort", "502", "queued", "queued", "queued", "queued"])

    def answer(route):  # type: ignore[no-untyped-def]
        what = next(answers, "queued")
        if what == "abort":
            route.abort()
        elif what == "502":
            route.fulfill(status=502, content_type="text/html", body="<html>nginx</html>")
        else:
            route.fulfill(status=200, content_type="application/json", body=queued)

    page.route(f"**/v1/plans/{plan_id}*", answer)
    page.goto(f"{server}/#/plans/{plan_id}")
    page.wait_for_selector("text=Status: queued")
    lost = page.wait_for_selector("#plan-wait .banner.bad:has-text('no answer')", timeout=5000)
    assert "tries again in 2 s" in lost.inner_text()
    assert "Status: queued" in page.inner_text("#app")  # what was known stays
    page.wait_for_selector("#plan-wait .banner.bad:has-text('answered 502')", timeout=5000)
    assert "tries again in 4 s" in page.inner_text("#plan-wait")
    # Back in contact: the status shows again without the banner, and refreshing goes on.
    page.wait_for_function(
        "!document.querySelector('#plan-wait .banner')"
        " && document.body.innerText.includes('Status: queued')",
        timeout=8000,
    )
    page.route(
        f"**/v1/plans/{plan_id}*",
        lambda route: route.fulfill(status=404, content_type="application/json", body="{}"),
    )
    page.wait_for_selector("text=No plan", timeout=5000)
