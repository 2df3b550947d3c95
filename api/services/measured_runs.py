"""Measured runs: the data calibration fits the cost model to (store them, list them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api import problems
from api.measurement_schemas import (
    MeasuredRunList,
    MeasuredRunPublic,
    MeasuredRunsIn,
    MeasuredRunsWriteResult,
)
from api.services import read_retried
from api.store.measured_runs import add_runs, count_runs, list_runs
from api.store.models import MeasuredRunRecord
from planner.measurement_files import MeasurementFileError, ParsedRun

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["add_measured_runs", "measured_run_public", "read_measured_runs"]


def measured_run_public(row: MeasuredRunRecord) -> MeasuredRunPublic:
    return MeasuredRunPublic.model_validate(
        {
            **row.run,
            "id": row.id,
            "origin": row.origin,
            "measurement_id": row.measurement_id,
            "created_at": row.created_at,
        }
    )


def add_measured_runs(state: AppState, body: MeasuredRunsIn) -> MeasuredRunsWriteResult:
    """Store the runs, all or none (one transaction)."""
    parsed = [ParsedRun(f"runs[{i}]", run) for i, run in enumerate(body.runs)]
    with state.database.session(write=True) as session:
        try:
            report = add_runs(session=session, runs=parsed, origin="api", name="the request")
        except MeasurementFileError as exc:
            session.rollback()
            raise problems.ApiProblem(
                422, "invalid-measurements", str(exc), title="Invalid measurements"
            ) from None
        session.commit()
    return MeasuredRunsWriteResult(
        created=report.created, unchanged=report.unchanged, ids=report.ids
    )


@read_retried
def read_measured_runs(
    state: AppState,
    *,
    gpu: str | None,
    model: str | None,
    source: str | None,
    limit: int,
    offset: int,
) -> MeasuredRunList:
    with state.database.session() as session:
        rows = list_runs(
            session=session, gpu=gpu, model=model, source=source, limit=limit, offset=offset
        )
        return MeasuredRunList(
            items=[measured_run_public(row) for row in rows],
            total=count_runs(session=session, gpu=gpu, model=model, source=source),
            limit=limit,
            offset=offset,
        )
