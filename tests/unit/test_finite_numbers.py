"""NaN and Infinity are not numbers a request can mean: ``"time_limit_s": NaN`` (which
Python's JSON reads) was refused as "should be less than or equal to 600", since the plan
request's models let non-finite floats through to the range checks, where every
comparison with NaN is false. Every float field of the request (and of an executor
config) refuses them, saying a finite number is needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from cli.main import main
from executor.inputs import BadInput, read_config
from planner.errors import validation_problems
from planner.launch.config import ExecutorConfig, OptimizerSettings, Prediction
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpec, TrainingSpec

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]  # as Python's json reads them


def _text(value: str) -> str:
    data = json.loads(TINY.read_text())
    data["search"]["method"] = "cpsat"
    data["search"]["time_limit_s"] = "@"
    return json.dumps(data).replace('"@"', value)


@pytest.mark.parametrize("value", NON_FINITE)
def test_a_non_finite_time_limit_is_refused_as_not_finite(value):
    with pytest.raises(ValidationError) as caught:
        PlanRequest.model_validate(json.loads(_text(value)))
    assert (
        validation_problems(caught.value) == "search.time_limit_s: Input should be a finite number"
    )
    with pytest.raises(ValidationError, match="finite number"):
        PlanRequest.model_validate_json(_text(value))


@pytest.mark.parametrize("value", NON_FINITE)
def test_plan_says_a_finite_number_is_needed(capsys, tmp_path, value):
    path = tmp_path / "request.json"
    path.write_text(_text(value))
    assert main(["plan", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"stagewright plan: error: {path} is not a valid plan request: "
        "search.time_limit_s: Input should be a finite number\n"
    )


def test_finite_limits_still_plan(capsys, tmp_path):
    path = tmp_path / "request.json"
    path.write_text(_text("0.5"))
    assert main(["plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["request"]["search"]["time_limit_s"] == 0.5


@pytest.mark.parametrize(
    "model",
    [
        PlanRequest,
        ModelSpec,
        ClusterSpec,
        TrainingSpec,
        SearchSpec,
        ExecutorConfig,
        OptimizerSettings,
        Prediction,
    ],
    ids=lambda m: m.__name__,
)
def test_every_request_and_executor_config_model_refuses_non_finite_floats(model: type[BaseModel]):
    assert model.model_config.get("allow_inf_nan") is False


def test_an_executor_config_with_a_nan_learning_rate_says_so(tmp_path):
    from tests.unit.test_launch import _document

    path = tmp_path / "executor-config.json"
    path.write_text(json.dumps(_document(optimizer={"lr": "@"})).replace('"@"', "NaN"))
    with pytest.raises(BadInput, match=r"optimizer\.lr: Input should be a finite number"):
        read_config(path)
