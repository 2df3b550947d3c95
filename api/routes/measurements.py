"""/v1/measurements: measured runs, the data calibration fits the cost model to.

GET /v1/measurements/{id} answers one run, in use or withdrawn (with when and why): the
lists show either kind only when asked for it, and a calibration names its runs by id.
DELETE withdraws a run rather than deleting it (see :mod:`api.store.measured_runs`); its
``reason`` is a query parameter, not a body: a body of DELETE has no defined meaning
(RFC 9110, 9.3.5), some clients cannot send one and some proxies drop it, and a reason
lost on the way would withdraw the run without the record of why."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam
from starlette.responses import Response

from api.deps import WRITE, JsonBodyRoute, StateDep, strict_body
from api.measurement_schemas import (
    MeasuredRunList,
    MeasuredRunPublic,
    MeasuredRunsIn,
    MeasuredRunsWriteResult,
)
from api.routes._docs import problems_of
from api.schemas import HARDWARE_NAME_PATTERN, NO_NUL_PATTERN
from api.services import measured_runs
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/measurements", tags=["measurements"], route_class=JsonBodyRoute)

RunId = Annotated[
    int, PathParam(ge=1, description="The run's id (from GET or POST /v1/measurements).")
]


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
    withdrawn: Annotated[
        bool,
        Query(description="List the withdrawn runs (with when and why) instead of those in use."),
    ] = False,
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
        withdrawn=withdrawn,
    )


@router.get(
    "/{run_id}",
    response_model=MeasuredRunPublic,
    summary="One measured run, in use or withdrawn",
    description="A withdrawn run is answered too, with `withdrawn_at` and `withdrawn_reason` "
    "set (the lists show it only with `?withdrawn=true`).",
    responses=problems_of(401, 403, 404, 422, 503),
)
async def read_measurement(run_id: RunId, state: StateDep) -> MeasuredRunPublic:
    return await offload(state, measured_runs.read_measured_run, state, run_id)


@router.delete(
    "/{run_id}",
    response_model=MeasuredRunPublic,
    dependencies=WRITE,
    summary="Withdraw a measured run: kept, but left out of lists and calibration",
    description="The run stays stored (calibrations name the runs they used) with when and "
    "why it was withdrawn; `GET /v1/measurements?withdrawn=true` lists it. Withdrawing it "
    "again changes nothing and answers it as first withdrawn. Posting the identical run "
    "again (`POST /v1/measurements`) puts it back in use; loading the bundled runs does not.",
    responses={
        200: {"model": MeasuredRunPublic, "description": "The run, withdrawn."},
        **problems_of(401, 403, 404, 422, 503),
    },
)
async def withdraw_measurement(
    run_id: RunId,
    state: StateDep,
    reason: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=measured_runs.MAX_REASON_CHARS,
            pattern=measured_runs.REASON_PATTERN,
            description="Why it is withdrawn (kept with it), e.g. 'the step time was in ms'.",
        ),
    ] = None,
) -> MeasuredRunPublic:
    return await offload(state, measured_runs.withdraw_measured_run, state, run_id, reason)
