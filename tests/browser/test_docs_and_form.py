"""The API documentation without a network, and the request form: every field of the
request, a pasted request, and errors shown at their fields. Headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest

from planner.specs import PlanRequest
from tests.browser.conftest import screenshots

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _offline(page, server: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Abort every request that leaves the server (as on a machine with no network);
    the list records what was attempted."""
    host = urlparse(server).netloc
    attempted: list[str] = []

    def handle(route) -> None:  # type: ignore[no-untyped-def]
        if urlparse(route.request.url).netloc == host:
            route.continue_()
        else:
            attempted.append(f"{route.request.resource_type} {route.request.url}")
            route.abort()

    page.route("**/*", handle)
    return attempted


def test_swagger_ui_works_without_a_network(server, page):
    attempted = _offline(page, server)
    page.goto(f"{server}/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.eval_on_selector_all(
        ".opblock-summary-path", "ns => ns.map(n => n.getAttribute('data-path'))"
    )
    assert "/v1/plans" in paths and "/v1/simulate" in paths
    assert attempted == []
    screenshots(page, "docs-swagger", full_page=False)


def test_redoc_works_without_a_network(server, page):
    attempted = _offline(page, server)
    page.goto(f"{server}/redoc")
    page.wait_for_selector("h2:has-text('Plan a training run')", timeout=30_000)
    # ReDoc's bundle links its "powered by" logo from its CDN; everything else is local.
    assert [a for a in attempted if not a.startswith("image https://cdn.redoc.ly/")] == []
    screenshots(page, "docs-redoc", full_page=False)


def _leaf_fields() -> list[str]:
    schema = PlanRequest.model_json_schema()
    out = []
    for group, ref in schema["properties"].items():
        spec = schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]
        out += [f"{group}.{name}" for name in spec["properties"]]
    return out


def test_the_form_has_every_field_of_the_request(server, page):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    fields = _leaf_fields()
    assert {"model.ffn_hidden_size", "search.micro_batch_sizes", "search.runtime"} <= set(fields)
    shown = page.eval_on_selector_all("[data-field]", "ns => ns.map(n => n.dataset.field)")
    assert sorted(shown) == sorted(fields)
    screenshots(page, "form")


def test_a_pasted_request_fills_the_form(server, page):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    example = json.loads(Path("examples/gpt3-96b-32xa100.json").read_text())
    example["search"]["micro_batch_sizes"] = [1, 2]
    example["model"]["ffn_hidden_size"] = 4 * example["model"]["hidden_size"]
    page.click("#json-paste summary")
    page.fill("#request-json", json.dumps(example))
    page.click("#json-fill")
    assert page.input_value("#model\\.hidden_size") == str(example["model"]["hidden_size"])
    assert page.input_value("#search\\.micro_batch_sizes") == "1, 2"
    # Read back: what the form sends is the pasted request, defaults filled in.
    page.click("#json-show")
    sent = json.loads(page.input_value("#request-json"))
    assert PlanRequest.model_validate(sent) == PlanRequest.model_validate(example)
    # A typo is named, not ignored.
    page.fill("#request-json", json.dumps({**example, "model": {"hiden_size": 5}}))
    page.click("#json-fill")
    assert "model.hiden_size" in page.inner_text("#json-error")


def test_errors_are_marked_at_their_fields(server, page):
    page.goto(server + "/#/new")
    page.wait_for_selector("#submit")
    page.fill("#model\\.hidden_size", "256")
    page.fill("#model\\.num_attention_heads", "7")  # 256 is not divisible by 7
    page.click("#submit")
    banner = page.wait_for_selector("#form-error:not([hidden])")
    text = banner.inner_text()
    assert "divisible" in text and not text.startswith("body")
    marked = page.eval_on_selector_all(".field-error", "ns => ns.map(n => n.dataset.field)")
    assert sorted(marked) == ["model.hidden_size", "model.num_attention_heads"]
    assert "divisible" in page.inner_text("[data-error='model.num_attention_heads']")
    # A field-level error lands on its own field.
    page.fill("#model\\.num_attention_heads", "8")
    page.fill("#search\\.micro_batch_sizes", "0, 2")
    page.click("#submit")
    page.wait_for_selector(".field-error[data-field='search.micro_batch_sizes']")
    marked = page.eval_on_selector_all(".field-error", "ns => ns.map(n => n.dataset.field)")
    assert marked == ["search.micro_batch_sizes"]
    screenshots(page, "form-errors")
