"""``stagewright plan`` as a person and a script use it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from planner.profiles import default_store
from planner.specs import ModelSpec, Plan

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny-cpu.json"

CONFIG_KEYS = {
    "t",
    "p",
    "d",
    "micro_batch_size",
    "num_microbatches",
    "recompute",
    "schedule",
    "layers_per_stage",
    # Extension: per-stage recompute counts chosen by CP-SAT (null from the grid).
    "recompute_per_stage",
    # Contract addition: the memory limit an adaptive schedule was built for (else null).
    "memory_limit",
    # Extension: the context-parallel degree (1 without context parallelism).
    "cp",
}
PREDICTED_KEYS = {
    "iteration_time_s",
    "samples_per_s",
    "tokens_per_s",
    "mfu",
    "bubble_fraction",
    "memory_gib_per_device",
    "peak_memory_gib",
    # Issue 12: where the times come from and that source's fit error.
    "time_source",
    "calibration_error",
}
LAUNCH_KEYS = {"executor_config", "torchrun", "megatron_args", "torch_pipelining_csv"}
PLAN_KEYS = {"id", "request", "best", "candidates", "rejected", "stats"}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def tiny_request() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TINY.read_text())
    return data


def write(tmp_path: Path, data: object, name: str = "request.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2
    assert out == ""
    assert err.startswith("stagewright plan: error: ")
    assert err.endswith("\n") and err.count("\n") == 1
    assert "Traceback" not in err


def test_text_output_ranks_candidates(capsys):
    code, out, err = run(capsys, "plan", str(TINY))
    assert code == 0, err
    assert err == ""
    assert "ranked candidates" in out
    assert "tiny-gpt" in out


def test_json_output_is_the_contract(capsys):
    code, out, err = run(capsys, "plan", str(TINY), "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert set(data) >= PLAN_KEYS
    assert set(data["stats"]) == {"evaluated", "feasible", "search_ms"}
    # The model echoes every field given, and the fields added later at their defaults.
    given = tiny_request()["model"]
    assert {k: data["request"]["model"][k] for k in given} == given
    assert ModelSpec.model_validate(data["request"]["model"]) == ModelSpec.model_validate(given)
    assert data["request"]["cluster"] == tiny_request()["cluster"]
    assert 1 <= len(data["candidates"]) <= tiny_request()["search"]["top_k"]
    assert data["best"] == data["candidates"][0]
    for candidate in data["candidates"]:
        assert {"config", "predicted", "launch"} <= set(candidate)
        assert set(candidate["config"]) == CONFIG_KEYS
        assert set(candidate["predicted"]) == PREDICTED_KEYS
        assert set(candidate["launch"]) == LAUNCH_KEYS
        assert isinstance(candidate["launch"]["torchrun"], list)
    # What a script reads back is a Plan.
    assert Plan.model_validate(data).stats.evaluated == data["stats"]["evaluated"]


def test_plan_json_has_the_contract_keys_and_one_documented_extension(capsys):
    # ``by_schedule`` (best of each requested schedule), ``landscape`` (every fitting
    # configuration, estimated, for the dashboard's chart) and ``notes`` (what of the space
    # was not searched) are the keys the Plan adds to the contract's six; nothing else may
    # appear.
    _, out, _ = run(capsys, "plan", str(TINY), "--json")
    assert set(json.loads(out)) == PLAN_KEYS | {"by_schedule", "landscape", "notes"}


def test_json_without_all_omits_rejected_and_with_all_lists_them(capsys):
    _, out, _ = run(capsys, "plan", str(TINY), "--json")
    assert json.loads(out)["rejected"] == []
    code, out, _ = run(capsys, "plan", str(TINY), "--json", "--all")
    assert code == 0
    data = json.loads(out)
    rejected = data["rejected"]
    assert rejected  # tiny-cpu asks for BPipe, V and interleaved, which need p >= 2
    for entry in rejected:
        assert {"config", "reason", "predicted"} <= set(entry)
        assert set(entry["config"]) == CONFIG_KEYS
        assert entry["reason"]
    assert data["stats"]["evaluated"] == data["stats"]["feasible"] + len(rejected)


def test_text_with_all_shows_rejections(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: each reason on one line
    code, out, _ = run(capsys, "plan", str(TINY), "--all")
    assert code == 0
    assert "at least 2 devices" in out


def test_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.json"
    code, out, err = run(capsys, "plan", str(missing))
    assert_one_line_error(code, out, err)
    assert "nope.json" in err


def test_invalid_json(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"model": {"name": "x",')
    code, out, err = run(capsys, "plan", str(path))
    assert_one_line_error(code, out, err)
    assert "not a valid plan request" in err


def test_unknown_field(capsys, tmp_path):
    data = tiny_request()
    data["training"]["learning_rate"] = 3e-4
    code, out, err = run(capsys, "plan", write(tmp_path, data))
    assert_one_line_error(code, out, err)
    assert "training.learning_rate" in err


def test_invalid_values_name_the_field(capsys, tmp_path):
    data = tiny_request()
    data["model"]["hidden_size"] = 250  # not divisible by 8 heads
    code, out, err = run(capsys, "plan", write(tmp_path, data))
    assert_one_line_error(code, out, err)
    assert "not divisible by num_attention_heads" in err


def test_a_nul_in_the_model_name_says_the_rule_not_a_pattern(capsys, tmp_path):
    """The service refuses a model name with a NUL (its store cannot keep one); a request
    file is the same request, refused with the same words."""
    data = tiny_request()
    data["model"]["name"] = "a\x00b"
    code, out, err = run(capsys, "plan", write(tmp_path, data))
    assert_one_line_error(code, out, err)
    assert "model.name: a NUL character (\\u0000) cannot be stored" in err
    assert "pattern" not in err


def test_unknown_gpu_names_the_known_profiles(capsys, tmp_path):
    data = tiny_request()
    data["cluster"]["gpu"] = "b300"
    code, out, err = run(capsys, "plan", write(tmp_path, data))
    assert_one_line_error(code, out, err)
    assert "'b300'" in err
    for name in default_store().hardware_names():
        assert name in err
    # A profile of the team's store (added through the API, or calibrated) is planned
    # with from that store: said, since the list above is the bundled one only.
    assert "these are the bundled profiles" in err and "give --database-url" in err


def test_unsupported_precision_names_the_supported_ones(capsys, tmp_path):
    data = tiny_request()
    data["cluster"]["gpu"] = "v100-16g"
    data["training"]["precision"] = "bf16"
    code, out, err = run(capsys, "plan", write(tmp_path, data))
    assert_one_line_error(code, out, err)
    assert "fp16" in err and "fp32" in err


def test_a_file_that_is_not_utf8(capsys, tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"model": {"name": "caf\xe9"}}')
    code, out, err = run(capsys, "plan", str(path))
    assert_one_line_error(code, out, err)


def test_nothing_fits_exits_1_in_text_and_0_in_json(capsys, tmp_path):
    data = json.loads((REPO / "examples" / "gpt3-13b-8xa100.json").read_text())
    data["cluster"].update(num_nodes=1, gpus_per_node=1)
    data["search"]["schedules"] = ["1f1b"]
    path = write(tmp_path, data)
    code, out, _ = run(capsys, "plan", path)
    assert code == 1
    flat = " ".join(out.split())  # the terminal's width wraps the hint
    assert "No configuration fits" in flat and "Run with --all" in flat
    # Nothing to rank: no empty ranked table, no table of schedules without a best.
    assert "ranked candidates" not in out and "best of each" not in out
    code, out, _ = run(capsys, "plan", path, "--all")
    assert code == 1
    assert "Run with --all" not in " ".join(out.split())
    assert "every rejected configuration" in out
    code, out, err = run(capsys, "plan", path, "--json")
    assert code == 0
    assert json.loads(out)["best"] is None
    # stdout is the plan alone; why nothing fits (the rejections left out) is on stderr.
    assert err.startswith("stagewright plan: No configuration fits in memory")
    assert "--all puts every rejection in the JSON" in err
    code, out, err = run(capsys, "plan", path, "--json", "--all")
    assert json.loads(out)["rejected"] and "No configuration fits" in err
    assert "--all puts" not in err


def test_a_request_saved_with_a_byte_order_mark_plans(capsys, tmp_path):
    """Notepad's UTF-8 starts the file with a byte-order mark; the request was refused as
    'Invalid JSON: expected value at line 1 column 1', which names nothing to change."""
    path = tmp_path / "request.json"
    path.write_text(TINY.read_text(), encoding="utf-8-sig")
    code, out, err = run(capsys, "plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["best"] is not None


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (0.008391, "fit error 0.8%: rms of ln(predicted / measured)"),
        # ln 0.54: predictions a factor e^0.54 = 1.72 off (+72% or -42%), not '54.0%'.
        (0.5405, "fit error: a factor of 1.72 (rms of ln(predicted / measured) 0.540)"),
    ],
)
def test_the_fit_error_is_a_percentage_only_where_ln_is_one(error, shown):
    from cli.render import trust_text
    from planner.specs._plan import Predicted

    predicted = Predicted.model_construct(time_source="calibrated model", calibration_error=error)
    assert trust_text(predicted) == f"calibrated model ({shown} over the runs it was calibrated on)"
