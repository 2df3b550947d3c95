"""/v1/measurements: measured runs, the data calibration fits the cost model to."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from api.deps import WRITE, SessionDep, strict_body
from api.measurement_schemas import (
    MeasuredRunList,
    MeasuredRunPublic,
    MeasuredRunsIn,
    MeasuredRunsWriteResult,
)
from api.problems import ApiProblem
from api.routes._docs import problems
from api.schemas import HARDWARE_NAME_PATTERN
from api.store.measured_runs import add_runs, count_runs, list_runs
from api.store.models import MeasuredRunRecord
from planner.measurement_files import MeasurementFileError, ParsedRun

__all__ = ["router"]

router = APIRouter(prefix="/v1/measurements", tags=["measurements"])


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


@router.post(
    "",
    status_code=201,
    response_model=MeasuredRunsWriteResult,
    dependencies=[*WRITE, Depends(strict_body(MeasuredRunsIn))],
    summary="Store measured runs (all or none)",
    responses={
        200: {"model": MeasuredRunsWriteResult, "description": "Every run was already stored."},
        **problems(400, 401, 413, 422, 503),
    },
)
def write_measurements(
    body: MeasuredRunsIn, session: SessionDep, response: Response
) -> MeasuredRunsWriteResult:
    parsed = [ParsedRun(f"runs[{i}]", run) for i, run in enumerate(body.runs)]
    try:
        report = add_runs(session=session, runs=parsed, origin="api", name="the request")
    except MeasurementFileError as exc:
        session.rollback()
        raise ApiProblem(
            422, "invalid-measurements", str(exc), title="Invalid measurements"
        ) from None
    session.commit()
    if not report.created:
        response.status_code = 200
    return MeasuredRunsWriteResult(
        created=report.created, unchanged=report.unchanged, ids=report.ids
    )


@router.get(
    "",
    response_model=MeasuredRunList,
    summary="Measured runs, filtered and paged",
    responses=problems(422, 503),
)
def read_measurements(
    session: SessionDep,
    gpu: Annotated[
        str | None, Query(pattern=HARDWARE_NAME_PATTERN, description="Only this hardware's runs.")
    ] = None,
    model: Annotated[
        str | None, Query(max_length=200, description="Only runs of this model (its name).")
    ] = None,
    source: Annotated[
        str | None,
        Query(max_length=200, description="Only runs whose source contains this (any case)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Runs per page.")] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Runs to skip.")] = 0,
) -> MeasuredRunList:
    rows = list_runs(
        session=session, gpu=gpu, model=model, source=source, limit=limit, offset=offset
    )
    return MeasuredRunList(
        items=[measured_run_public(row) for row in rows],
        total=count_runs(session=session, gpu=gpu, model=model, source=source),
        limit=limit,
        offset=offset,
    )
