"""Measured runs: the data calibration fits the cost model to (store them, list them, read
one, withdraw them)."""

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

# MAX_REASON_CHARS and REASON_PATTERN: the rule of a withdrawal's reason, which the store
# enforces, for the route to state in its query parameter (routes reach the store only
# through this layer).
from api.store.measured_runs import (
    MAX_REASON_CHARS,
    REASON_PATTERN,
    UnknownRunError,
    add_runs,
    count_runs,
    get_run,
    list_runs,
    withdraw_run,
)
from api.store.models import MeasuredRunRecord
from planner.measurement_files import MeasurementFileError, ParsedRun

if TYPE_CHECKING:
    from api.state import AppState

__all__ = [
    "MAX_REASON_CHARS",
    "REASON_PATTERN",
    "add_measured_runs",
    "measured_run_public",
    "read_measured_run",
    "read_measured_runs",
    "withdraw_measured_run",
]


def measured_run_public(row: MeasuredRunRecord) -> MeasuredRunPublic:
    return MeasuredRunPublic.model_validate(
        {
            **row.run,
            "id": row.id,
            "origin": row.origin,
            "measurement_id": row.measurement_id,
            "created_at": row.created_at,
            "withdrawn_at": row.withdrawn_at,
            "withdrawn_reason": row.withdrawn_reason,
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
        created=report.created, unchanged=report.unchanged, restored=report.restored, ids=report.ids
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
    withdrawn: bool = False,
) -> MeasuredRunList:
    with state.database.session() as session:
        rows = list_runs(
            session=session,
            gpu=gpu,
            model=model,
            source=source,
            withdrawn=withdrawn,
            limit=limit,
            offset=offset,
        )
        total = count_runs(
            session=session, gpu=gpu, model=model, source=source, withdrawn=withdrawn
        )
        return MeasuredRunList(
            items=[measured_run_public(row) for row in rows],
            total=total,
            limit=limit,
            offset=offset,
        )


@read_retried
def read_measured_run(state: AppState, run_id: int) -> MeasuredRunPublic:
    """One run, in use or withdrawn (then with when and why); 404 naming the id when there
    is none."""
    with state.database.session() as session:
        row = get_run(session=session, run_id=run_id)
        if row is None:
            raise _not_found(run_id)
        return measured_run_public(row)


def withdraw_measured_run(state: AppState, run_id: int, reason: str | None) -> MeasuredRunPublic:
    """Withdraw a run (idempotent: one already withdrawn is answered as it was withdrawn);
    404 naming the id when there is none."""
    with state.database.session(write=True) as session:
        try:
            report = withdraw_run(session=session, run_id=run_id, reason=reason)
        except UnknownRunError:
            raise _not_found(run_id) from None
        session.commit()
        return measured_run_public(report.run)


def _not_found(run_id: int) -> problems.ApiProblem:
    return problems.not_found(
        "measured-run-not-found",
        "Measured run not found",
        f"no measured run has id {run_id}; GET /v1/measurements lists the runs in use "
        "and GET /v1/measurements?withdrawn=true the withdrawn ones, with their ids",
    )
