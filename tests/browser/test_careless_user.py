"""The dashboard as a hurried person uses it: clicking on before a page has loaded, the
back button and reload in the middle of a form, values typed or pasted that the form cannot
read, a service that does not answer, only the keyboard, a phone. Headless Chromium."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


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
