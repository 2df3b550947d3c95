"""The dashboard on a server whose reads and writes need tokens: the page loads without one,
says where a token goes, and sends the one a person enters with every request. Headless
Chromium."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.conftest import serving
from tests.browser.test_dashboard import _fill_tiny_request

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

READ, WRITE = "r3ad-secret", "wr1te-secret"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens = f"dash:read:{READ}; ci:write:{WRITE}"
    with serving(tmp_path_factory.mktemp("guarded"), STAGEWRIGHT_API_TOKENS=tokens) as url:
        yield url


def _enter_token(page, token: str) -> None:  # type: ignore[no-untyped-def]
    page.fill("#api-token", token)
    page.dispatch_event("#api-token", "change")


def test_the_dashboard_asks_for_a_token_and_sends_the_one_entered(guarded, page):
    page.goto(guarded + "/")
    banner = page.wait_for_selector(".banner.bad")
    assert "enter one in the Token field" in banner.inner_text()

    _enter_token(page, "not-a-token")
    page.wait_for_selector(".banner.bad:has-text('not one this server knows')")

    _enter_token(page, READ)
    page.wait_for_selector("text=No plans yet.")

    # A read token may not plan: the form says which token to ask for.
    page.goto(guarded + "/#/new")
    page.wait_for_selector("#submit")
    _fill_tiny_request(page)
    page.click("#submit")
    banner = page.wait_for_selector("#form-error:not([hidden])")
    assert "may not do this" in banner.inner_text() and "'write' scope" in banner.inner_text()

    _enter_token(page, WRITE)
    page.wait_for_selector("#submit")
    _fill_tiny_request(page)
    page.click("#submit")
    page.wait_for_url("**/#/plans/*", timeout=60_000)
    page.wait_for_selector("#best", timeout=60_000)
    # The launch files are read with the token too (a plain link cannot send it).
    with page.expect_download() as archive:
        page.click("#launch-archive")
    assert archive.value.suggested_filename.endswith(".tar.gz")
    with tarfile.open(archive.value.path(), "r:gz") as tar:
        assert any(name.endswith("executor-config.json") for name in tar.getnames())
    with page.expect_download() as launch:
        page.click("#launch-json")
    assert "executor_config" in json.loads(Path(launch.value.path()).read_text())
    # Kept for the tab: a reload still reads with it.
    page.reload()
    page.wait_for_selector("#best", timeout=60_000)
    assert page.input_value("#api-token") == WRITE
    # A token the server no longer knows when the link is clicked: said beside the link.
    page.evaluate("sessionStorage.setItem('stagewright-token', 'revoked')")
    page.click("#launch-json")
    refusal = page.wait_for_selector("[data-refusal='launch-json']")
    assert "not one this server knows" in refusal.inner_text()


def test_the_api_documentation_opens_without_a_token(guarded, page):
    page.goto(guarded + "/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
