"""The plan's note when its first candidate and the best one priced from the other kind of
source (measured layer points, the model alone) would swap places priced alike.

Expectations come from a plan of the same request without any measured point: there every
candidate is priced by the model alone, so its step times are what "priced alike" means.
A point is made of the model's own times for one layer shape times a factor, so which
candidates it moves, and by how much, is known in advance.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.costmodel.timing import modelled_layer_times
from planner.plan import plan
from planner.profiles import CalibrationRecord, JsonProfileStore, LayerPoint, default_store
from planner.specs import CandidateConfig, Plan, PlanRequest

ROOT = Path(__file__).resolve().parents[2]
GPU = "a100-sxm-80g"


@pytest.fixture(scope="module")
def request_13b() -> PlanRequest:
    raw = json.loads((ROOT / "examples" / "gpt3-13b-8xa100.json").read_text())
    raw["search"]["schedules"] = ["1f1b"]
    raw["search"]["top_k"] = 30  # room for the candidates a point moves down
    return PlanRequest.model_validate(raw)


def _store(points: list[LayerPoint]) -> JsonProfileStore:
    store = JsonProfileStore()
    store.add_hardware(default_store().hardware(GPU))
    store.add_points(points)
    return store


def _point(request: PlanRequest, config: CandidateConfig, factor: float) -> LayerPoint:
    """A measured point of ``config``'s layer shape: the model's own F, B, W x ``factor``."""
    hw = default_store().hardware(GPU)
    model, training = request.model, request.training
    times = modelled_layer_times(
        hw, model, training, config.micro_batch_size, config.t, config.recompute
    )
    return LayerPoint(
        gpu=GPU,
        precision=training.precision,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        ffn_hidden_size=model.ffn,
        seq_length=model.seq_length,
        micro_batch_size=config.micro_batch_size,
        t=config.t,
        recompute=config.recompute,
        sequence_parallel=training.sequence_parallel,
        flash_attention=training.flash_attention,
        forward_ms=times.forward * 1e3 * factor,
        backward_ms=times.backward * 1e3 * factor,
        weight_ms=times.weight * 1e3 * factor,
        activation_bytes=None,
        includes_tp_comm=True,
        source=f"test point, the model's times x {factor}",
    )


def _order_notes(result: Plan) -> list[str]:
    return [n for n in result.notes if "priced by the model alone too" in n]


def _time_of(result: Plan, label: str) -> float:
    (found,) = [c for c in result.candidates if c.config.label == label]
    return found.predicted.iteration_time_s


@pytest.fixture(scope="module")
def model_only(request_13b: PlanRequest) -> Plan:
    return plan(request_13b, _store([]))


def _shape(config: CandidateConfig) -> tuple[int, int, str]:
    return config.t, config.micro_batch_size, config.recompute


def test_without_measured_points_there_is_no_order_note(model_only: Plan) -> None:
    assert model_only.candidates
    assert _order_notes(model_only) == []


def test_a_point_that_agrees_with_the_model_changes_nothing(
    request_13b: PlanRequest, model_only: Plan
) -> None:
    first = model_only.candidates[0].config
    with_point = plan(request_13b, _store([_point(request_13b, first, 1.0)]))
    assert [c.config.label for c in with_point.candidates] == [
        c.config.label for c in model_only.candidates
    ]
    assert _order_notes(with_point) == []


def test_a_slow_measurement_under_the_first_candidate_is_named(
    request_13b: PlanRequest, model_only: Plan
) -> None:
    """The model alone ranks A first; its shape measured 6% slower drops A. Priced alike
    (the model alone), A is faster than the new first candidate: the note says so, with A's
    model-only step time."""
    a = model_only.candidates[0].config
    result = plan(request_13b, _store([_point(request_13b, a, 1.06)]))
    first = result.candidates[0]
    assert _shape(first.config) != _shape(a)
    assert first.predicted.time_source == "uncalibrated model"
    measured = [c for c in result.candidates if c.predicted.time_source != "uncalibrated model"]
    rank = result.candidates.index(measured[0]) + 1
    alone = _time_of(model_only, measured[0].config.label)
    assert alone < first.predicted.iteration_time_s  # the order turns when priced alike
    (note,) = _order_notes(result)
    assert note.startswith(
        f"#1 ({first.config.label}) takes its layer times from the model alone and "
        f"#{rank} ({measured[0].config.label}) from measured points; priced by the model "
        f"alone too, #{rank} would take {alone:.3f} s a step, less than #1's "
        f"{first.predicted.iteration_time_s:.3f} s."
    )
    # The bundled profile is not calibrated: calibrating it comes first, and the sentence
    # reads as one.
    assert note.endswith(
        "; before trusting it, calibrate the profile to measured runs (stagewright calibrate "
        "--hardware a100-sxm-80g): it has not been calibrated."
    )


def test_with_a_calibrated_profile_the_note_asks_for_runs_of_these_configurations(
    request_13b: PlanRequest, model_only: Plan
) -> None:
    """The same slow measurement under a calibrated profile: calibrating again with what is
    stored would not help, so the note asks for measured runs of the two configurations."""
    a = model_only.candidates[0].config
    store = _store([_point(request_13b, a, 1.06)])
    fitted = CalibrationRecord(
        fitted_at="2026-01-05T00:00:00Z", num_runs=3, rms_log_error=0.0, rms_log_error_before=0.1
    )
    store.add_hardware(replace(default_store().hardware(GPU), calibration=fitted))
    (note,) = _order_notes(plan(request_13b, store))
    assert note.endswith(
        "; before trusting it, add measured runs of these configurations (stagewright "
        "measurements add) and calibrate again: the profile's calibration does not reconcile "
        "them."
    )
    assert "stagewright calibrate --hardware" not in note


def test_a_fast_measurement_that_lifts_a_candidate_to_first_is_named(
    request_13b: PlanRequest, model_only: Plan
) -> None:
    """A candidate of another layer shape than the model's first, measured 30% faster,
    becomes first; priced alike it is slower than the best modelled one."""
    first_shape = _shape(model_only.candidates[0].config)
    b = next(c.config for c in model_only.candidates if _shape(c.config) != first_shape)
    result = plan(request_13b, _store([_point(request_13b, b, 0.7)]))
    first = result.candidates[0]
    assert first.predicted.time_source != "uncalibrated model"
    modelled = [c for c in result.candidates if c.predicted.time_source == "uncalibrated model"]
    rank = result.candidates.index(modelled[0]) + 1
    alone = _time_of(model_only, first.config.label)
    assert alone > modelled[0].predicted.iteration_time_s
    (note,) = _order_notes(result)
    assert note.startswith(
        f"#1 ({first.config.label}) takes its layer times from measured points and "
        f"#{rank} ({modelled[0].config.label}) from the model alone; priced by the model "
        f"alone too, #1 would take {alone:.3f} s a step, more than #{rank}'s "
        f"{modelled[0].predicted.iteration_time_s:.3f} s."
    )


def test_a_measurement_that_does_not_change_the_order_is_not_named(
    request_13b: PlanRequest, model_only: Plan
) -> None:
    """The first candidate's shape measured 1% slower stays first when it was ahead by more
    than that: priced alike it is still first, so nothing to say."""
    a, second = model_only.candidates[0], model_only.candidates[1]
    margin = second.predicted.iteration_time_s / a.predicted.iteration_time_s - 1
    assert margin > 0.01, "the example's first two candidates are too close for this test"
    result = plan(request_13b, _store([_point(request_13b, a.config, 1.01)]))
    assert result.candidates[0].config.label == a.config.label
    assert _order_notes(result) == []
