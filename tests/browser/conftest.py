"""A real server and a real headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / ".test-artifacts" / "browser"

if CHROMIUM is None:
    if os.environ.get("STAGEWRIGHT_REQUIRE_BROWSER") == "1":
        raise RuntimeError(
            "STAGEWRIGHT_REQUIRE_BROWSER=1 but no chromium on PATH: apt-get install chromium"
        )
    pytest.skip(
        "no chromium on PATH (apt-get install chromium); Playwright cannot download "
        "its own browser here",
        allow_module_level=True,
    )

playwright = pytest.importorskip("playwright.sync_api")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(folder: Path, **environment: str) -> Iterator[str]:
    """``stagewright serve`` on a free port with a SQLite store in ``folder`` and these
    environment variables on top of the test run's (no STAGEWRIGHT_API_TOKEN of its own):
    its URL once /healthz answers."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "STAGEWRIGHT_API_TOKEN"} | environment
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "serve",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{folder / 'dashboard.db'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise RuntimeError("the server did not start")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("dashboard")) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Module-scoped, and collected before the module ends: Playwright leaves a pipe of its
    driver process for the garbage collector, and the ResourceWarning that raises belongs
    to these tests (which filter it), not to whichever test runs when the collector does."""
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield chromium
        chromium.close()
    gc.collect()


def screenshots(page, name: str, *, full_page: bool = True) -> list[Path]:  # type: ignore[no-untyped-def]
    """Screenshots of what the page shows at 1280 and at 768 px wide (kept in
    .test-artifacts/browser/ for a person to look at), of the whole page unless
    ``full_page`` is False (the first screen); the viewport is put back after."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    before = page.viewport_size
    paths = []
    for width in (1280, 768):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the charts redraw on resize
        path = ARTIFACTS / f"{name}-{width}.png"
        page.screenshot(path=str(path), full_page=full_page)
        paths.append(path)
    page.set_viewport_size(before)
    return paths


@pytest.fixture
def page(browser, request):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, errors


def make_plan(server: str, body: dict) -> dict:  # type: ignore[type-arg]
    """POST a plan request and wait for it; the done plan with every rejected configuration."""
    created = httpx.post(f"{server}/v1/plans?wait_s=30", json=body, timeout=90)
    assert created.status_code in (200, 201, 202), created.text
    plan_id = created.json()["id"]
    deadline = time.time() + 120
    while time.time() < deadline:
        plan = httpx.get(f"{server}/v1/plans/{plan_id}?include_rejected=true", timeout=30).json()
        if plan["status"] == "done":
            return plan  # type: ignore[no-any-return]
        assert plan["status"] in ("queued", "running"), plan
        time.sleep(0.5)
    raise AssertionError(f"plan {plan_id} did not finish")
