"""Schemathesis against the service's own OpenAPI schema, over HTTP to a real server: no
500s, every status and body as documented, invalid input rejected.

Bounded: at most 25 generated cases per operation (plus schemathesis' explicit examples and
coverage cases). The number of cases run is printed in the test summary. The long run (over
5,000 cases) is the same test with more examples per operation, opt-in:

    STAGEWRIGHT_SCHEMATHESIS_EXAMPLES=300 .venv/bin/python -m pytest \
        tests/integration/test_schemathesis.py
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from api.app import create_app
from api.core.config import Settings
from tests.integration.conftest import Server

TOKEN = "schemathesis-token"
CASES: Counter[str] = Counter()
EXAMPLES = int(os.environ.get("STAGEWRIGHT_SCHEMATHESIS_EXAMPLES", "25"))
SERVER_ENV = {
    "STAGEWRIGHT_API_TOKEN": TOKEN,
    # Generated plan requests are answered or queued quickly; a few may be searches.
    "STAGEWRIGHT_PLAN_WAIT_S": "0.5",
    "STAGEWRIGHT_MAX_GPUS": "512",
}


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("schemathesis")
    server = Server(
        f"sqlite:///{folder / 'api.db'}",
        folder / "server.log",
        env=SERVER_ENV,
    )
    server.wait_ready()
    yield server
    server.stop()
    assert "Traceback" not in server.log_path.read_text(), server.log_path.read_text()[-4000:]


# The schema the application serves, built without a database (nothing connects until a
# request). Loaded at import: schemathesis' lazy fixture loader needs a pytest internal that
# pytest 9.2 removed.
# It states the server's limits, so it is built with the server's settings.
schema = schemathesis.openapi.from_dict(
    create_app(Settings.from_env(SERVER_ENV, database_url="sqlite:///")).openapi()
)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_keeps_its_openapi_contract(live_server: Server, case: schemathesis.Case) -> None:
    CASES[case.operation.label] += 1
    # The schema cannot state cross-field rules (hidden_size % heads, known GPU names, the
    # server's limits), so a schema-valid request may rightly get 422: that check is off.
    # Every case is sent with the write token, but for one whose headers were made invalid
    # on purpose (a missing or malformed Authorization among them): adding the token would
    # turn it into a valid request that schemathesis still expects to be refused.
    headers = {} if _negative_headers(case) else {"Authorization": f"Bearer {TOKEN}"}
    response = case.call(base_url=live_server.url, headers=headers, timeout=60)
    excluded = [positive_data_acceptance]
    if response.status_code == 413:
        # A body over the size limit (e.g. more list entries than a schema allows, past the
        # 1 MiB the server reads) is refused before it is parsed: a rejection too.
        excluded.append(negative_data_rejection)
    case.validate_response(response, excluded_checks=excluded)


def _negative_headers(case: schemathesis.Case) -> bool:
    component = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    return component is not None and component.mode == GenerationMode.NEGATIVE


def test_schemathesis_ran_every_operation(live_server: Server) -> None:
    """Runs after the generated cases (same module, defined after them), and checks the
    schema tested is the one the server serves."""
    served = httpx.get(f"{live_server.url}/openapi.json").json()
    assert served == schema.raw_schema
    paths = served["paths"]
    operations = sum(len(item) for item in paths.values())
    assert len(CASES) == operations, sorted(CASES)
    assert all(n >= 5 for n in CASES.values()), CASES
