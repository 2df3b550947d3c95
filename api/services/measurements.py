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
    )


def add_measurement(state: AppState, plan_id: str, body: MeasurementIn) -> MeasurementPublic:
    """Store what was measured for candidate ``body.candidate`` of a done plan, with the
    step time the plan predicted for it."""
    with state.database.session(write=True) as session:
        record = load_done_plan(session, plan_id, "report measurements for it")
        candidates = (record.result or {}).get("candidates") or []
        if body.candidate >= len(candidates):
            raise problems.ApiProblem(
                422,
                "no-such-candidate",
                f"candidate {body.candidate} does not exist: plan {plan_id} has "
                f"{len(candidates)} candidate(s), numbered 0 to {max(len(candidates) - 1, 0)}",
                title="No such candidate",
                errors=[
                    {
                        "loc": ["body", "candidate"],
                        "msg": f"must be below {len(candidates)}",
                        "type": "less_than",
                    }
                ],
            )
        peaks = len(body.peak_activation_bytes)
        if peaks and peaks != record.num_gpus:
            raise problems.ApiProblem(
                422,
                "wrong-rank-count",
                f"peak_activation_bytes has {peaks} entries, but plan {plan_id} runs on "
                f"{record.num_gpus} ranks: give one per rank, in rank order, or none",
                title="Not one entry per rank",
                errors=[
                    {
                        "loc": ["body", "peak_activation_bytes"],
                        "msg": f"must have {record.num_gpus} entries (one per rank) or none",
                        "type": "wrong_length",
                    }
                ],
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
        public = _public(row)
        # Each report is also a measured run: calibration learns from the team's own runs.
        record_plan_measurement(
            session=session,
            measurement=row,
            request=record.request,
            config=candidates[body.candidate]["config"],
        )
        return public


@read_retried
def list_measurements(state: AppState, plan_id: str) -> list[MeasurementPublic]:
    with state.database.session() as session:
        load_plan(session, plan_id)
        return [_public(m) for m in crud.list_measurements(session=session, plan_id=plan_id)]
