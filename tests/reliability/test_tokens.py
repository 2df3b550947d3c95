"""Who may read what (issue 16, item 7): tokens with scopes configured by the operator,
reads open only while no token lists ``read``, each plan recording the token that created
it, and DELETE /v1/plans/{id} for that token or an admin."""

from __future__ import annotations

import pytest

from api.core.config import SettingsError
from api.security import parse_tokens
from planner.plan import plan as real_plan
from tests.integration.conftest import assert_problem, example, tiny

TOKENS = "reader:read:r-secret; ci:write:ci-secret; other:write:other-secret; ops:admin:ops-secret"


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _created_by(client, plan_id: str, secret: str) -> str | None:
    listed = client.get("/v1/plans", headers=_as(secret)).json()["items"]
    return next(item["created_by"] for item in listed if item["id"] == plan_id)


def test_scopes_decide_reads_writes_and_whose_plans_may_be_deleted(make_client):
    client = make_client(planner=real_plan, api_tokens=TOKENS)
    # A token lists "read": reads need a token too.
    assert_problem(client.get("/v1/plans"), 401, "requires a token for reads")
    assert client.get("/v1/plans", headers=_as("r-secret")).status_code == 200
    assert client.get("/v1/plans", headers=_as("ci-secret")).status_code == 200  # write reads
    assert_problem(client.get("/v1/plans", headers=_as("wrong")), 401, "missing or wrong")

    refused = client.post("/v1/plans", json=example("tiny-cpu"), headers=_as("r-secret"))
    assert_problem(refused, 403, "'reader' has no 'write' scope")
    created = client.post("/v1/plans", json=example("tiny-cpu"), headers=_as("ci-secret"))
    assert created.status_code == 201
    plan_id = created.json()["id"]
    assert _created_by(client, plan_id, "r-secret") == "ci"

    location = f"/v1/plans/{plan_id}"
    assert_problem(client.delete(location, headers=_as("r-secret")), 403, "no 'write' scope")
    assert_problem(
        client.delete(location, headers=_as("other-secret")), 403, "created by the token 'ci'"
    )
    assert client.get(location, headers=_as("r-secret")).status_code == 200  # still there
    assert client.delete(location, headers=_as("ci-secret")).status_code == 204  # its owner
    assert client.get(location, headers=_as("r-secret")).status_code == 404

    # An admin deletes anyone's plan.
    another = client.post(
        "/v1/plans", json=tiny(**{"training.global_batch_size": 16}), headers=_as("other-secret")
    )
    assert another.status_code == 201, another.text
    other_location = f"/v1/plans/{another.json()['id']}"
    assert client.delete(other_location, headers=_as("ops-secret")).status_code == 204


def test_reads_are_open_while_no_token_lists_read(make_client):
    client = make_client(planner=real_plan, api_tokens="ci:write:ci-secret")
    assert client.get("/v1/plans").status_code == 200
    assert_problem(client.post("/v1/plans", json=example("tiny-cpu")), 401, "for writes")
    created = client.post("/v1/plans", json=example("tiny-cpu"), headers=_as("ci-secret"))
    assert created.status_code == 201
    assert client.get(f"/v1/plans/{created.json()['id']}").status_code == 200  # anonymous


def test_the_single_token_of_earlier_versions_writes_and_administers(make_client):
    client = make_client(planner=real_plan, api_token="legacy-secret")
    assert client.get("/v1/plans").status_code == 200  # reads stay open
    created = client.post("/v1/plans", json=example("tiny-cpu"), headers=_as("legacy-secret"))
    assert created.status_code == 201
    assert _created_by(client, created.json()["id"], "legacy-secret") == "default"


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("ci:write", "write name:scopes:secret"),
        ("ci:fly:s3cret", "(not fly)"),
        ("c i:write:s3cret", "the name is letters"),
        ("ci:write:a; ci:read:b", "token name(s) ci given twice"),
        # One secret under two names: which name and scopes a request got depended on the
        # order of the entries (a read-only dashboard's secret pasted into the CI entry
        # wrote as 'dash' or 'ci' by chance).
        ("dash:read:same-secret; ci:write:same-secret", "tokens dash and ci have the same"),
        # Only separators: no token at all, so the service was open to every write.
        (" ; ;\n", "STAGEWRIGHT_API_TOKENS is set but lists no token"),
    ],
)
def test_a_token_list_that_does_not_parse_says_which_entry_and_how(entries, says):
    with pytest.raises(SettingsError) as raised:
        parse_tokens(entries, None)
    assert says in str(raised.value)
    assert "same-secret" not in str(raised.value)


def test_the_single_token_may_not_repeat_a_listed_secret():
    with pytest.raises(SettingsError, match="tokens default and ops have the same secret"):
        parse_tokens("ops:admin:t0p", "t0p")


def test_the_health_probe_needs_no_token_when_reads_do(make_client):
    """The image's HEALTHCHECK and load balancers probe GET /healthz without a token: once
    a token listed "read" it answered 401 and the container was reported unhealthy."""
    client = make_client(api_tokens=TOKENS)
    answer = client.get("/healthz")
    # Only the status to a caller without a token: the backend, the version and the job
    # counts are a reader's (a version fingerprint and how busy the service is).
    assert answer.status_code == 200 and answer.json() == {
        "status": "ok",
        "database": None,
        "version": None,
        "jobs_queued": None,
        "jobs_running": None,
    }
    assert client.get("/healthz", headers={"Authorization": "Bearer nope"}).status_code == 200
    full = client.get("/healthz", headers=_as("r-secret")).json()
    assert full["database"] in ("sqlite", "postgresql") and full["version"]
    assert isinstance(full["jobs_queued"], int)
    # Reads open to all: everyone is a reader, as before.
    assert make_client().get("/healthz").json()["database"] in ("sqlite", "postgresql")
    assert_problem(client.get("/metrics"), 401, "requires a token for reads")
    assert_problem(client.get("/v1/plans"), 401, "requires a token for reads")
    assert_problem(client.post("/healthz"), 401, "requires a token for writes")


def test_the_dashboard_and_documentation_pages_need_no_token_when_reads_do(make_client):
    """A browser cannot add a header to loading a page: with read tokens the dashboard and
    /docs answered 401 and could not be used at all. The pages hold no data; what they show
    is read through the API, which still needs the token."""
    client = make_client(api_tokens=TOKENS)
    for path in ("/", "/static/app.js", "/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 200, path
    assert client.head("/static/style.css").status_code == 200
    assert_problem(client.get("/v1/plans"), 401, "requires a token for reads")
    assert_problem(client.get("/v1/hardware"), 401, "requires a token for reads")
    assert_problem(client.get("/static-nope"), 401, "requires a token for reads")
    # Writes to those paths still need a write token.
    assert_problem(client.post("/openapi.json"), 401, "requires a token for writes")
