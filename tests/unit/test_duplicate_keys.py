"""A key given twice in a JSON document a person wrote is refused, naming the key and where
it is: Python's json (and pydantic's parser) kept the last one, so
``{"training": {"global_batch_size": 16, "global_batch_size": 32}}`` planned with 32 and
said nothing. One parser (planner.json_input.loads) reads every such document: plan
requests, baselines, measurement files, executor configs and model files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cli.main import main
from cli.regress import update_baseline
from planner.json_input import DuplicateKeyError, JsonTooDeepError, loads
from planner.measurement_files import MeasurementFileError, parse_runs
from tests.unit.test_measurement_files import SHIPPED, shipped_csv

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"


def _twice(text: str, given: str, again: str) -> str:
    """``text`` with ``again`` written right after its only ``given``: a key given twice."""
    assert text.count(given) == 1, given
    return text.replace(given, f"{given}, {again}")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- the parser ---------------------------------------------------------------------------


def test_a_document_without_repeats_reads_as_json_loads_reads_it():
    text = TINY.read_text()
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text)
    assert loads('[{"a": {"b": [1, {"c": null}]}}, 2.5, "x"]') == [
        {"a": {"b": [1, {"c": None}]}},
        2.5,
        "x",
    ]


@pytest.mark.parametrize(
    ("text", "where", "key", "message"),
    [
        (
            '{"training": {"global_batch_size": 16, "global_batch_size": 32}}',
            ("training",),
            "global_batch_size",
            "training: global_batch_size is given twice; keep one",
        ),
        ('{"model": {}, "model": {}}', (), "model", "model is given twice; keep one"),
        (
            '{"runs": [{"a": 1}, {"b": {"c": 1, "d": 2, "c": 1}}]}',
            ("runs", 1, "b"),
            "c",
            "runs.1.b: c is given twice; keep one",
        ),
        # The same value twice is still a repeat: which one was meant is not for us to say.
        ('[[{"x": 1, "x": 1}]]', (0, 0), "x", "0.0: x is given twice; keep one"),
        # The first repeat in the document is the one named.
        (
            '{"a": {"k": 1, "k": 2}, "b": {"j": 1, "j": 2}}',
            ("a",),
            "k",
            "a: k is given twice; keep one",
        ),
    ],
)
def test_a_key_given_twice_is_named_with_where_it_is(text, where, key, message):
    with pytest.raises(DuplicateKeyError) as caught:
        loads(text)
    assert (caught.value.where, caught.value.key, str(caught.value)) == (where, key, message)


def test_malformed_and_too_deep_documents():
    with pytest.raises(json.JSONDecodeError):
        loads('{"a": ')
    with pytest.raises(JsonTooDeepError, match="too deep"):
        loads("[" * 100_000 + "]" * 100_000)


# -- every command that reads such a file -------------------------------------------------


def test_plan_refuses_a_request_with_a_key_given_twice(capsys, tmp_path):
    path = tmp_path / "request.json"
    path.write_text(_twice(TINY.read_text(), '"global_batch_size": 16', '"global_batch_size": 32'))
    code, out, err = _run(capsys, "plan", str(path), "--json")
    assert (code, out) == (2, "")
    assert err == (
        f"stagewright plan: error: {path} is not a valid plan request: "
        "training: global_batch_size is given twice; keep one\n"
    )


def test_plan_says_a_request_nested_too_deep_in_one_line(capsys, tmp_path):
    path = tmp_path / "request.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = _run(capsys, "plan", str(path))
    assert (code, out) == (2, "")
    assert "too deep" in err and err.count("\n") == 1 and "Traceback" not in err


def test_regress_refuses_a_baseline_with_a_key_given_twice(capsys, tmp_path):
    request = json.loads(TINY.read_text())
    data = update_baseline(
        {
            "format": "stagewright.baseline/1",
            "tolerance_pct": 1.0,
            "scenarios": [{"name": "tiny", "request": request}],
        }
    )
    path = tmp_path / "baseline.json"
    path.write_text(_twice(json.dumps(data), '"tolerance_pct": 1.0', '"tolerance_pct": 50'))
    code, out, err = _run(capsys, "regress", str(path))
    assert (code, out) == (2, "")
    assert err == (f"stagewright regress: error: {path}: tolerance_pct is given twice; keep one\n")


def _shipped_runs() -> list[dict[str, object]]:
    runs: list[dict[str, object]] = json.loads(SHIPPED.read_text())["runs"][:2]
    return runs


def test_a_measurements_file_with_a_key_given_twice_is_refused():
    text = json.dumps({"runs": _shipped_runs()})
    text = text.replace('"source":', '"source": "twice", "source":', 1)
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(text, "mine.json")
    assert str(caught.value) == "mine.json: runs.0: source is given twice; keep one"


def test_measurements_add_refuses_it_before_opening_the_store(capsys, tmp_path):
    path = tmp_path / "runs.json"
    text = json.dumps({"runs": _shipped_runs()})
    path.write_text(text.replace('"source":', '"source": "twice", "source":', 1))
    store = tmp_path / "never.db"
    code, out, err = _run(
        capsys, "measurements", "add", str(path), "--database-url", f"sqlite:///{store}"
    )
    assert (code, out) == (2, "")
    assert err == (
        f"stagewright measurements: error: {path}: runs.0: source is given twice; keep one\n"
    )
    assert not store.exists()


def test_a_json_cell_of_a_csv_with_a_key_given_twice_is_refused():
    rows = list(csv.reader(io.StringIO(shipped_csv())))
    column = rows[0].index("config.recompute_per_stage")
    rows[1][column] = '[{"full": 80, "full": 40}]'
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows[:2])
    with pytest.raises(MeasurementFileError) as caught:
        parse_runs(buffer.getvalue(), "mine.csv")
    assert (
        "row 1 (line 2): column config.recompute_per_stage: 0: full is given twice; keep one"
        in str(caught.value)
    )


def test_run_refuses_an_executor_config_with_a_key_given_twice(capsys, tmp_path):
    from tests.unit.test_launch import _document

    path = tmp_path / "executor-config.json"
    text = json.dumps(_document(seed=1234))
    path.write_text(_twice(text, '"seed": 1234', '"seed": 7'))
    code, out, err = _run(capsys, "run", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"stagewright run: error: {path} is not a valid executor config: "
        "seed is given twice; keep one\n"
    )


def test_profile_refuses_a_model_file_with_a_key_given_twice(capsys, tmp_path):
    path = tmp_path / "model.json"
    text = json.dumps(json.loads(TINY.read_text())["model"])
    path.write_text(_twice(text, '"num_layers": 8', '"num_layers": 2'))
    code, out, err = _run(capsys, "profile", str(path))
    assert (code, out) == (2, "")
    assert err == f"stagewright profile: error: {path}: num_layers is given twice; keep one\n"
