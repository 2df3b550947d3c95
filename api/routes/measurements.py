"""/v1/measurements: measured runs, the data calibration fits the cost model to."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from api.deps import WRITE, JsonBodyRoute, StateDep, strict_body
from api.measurement_schemas import MeasuredRunList, MeasuredRunsIn, MeasuredRunsWriteResult
from api.routes._docs import problems_of
from api.schemas import HARDWARE_NAME_PATTERN, NO_NUL_PATTERN
from api.services import measured_runs
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/measurements", tags=["measurements"], route_class=JsonBodyRoute)


@router.post(
    "",
    status_code=201,
    response_model=MeasuredRunsWriteResult,
    dependencies=[*WRITE, Depends(strict_body(MeasuredRunsIn))],
    summary="Store measured runs (all or none)",
    responses={
        200: {"model": MeasuredRunsWriteResult, "description": "Every run was already stored."},
        **problems_of(400, 401, 403, 408, 413, 415, 422, 503),
    },
)
async def write_measurements(
    body: MeasuredRunsIn, state: StateDep, response: Response
) -> MeasuredRunsWriteResult:
    result = await offload(state, measured_runs.add_measured_runs, state, body)
    if not result.created:
        response.status_code = 200
    return result


@router.get(
    "",
    response_model=MeasuredRunList,
    summary="Measured runs, filtered and paged",
    responses=problems_of(401, 403, 422, 503),
)
async def read_measurements(
    state: StateDep,
    gpu: Annotated[
        str | None, Query(pattern=HARDWARE_NAME_PATTERN, description="Only this hardware's runs.")
    ] = None,
    model: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=NO_NUL_PATTERN,
            description="Only runs of this model (its name).",
        ),
    ] = None,
    source: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=NO_NUL_PATTERN,
            description="Only runs whose source contains this (any case).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Runs per page.")] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Runs to skip.")] = 0,
) -> MeasuredRunList:
    return await offload(
        state,
        measured_runs.read_measured_runs,
        state,
        gpu=gpu,
        model=model,
        source=source,
        limit=limit,
        offset=offset,
    )
