"""`stagewright measurements withdraw|show` and GET|DELETE /v1/measurements/{id} where no
database is needed: what is refused before a store is opened, and what the OpenAPI document
says."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.app import create_app
from api.core.config import Settings
from cli.main import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("", "--reason is empty; say why the run is withdrawn, or leave the reason out"),
        (" \t", "--reason is empty"),
        ("x" * 501, "--reason is 501 characters long; keep it to 500"),
        ("a\x00b", "--reason holds a NUL character"),
    ],
)
def test_a_bad_reason_is_refused_before_the_store_is_opened(tmp_path: Path, capsys, reason, said):
    database = tmp_path / "never.db"
    code, out, err = run(
        capsys,
        "measurements",
        "withdraw",
        "1",
        "--reason",
        reason,
        "--database-url",
        f"sqlite:///{database}",
    )
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert said in err
    assert not database.exists()  # not even created, let alone migrated


@pytest.mark.parametrize("action", ["withdraw", "show"])
def test_the_id_must_be_a_number(capsys, action):
    with pytest.raises(SystemExit) as exited:
        main(["measurements", action, "the-slow-one"])
    assert exited.value.code == 2
    assert "argument ID: invalid int value: 'the-slow-one'" in capsys.readouterr().err


def test_the_openapi_document_describes_withdrawing():
    schema = create_app(Settings(database_url="sqlite:///")).openapi()
    delete = schema["paths"]["/v1/measurements/{run_id}"]["delete"]
    params = {p["name"]: p for p in delete["parameters"]}
    assert params["run_id"]["in"] == "path" and params["reason"]["in"] == "query"
    assert params["reason"]["required"] is False
    assert {"200", "401", "403", "404", "422", "503"} <= set(delete["responses"])
    assert "application/problem+json" in delete["responses"]["404"]["content"]
    assert delete["security"]  # the write scope's bearer token
    ok = delete["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/MeasuredRunPublic"}
    run = schema["components"]["schemas"]["MeasuredRunPublic"]["properties"]
    assert {"withdrawn_at", "withdrawn_reason"} <= set(run)
    listing = schema["paths"]["/v1/measurements"]["get"]
    assert "withdrawn" in {p["name"] for p in listing["parameters"]}


def test_the_openapi_document_describes_reading_one_run():
    schema = create_app(Settings(database_url="sqlite:///")).openapi()
    read = schema["paths"]["/v1/measurements/{run_id}"]["get"]
    assert [(p["name"], p["in"]) for p in read["parameters"]] == [("run_id", "path")]
    assert {"200", "401", "403", "404", "422", "503"} <= set(read["responses"])
    assert "application/problem+json" in read["responses"]["404"]["content"]
    ok = read["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/MeasuredRunPublic"}
    # The read scope, as the list: no write token declared.
    assert read.get("security") == schema["paths"]["/v1/measurements"]["get"].get("security")
