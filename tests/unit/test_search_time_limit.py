"""search.time_limit_s is the CP-SAT refinement's budget: given with method grid, which runs
no CP-SAT, it was ignored without a word. It is refused there, saying what to change,
unless it is the default (what a request echoed by the service spells out) or comes from a
plan stored before the check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cli.main import main
from planner.errors import validation_problems
from planner.specs import STORED, Plan, PlanRequest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"
REFUSED = (
    "search: time_limit_s 60 is the time budget of the CP-SAT refinement, which method grid "
    "does not run; set search.method to cpsat to refine the best candidates with it, or "
    "leave time_limit_s out"
)


def _request(**search: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TINY.read_text())
    data["search"].pop("method", None)
    data["search"].update(search)
    return data


@pytest.mark.parametrize("search", [{"method": "grid", "time_limit_s": 60}, {"time_limit_s": 60}])
def test_a_time_limit_with_the_grid_is_refused_saying_what_to_change(search):
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate(_request(**search))
    assert validation_problems(caught.value) == REFUSED


@pytest.mark.parametrize(
    "search",
    [
        {"method": "grid"},
        {"method": "grid", "time_limit_s": 10},  # the default, spelled out
        {"method": "grid", "time_limit_s": 10.0},
        {"method": "cpsat", "time_limit_s": 60},
        {"method": "cpsat"},
    ],
)
def test_what_means_what_it_says_is_accepted(search):
    PlanRequest.model_validate(_request(**search))


def test_a_plan_stored_before_the_check_still_loads():
    data = _request(method="grid", time_limit_s=60)
    assert PlanRequest.model_validate(data, context={STORED: True}).search.time_limit_s == 60


def test_the_request_a_plan_echoes_is_accepted_again(capsys):
    assert main(["plan", str(TINY), "--json"]) == 0
    echoed = json.loads(capsys.readouterr().out)
    assert echoed["request"]["search"]["time_limit_s"] == 10.0
    assert PlanRequest.model_validate(echoed["request"]) == PlanRequest.model_validate(
        json.loads(TINY.read_text())
    )
    Plan.model_validate(echoed)


def test_plan_refuses_it_in_one_line(capsys, tmp_path):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(_request(method="grid", time_limit_s=60)))
    assert main(["plan", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"stagewright plan: error: {path} is not a valid plan request: {REFUSED}\n"
