"""The plan's note naming the candidates its calibration error cannot tell from the first.

Expectations are computed here from the plan's own predicted step times and the error the
test gives the profile (ln of the ratio against the error), not by the module under test.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from planner.plan import plan
from planner.profiles import CalibrationRecord, JsonProfileStore, default_store
from planner.search.ties import near_tie_note, within_error
from planner.specs import Plan, PlanRequest, Predicted

ROOT = Path(__file__).resolve().parents[2]
GPU = "a100-sxm-80g"
ERROR = 0.05  # the calibration error the test gives the profile


def _predicted(seconds: float, error: float | None) -> Predicted:
    return Predicted(
        iteration_time_s=seconds,
        samples_per_s=1.0 / seconds,
        tokens_per_s=1.0 / seconds,
        mfu=0.5,
        bubble_fraction=0.1,
        memory_gib_per_device=[10.0],
        peak_memory_gib=10.0,
        time_source="uncalibrated model" if error is None else "calibrated model",
        calibration_error=error,
    )


def test_within_error_compares_the_log_ratio_with_the_larger_error():
    first = _predicted(10.0, 0.02)
    # ln(10.15 / 10) = 0.0149 < 0.02; ln(10.25 / 10) = 0.0247 > 0.02.
    assert within_error(first, _predicted(10.15, 0.02))
    assert not within_error(first, _predicted(10.25, 0.02))
    # The other's larger error (0.03) decides: 0.0247 < 0.03.
    assert within_error(first, _predicted(10.25, 0.03))
    # One error unknown (a measured point's): the known one decides, on either side.
    assert within_error(first, _predicted(10.15, None))
    assert within_error(_predicted(10.0, None), _predicted(10.25, 0.03))
    assert not within_error(_predicted(10.0, None), _predicted(10.25, 0.02))
    # Both unknown: nothing is claimed.
    assert not within_error(_predicted(10.0, None), _predicted(10.001, None))
    # The gap counts either way (ln(9.85 / 10) = -0.0151), and the error bounds it.
    assert within_error(first, _predicted(9.85, 0.02))
    assert not within_error(first, _predicted(9.75, 0.02))
    assert within_error(first, _predicted(10.0 * math.exp(0.0199), 0.02))
    assert not within_error(first, _predicted(10.0 * math.exp(0.0201), 0.02))


@pytest.fixture(scope="module")
def request_13b() -> PlanRequest:
    raw = json.loads((ROOT / "examples" / "gpt3-13b-8xa100.json").read_text())
    raw["search"]["schedules"] = ["1f1b"]
    raw["search"]["top_k"] = 8
    return PlanRequest.model_validate(raw)


def _plan(request: PlanRequest, calibrated: bool) -> Plan:
    hardware = default_store().hardware(GPU)
    if calibrated:
        record = CalibrationRecord(
            fitted_at="2026-11-26T00:00:00Z",
            num_runs=5,
            rms_log_error=ERROR,
            rms_log_error_before=0.2,
        )
        hardware = hardware.with_parameters({}, record)
    store = JsonProfileStore()
    store.add_hardware(hardware)
    store.add_points(default_store().layer_points(GPU))
    return plan(request, store)


def _tie_notes(result: Plan) -> list[str]:
    assert result.best is not None
    return [n for n in result.best.notes if "cannot order them reliably" in n]


def test_the_first_candidate_names_those_within_the_calibration_error(request_13b):
    uncalibrated = _plan(request_13b, calibrated=False)
    calibrated = _plan(request_13b, calibrated=True)
    # Only the error is new: the same candidates, in the same order, at the same times.
    labels = [c.config.label for c in calibrated.candidates]
    assert labels == [c.config.label for c in uncalibrated.candidates]
    times = [c.predicted.iteration_time_s for c in calibrated.candidates]
    assert times == [c.predicted.iteration_time_s for c in uncalibrated.candidates]
    assert _tie_notes(uncalibrated) == []  # no error known, nothing claimed
    # Every candidate here is priced by the calibrated model (this request has no measured
    # point), so each carries the profile's error.
    assert {c.predicted.calibration_error for c in calibrated.candidates} == {ERROR}
    expected = [
        rank for rank in range(2, len(times) + 1) if math.log(times[rank - 1] / times[0]) < ERROR
    ]
    assert expected, "the request should have near ties under a 5% error"
    (note,) = _tie_notes(calibrated)
    named = [int(n) for n in re.findall(r"#(\d+) \(", note)]
    assert named == expected
    for rank in expected:
        gap = times[rank - 1] / times[0] - 1
        assert f"#{rank} ({labels[rank - 1]}, {gap:+.1%})" in note
    assert f"{ERROR:.3f}" in note
    # Only the first candidate carries it.
    assert all(
        "cannot order them reliably" not in n for c in calibrated.candidates[1:] for n in c.notes
    )


def _with_error(candidates, error):
    """The candidates with every known calibration error set to ``error``."""
    return [
        c.model_copy(
            update={
                "predicted": c.predicted.model_copy(
                    update={
                        "calibration_error": error
                        if c.predicted.calibration_error is not None
                        else None
                    }
                )
            }
        )
        for c in candidates
    ]


def test_the_note_follows_the_size_of_the_error(request_13b):
    calibrated = _plan(request_13b, calibrated=True)
    first = calibrated.candidates[0]
    # The first candidate and those predicted strictly slower than it.
    slower = [first] + [
        c
        for c in calibrated.candidates[1:]
        if c.predicted.iteration_time_s > first.predicted.iteration_time_s
    ]
    gaps = [
        math.log(c.predicted.iteration_time_s / first.predicted.iteration_time_s)
        for c in slower[1:]
    ]
    assert near_tie_note(_with_error(slower, min(gaps) / 2)) is None
    wide = near_tie_note(_with_error(slower, max(gaps) * 2))
    assert wide is not None
    # The first five are named, the others counted.
    named = list(range(2, min(len(slower), 6) + 1))
    assert [int(n) for n in re.findall(r"#(\d+) \(", wide)] == named
    assert len(slower) > 6, "the request should have more ties than the note names"
    assert f"and {len(slower) - 6} more of the listed candidates are predicted" in wide
    # Between the first two gaps: only the second candidate, named alone.
    one = near_tie_note(_with_error(slower, (gaps[0] + gaps[1]) / 2))
    assert gaps[0] < gaps[1], "the request's first two slower candidates should differ"
    assert one is not None
    assert one.startswith(f"#2 ({slower[1].config.label}, ")
    assert " is predicted within" in one and "#3" not in one
