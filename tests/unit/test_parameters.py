"""The cost model's free parameters: declared once, overridden per hardware profile, read by
the cost model from the profile (hand-computed expectations)."""

from __future__ import annotations

import json

import pytest

from planner.costmodel import PlanContext, estimate
from planner.costmodel.device import collective_cost, device_rates
from planner.costmodel.layer_ops import layer_ops
from planner.costmodel.parameters import (
    PARAMETERS,
    FreeParameter,
    ParameterError,
    check_parameter_values,
    get_parameter,
    register,
)
from planner.errors import StagewrightError
from planner.profiles import (
    BUNDLED_PROFILES,
    CalibrationRecord,
    JsonProfileStore,
    default_store,
    hardware_from_dict,
)
from planner.specs import CandidateConfig, PlanRequest, TrainingSpec
from tests.unit.test_costmodel import model

GIB = 2**30


def test_todays_constants_are_registered_with_their_defaults_and_sources():
    assert get_parameter("gemm_efficiency").default == 0.80
    assert get_parameter("workspace_gib").default == 2.62
    assert get_parameter("allocator_fragmentation").default == 0.0
    for declared in PARAMETERS.values():
        assert declared.lower <= declared.default <= declared.upper
        assert declared.unit and declared.source and declared.doc


def test_a_declaration_needs_its_default_inside_finite_bounds():
    with pytest.raises(ValueError, match="within them"):
        FreeParameter("x", 2.0, 0.0, 1.0, "u", "s", "d")
    with pytest.raises(ValueError, match="finite"):
        FreeParameter("x", float("nan"), 0.0, 1.0, "u", "s", "d")


def test_a_name_is_registered_once():
    same = get_parameter("workspace_gib")
    assert register(same) is same  # re-importing a module re-registers the same declaration
    with pytest.raises(ValueError, match="already registered"):
        register(FreeParameter("workspace_gib", 2.0, 0.0, 16.0, "GiB", "s", "d"))


def test_values_are_checked_by_name_and_bounds():
    assert check_parameter_values({"workspace_gib": 2, "gemm_efficiency": 0.5}) == {
        "gemm_efficiency": 0.5,
        "workspace_gib": 2.0,
    }
    with pytest.raises(ParameterError, match="unknown cost-model parameter 'gemm'.*known: "):
        check_parameter_values({"gemm": 1.0})
    with pytest.raises(ParameterError, match=r"from 0.2 to 1 \(fraction of peak"):
        check_parameter_values({"gemm_efficiency": 1.2})
    with pytest.raises(ParameterError, match="outside its bounds"):
        check_parameter_values({"workspace_gib": float("inf")})
    with pytest.raises(ParameterError, match="must be a number"):
        check_parameter_values({"workspace_gib": "lots"})


def _a100_entry(**changes: object) -> dict[str, object]:
    entries = json.loads((BUNDLED_PROFILES / "hardware.json").read_text())["hardware"]
    entry: dict[str, object] = next(e for e in entries if e["name"] == "a100-sxm-80g")
    return {**entry, **changes}


def test_a_profile_json_may_override_parameters_and_say_how_they_were_fitted():
    record = {
        "fitted_at": "2026-01-02T03:04:05+00:00",
        "num_runs": 12,
        "rms_log_error": 0.05,
        "rms_log_error_before": 0.2,
        "fitted": ["gemm_efficiency"],
        "uninformed": ["workspace_gib"],
    }
    hw = hardware_from_dict(_a100_entry(parameters={"gemm_efficiency": 0.5}, calibration=record))
    assert hw.parameter("gemm_efficiency") == 0.5
    assert hw.parameter("workspace_gib") == 2.62  # not named: the default
    assert hw.parameter_values()["allocator_fragmentation"] == 0.0
    assert hw.calibration == CalibrationRecord(**record)  # type: ignore[arg-type]
    # A file's entry is checked as POST /v1/hardware checks a body: the profile and the field.
    with pytest.raises(
        StagewrightError, match="hardware profile 'a100-sxm-80g': parameters: .*'gemm'"
    ):
        hardware_from_dict(_a100_entry(parameters={"gemm": 0.5}))
    with pytest.raises(StagewrightError, match="workspace_gib = -1.0 is outside"):
        hardware_from_dict(_a100_entry(parameters={"workspace_gib": -1}))
    with pytest.raises(ValueError, match="calibration record is not valid: num_runs"):
        hardware_from_dict(_a100_entry(calibration={**record, "num_runs": -1}))


def test_profiles_in_a_folder_carry_their_parameters(tmp_path):
    (tmp_path / "hardware.json").write_text(
        json.dumps({"hardware": [_a100_entry(parameters={"workspace_gib": 3.0})]})
    )
    store = JsonProfileStore.load(tmp_path)
    assert store.hardware("a100-sxm-80g").parameter("workspace_gib") == 3.0


def test_unknown_names_asked_of_a_profile_are_errors():
    with pytest.raises(ParameterError, match="unknown cost-model parameter 'nope'"):
        default_store().hardware("cpu").parameter("nope")


def test_the_layer_model_reads_its_efficiencies_from_the_profile():
    # The CPU profile has no compute facts: a GEMM is 2 m n k / (peak x GEMM efficiency)
    # unless its operands take longer from memory (not at these sizes).
    hw = default_store().hardware("cpu")
    slow = hw.with_parameters({"gemm_efficiency": 0.4, "kernel_launch_us": 0.0})
    m = model(hidden_size=1024, num_attention_heads=16, seq_length=1024, vocab_size=1024)
    tr = TrainingSpec(global_batch_size=8, precision="fp32")
    ops = {
        op.name: op.seconds
        for op in layer_ops(device_rates(slow, "fp32"), m, tr, 1, 1, "none", collective_cost(slow))
        if op.phase == "F"
    }
    assert ops["QKV GEMM"] == pytest.approx(2 * 1024 * 3072 * 1024 / (1e11 * 0.4), rel=1e-12)
    assert ops["FC2 GEMM"] == pytest.approx(2 * 1024 * 1024 * 4096 / (1e11 * 0.4), rel=1e-12)
    # The layer norm moves 2 x 4 bytes per element at 10 GB/s x the memory efficiency.
    assert ops["layer norm 1"] == pytest.approx(8 * 1024 * 1024 / (10e9 * 0.8), rel=1e-12)


def test_the_memory_allowance_reads_workspace_and_fragmentation_from_the_profile():
    store = default_store()
    hw = store.hardware("a100-sxm-80g").with_parameters(
        {"workspace_gib": 2.5, "allocator_fragmentation": 0.2}
    )
    request = PlanRequest.model_validate(
        {
            "model": {
                "name": "m",
                "num_layers": 8,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "seq_length": 1024,
                "vocab_size": 1024,
            },
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 1, "gpus_per_node": 2},
            "training": {"global_batch_size": 8},
        }
    )
    config = CandidateConfig(
        t=1,
        p=2,
        d=1,
        micro_batch_size=1,
        num_microbatches=8,
        recompute="none",
        schedule="1f1b",
        layers_per_stage=[4, 4],
    )
    memory = estimate(PlanContext(request, hw, []), config).memory
    for device in memory:
        tensors = device.parameters + device.gradients + device.optimizer + device.activations
        assert device.allowance == pytest.approx(2.5 * GIB + 0.2 * tensors, rel=1e-12)
    default = estimate(PlanContext(request, store.hardware("a100-sxm-80g"), []), config).memory
    tensors0 = sum(default[0][:4])
    assert default[0].allowance == pytest.approx(2.62 * GIB + 0.0 * tensors0, rel=1e-12)
