"""Measurements of a plan's candidates: what the executor measured, next to the prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api import problems
from api.schemas import MeasurementIn, MeasurementPublic
from api.services import read_retried
from api.services.plans import load_done_plan, load_plan
from api.store import crud
from api.store.measured_runs import record_plan_measurement
from api.store.models import Measurement

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["add_measurement", "list_measurements"]


def _public(row: Measurement) -> MeasurementPublic:
    predicted = row.predicted_iteration_time_s
    return MeasurementPublic(
        id=row.id,
        plan_id=row.plan_id,
        candidate=row.candidate,
        step_time_s=row.step_time_s,
        peak_activation_bytes=list(row.peak_activation_bytes),
        data=dict(row.data),
        predicted_iteration_time_s=predicted,
        step_time_error=None if not predicted else row.step_time_s / predicted - 1.0,
        created_at=row.created_at,
        measured_run_id=row.measured_run_id,
        not_calibrated_because=row.not_calibrated_because,
    )


def add_measurement(state: AppState, plan_id: str, body: MeasurementIn) -> MeasurementPublic:
    """Store what was measured for candidate ``body.candidate`` of a done plan, with the
    step time the plan predicted for it, and as a measured run for calibration; the answer
    says which run, or why the store refused it."""
    with state.database.session(write=True) as session:
        record = load_done_plan(session, plan_id, "report measurements for it")
        candidates = (record.result or {}).get("candidates") or []
        if body.candidate >= len(candidates):
            raise _wrong_for_this_plan(
                "no-such-candidate",
                "No such candidate",
                f"candidate {body.candidate} does not exist: plan {plan_id} has "
                f"{len(candidates)} candidate(s), numbered 0 to {max(len(candidates) - 1, 0)}",
                ("candidate", f"must be below {len(candidates)}", "less_than"),
            )
        peaks = len(body.peak_activation_bytes)
        if peaks and peaks != record.num_gpus:
            raise _wrong_for_this_plan(
                "wrong-rank-count",
                "Not one entry per rank",
                f"peak_activation_bytes has {peaks} entries, but plan {plan_id} runs on "
                f"{record.num_gpus} ranks: give one per rank, in rank order, or none",
                (
                    "peak_activation_bytes",
                    f"must have {record.num_gpus} entries (one per rank) or none",
                    "wrong_length",
                ),
            )
        predicted = candidates[body.candidate]["predicted"]["iteration_time_s"]
        row = crud.create_measurement(
            session=session,
            plan_id=plan_id,
            candidate=body.candidate,
            step_time_s=body.step_time_s,
            peak_activation_bytes=body.peak_activation_bytes,
            predicted_iteration_time_s=float(predicted) if predicted is not None else None,
            data=body.data,
        )
        # Each report is also a measured run: calibration learns from the team's own runs.
        record_plan_measurement(
            session=session,
            measurement=row,
            request=record.request,
            config=candidates[body.candidate]["config"],
        )
        return _public(row)


def _wrong_for_this_plan(
    slug: str, title: str, detail: str, error: tuple[str, str, str]
) -> problems.ApiProblem:
    """422: a measurement valid in itself that does not fit the plan it is reported for;
    ``error`` is the field's (name, message, type)."""
    field, msg, kind = error
    return problems.ApiProblem(
        422, slug, detail, title=title, errors=[{"loc": ["body", field], "msg": msg, "type": kind}]
    )


@read_retried
def list_measurements(state: AppState, plan_id: str) -> list[MeasurementPublic]:
    with state.database.session() as session:
        load_plan(session, plan_id)
        return [_public(m) for m in crud.list_measurements(session=session, plan_id=plan_id)]
