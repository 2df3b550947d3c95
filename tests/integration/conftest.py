"""Fixtures for the service tests: a migrated database per backend (SQLite and PostgreSQL),
the application on it (in-process, over httpx), and real server processes.

PostgreSQL: a fresh schema in the ``test`` database of the server at
``STAGEWRIGHT_TEST_POSTGRES_URL`` (default 127.0.0.1:5432, user postgres, trust auth), dropped
at the end of the session. When the server is unreachable the PostgreSQL tests skip with the
reason, unless ``STAGEWRIGHT_REQUIRE_POSTGRES=1`` (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, delete, text
from sqlalchemy.engine import make_url

from api.app import SEARCH_FUNCTION, create_app
from api.core.config import Settings
from api.core.db import Database, migrate
from api.jobs.search import Planner
from api.store.models import (
    Calibration,
    CommProfile,
    Hardware,
    Job,
    LayerProfile,
    MeasuredRunRecord,
    Measurement,
    PlanRecord,
    ProfileSnapshot,
)
from api.store.profiles import load_bundled_profiles

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PG_ADMIN_URL = os.environ.get(
    "STAGEWRIGHT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REQUIRE_POSTGRES = os.environ.get("STAGEWRIGHT_REQUIRE_POSTGRES") == "1"
BACKENDS = ["sqlite", "postgresql"]


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text())
    return data


def tiny(**changes: Any) -> dict[str, Any]:
    """The tiny CPU request, with ``section.field`` changes, e.g. tiny(**{"training.
    global_batch_size": 20})."""
    data = example("tiny-cpu")
    for dotted, value in changes.items():
        section, field = dotted.split(".")
        data[section][field] = value
    return data


def _postgres_unavailable(reason: str) -> None:
    message = f"PostgreSQL at {make_url(PG_ADMIN_URL).render_as_string()} unreachable: {reason}"
    if REQUIRE_POSTGRES:
        pytest.fail(f"{message} (STAGEWRIGHT_REQUIRE_POSTGRES=1: it must be there)")
    pytest.skip(message)


def schema_url(schema: str) -> str:
    url = make_url(PG_ADMIN_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema on the PostgreSQL test server; its URL is schema_url(name)."""
    engine = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
    schema = f"sw_test_{uuid.uuid4().hex[:10]}"
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:
        engine.dispose()
        _postgres_unavailable(str(exc).splitlines()[0])
    try:
        yield schema
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database with the bundled profiles, once per backend and session."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'stagewright.db'}"
    else:
        url = schema_url(request.getfixturevalue("postgres_schema"))
    migrate_with_profiles(url)
    return url


def migrate_with_profiles(url: str) -> None:
    """Bring the database at ``url`` to the newest schema and load the bundled profiles."""
    database = Database(url)
    try:
        migrate(database)
        with database.session() as session:
            load_bundled_profiles(session=session)
    finally:
        database.dispose()


def reset(url: str) -> None:
    """Back to a freshly loaded store: no plans, only the bundled profiles."""
    database = Database(url)
    try:
        with database.session() as session:
            tables = (
                MeasuredRunRecord,
                Calibration,
                Measurement,
                Job,
                PlanRecord,
                ProfileSnapshot,
                LayerProfile,
                CommProfile,
                Hardware,
            )
            for table in tables:
                session.execute(delete(table))
            session.commit()
            load_bundled_profiles(session=session)
    finally:
        database.dispose()


def settings_for(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": url,
        "job_poll_s": 0.2,
        "plan_wait_s": 20.0,
        # Most tests never search: start a search process only when one does.
        "search_processes_at_start": False,
    }
    values.update(overrides)
    return Settings(**values)


AppFactory = Callable[..., TestClient]


@pytest.fixture
def make_client(database_url: str) -> Iterator[AppFactory]:
    """make_client(planner=None, search_function=None, **settings) -> a started TestClient
    (httpx) on a reset store; without ``planner``, searches run in search processes calling
    ``search_function`` (``module:name``; default: the planner)."""
    reset(database_url)
    clients: list[TestClient] = []

    def make(
        planner: Planner | None = None, search_function: str = SEARCH_FUNCTION, **overrides: Any
    ) -> TestClient:
        app = create_app(
            settings_for(database_url, **overrides),
            planner=planner,
            search_function=search_function,
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    return make_client()


def assert_problem(response: httpx.Response, status: int, *needles: str) -> dict[str, Any]:
    """An RFC 9457 problem with ``status`` whose detail mentions every needle."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"] and body["type"]
    for needle in needles:
        assert needle in body["detail"], (needle, body["detail"])
    return body


def wait_until(
    condition: Callable[[], bool], timeout_s: float = 10.0, every_s: float = 0.01
) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (polled every ``every_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def plan_status(client: httpx.Client, plan_id: str) -> str:
    status: str = client.get(f"/v1/plans/{plan_id}").json()["status"]
    return status


def wait_done(client: httpx.Client, plan_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """The plan once done or failed (as it is after ``timeout_s`` otherwise)."""
    wait_until(lambda: plan_status(client, plan_id) in ("done", "failed"), timeout_s, 0.1)
    body: dict[str, Any] = client.get(f"/v1/plans/{plan_id}").json()
    return body


# -- real server processes ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """``stagewright serve`` in a subprocess on 127.0.0.1 and a free port."""

    def __init__(
        self,
        database_url: str,
        log: Path,
        *,
        workers: int = 1,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        environ = {k: v for k, v in os.environ.items() if not k.startswith("STAGEWRIGHT_")}
        environ.update({"STAGEWRIGHT_ACCESS_LOG": "false", **(env or {})})
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "serve",
                "--port",
                str(self.port),
                "--database-url",
                database_url,
                "--workers",
                str(workers),
            ],
            cwd=REPO,
            env=environ,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 180) -> None:  # slow on a busy machine
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        self.process.kill()
        self.process.wait(timeout=30)
        self._log.close()

    def stop(self) -> None:
        """SIGTERM: a clean shutdown."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(database_url: str, **kwargs: Any) -> Server:
        server = Server(database_url, tmp_path / f"server-{len(servers)}.log", **kwargs)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report how many schemathesis cases ran (a number the README quotes)."""
    module = sys.modules.get("tests.integration.test_schemathesis")
    cases = getattr(module, "CASES", None)
    if cases:
        terminalreporter.write_line(
            f"schemathesis: {sum(cases.values())} cases over {len(cases)} operations "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(cases.items()))})"
        )
