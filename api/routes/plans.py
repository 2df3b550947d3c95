"""/v1/plans: submit a plan request, poll it, list and delete plans, report measurements,
and a candidate's timeline and launch artefacts. Routes parse and answer; the use cases
are in ``api.services``.

POST answers 201 with the plan when the search ends within the wait (``?wait_s=``, default
the server's ``plan_wait_s``), 202 with a Location to poll when it does not, and 200 when
an identical request (same request, same profile revision, same planner) was already
answered: the stored plan is returned without searching again.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from api import problems
from api.deps import WRITE, JsonBodyRoute, PrincipalDep, StateDep, strict_body
from api.problems import PROBLEM_MEDIA_TYPE
from api.routes._docs import PLAN_EXAMPLES, problems_of
from api.schemas import (
    HARDWARE_NAME_PATTERN,
    NO_NUL_PATTERN,
    MeasurementIn,
    MeasurementPublic,
    PlanList,
    PlanPublic,
    PlanStatus,
)
from api.services import launches, measurements, plans, timelines
from api.state import offload
from planner.specs import Launch, PlanRequest

__all__ = ["router"]

router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=JsonBodyRoute)

PlanId = Annotated[str, PathParam(description="The plan's id (from POST /v1/plans).")]
CandidateIndex = Annotated[int, Query(ge=0, le=999, description="Rank in the plan (0 = best).")]
IncludeRejected = Annotated[
    bool,
    Query(
        description="Include every rejected configuration with its reason (can be thousands; "
        "like `stagewright plan --all`)."
    ),
]


def _response(answer: plans.PlanAnswer) -> Response:
    return Response(
        content=answer.body,
        status_code=answer.status,
        media_type=PROBLEM_MEDIA_TYPE if answer.problem else "application/json",
        headers=answer.headers,
    )


@router.post(
    "",
    status_code=201,
    response_model=PlanPublic,
    dependencies=[*WRITE, Depends(strict_body(PlanRequest))],
    summary="Plan a training run",
    responses={
        200: {"model": PlanPublic, "description": "Answered from the store (identical request)."},
        202: {"model": PlanPublic, "description": "Still searching: poll the Location."},
        **problems_of(400, 401, 403, 408, 413, 415, 422, 503),
    },
)
async def create_plan(
    body: Annotated[PlanRequest, Body(openapi_examples=PLAN_EXAMPLES)],
    state: StateDep,
    principal: PrincipalDep,
    wait_s: Annotated[
        float | None,
        Query(
            ge=0,
            # The server's max_wait_s is written into the OpenAPI document (api.openapi).
            le=600,
            allow_inf_nan=False,
            description="Seconds to wait for the search before answering 202 (default: the "
            "server's plan_wait_s; 0 answers at once).",
        ),
    ] = None,
    include_rejected: IncludeRejected = False,
) -> Response:
    settings = state.settings
    if wait_s is not None and wait_s > settings.max_wait_s:
        raise problems.limit_exceeded(
            f"wait_s {wait_s:g} is above this server's limit of {settings.max_wait_s:g} s; "
            "wait less and poll the Location"
        )
    admission = await offload(state, plans.submit_plan, state, body, principal)
    await plans.wait_for_plan(state, admission, settings.plan_wait_s if wait_s is None else wait_s)
    answer = await offload(
        state, plans.answer_admission, state, admission, include_rejected=include_rejected
    )
    return _response(answer)


@router.get(
    "/{plan_id}",
    response_model=PlanPublic,
    summary="A plan, or where its search stands",
    responses=problems_of(401, 403, 404, 422, 503),
)
async def read_plan(
    plan_id: PlanId, state: StateDep, include_rejected: IncludeRejected = False
) -> Response:
    answer = await offload(
        state, plans.read_plan, state, plan_id, include_rejected=include_rejected
    )
    return _response(answer)


@router.delete(
    "/{plan_id}",
    status_code=204,
    dependencies=WRITE,
    summary="Delete a plan (its creator's token or an admin token)",
    responses={204: {"description": "Deleted."}, **problems_of(401, 403, 404, 503)},
)
async def delete_plan(plan_id: PlanId, state: StateDep, principal: PrincipalDep) -> Response:
    await offload(state, plans.delete_plan, state, plan_id, principal)
    return Response(status_code=204)


@router.get(
    "",
    response_model=PlanList,
    summary="List plans, newest first",
    responses=problems_of(401, 403, 422, 503),
)
async def list_plans(
    state: StateDep,
    status: Annotated[PlanStatus | None, Query(description="Only plans in this state.")] = None,
    gpu: Annotated[
        str | None,
        Query(pattern=HARDWARE_NAME_PATTERN, description="Only plans for this hardware."),
    ] = None,
    model: Annotated[
        str | None,
        Query(max_length=200, pattern=NO_NUL_PATTERN, description="Only this model name."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Plans to skip.")] = 0,
) -> PlanList:
    return await offload(
        state,
        plans.list_plans,
        state,
        status=status,
        gpu=gpu,
        model=model,
        limit=limit,
        offset=offset,
    )


@router.post(
    "/{plan_id}/measurements",
    status_code=201,
    response_model=MeasurementPublic,
    dependencies=[*WRITE, Depends(strict_body(MeasurementIn))],
    summary="Report what the executor measured for a candidate of this plan",
    responses=problems_of(400, 401, 403, 404, 408, 409, 413, 415, 422, 503),
)
async def create_measurement(
    plan_id: PlanId, body: MeasurementIn, state: StateDep, response: Response
) -> MeasurementPublic:
    created = await offload(state, measurements.add_measurement, state, plan_id, body)
    response.headers["Location"] = f"/v1/plans/{plan_id}/measurements"
    return created


@router.get(
    "/{plan_id}/measurements",
    response_model=list[MeasurementPublic],
    summary="Measurements reported for this plan",
    responses=problems_of(401, 403, 404, 503),
)
async def list_measurements(plan_id: PlanId, state: StateDep) -> list[MeasurementPublic]:
    return await offload(state, measurements.list_measurements, state, plan_id)


def _timeline_window(
    start_s: Annotated[
        float,
        Query(
            ge=0,
            le=1e9,
            allow_inf_nan=False,
            description="Only actions that end at or after this time.",
        ),
    ] = 0.0,
    end_s: Annotated[
        float | None,
        Query(
            ge=0,
            le=1e9,
            allow_inf_nan=False,
            description="Only actions that start at or before this time (not before start_s).",
        ),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=20_000, description="At most this many actions, earliest first.")
    ] = 20_000,
) -> timelines.TimelineWindow:
    """The window a timeline request asks for; one that ends before it starts is refused
    (it would answer no action at all, as if the schedule were empty there)."""
    if end_s is not None and end_s < start_s:
        raise RequestValidationError(
            [
                {
                    "type": "less_than_start",
                    "loc": ("query", "end_s"),
                    "msg": f"end_s {end_s:g} is before start_s {start_s:g}; give an end_s at "
                    "or after start_s, or leave it out for the rest of the step",
                    "input": end_s,
                }
            ]
        )
    return timelines.TimelineWindow(start_s=start_s, end_s=end_s, limit=limit)


@router.get(
    "/{plan_id}/timeline",
    summary="The simulated timeline of one of a plan's ranked candidates",
    response_class=Response,
    responses={
        200: {"content": {"application/json": {"schema": {"type": "object"}}}},
        **problems_of(401, 403, 404, 409, 410, 422, 503),
    },
)
async def timeline(
    plan_id: PlanId,
    state: StateDep,
    window: Annotated[timelines.TimelineWindow, Depends(_timeline_window)],
    candidate: CandidateIndex = 0,
) -> Response:
    """The candidate's schedule, simulated with the profiles the plan was priced with:
    ``mode`` 'actions' lists each device's compute actions and BPipe transfers
    ([kind, stage, micro-batch, start s, end s]) in the window, at most ``limit`` of them
    (``truncated`` and ``next_start_s`` say where to continue); ``mode`` 'summary' (a
    schedule too large to simulate action by action) gives each device's forward,
    backward, weight, busy and idle time over the step."""
    body = await offload(state, timelines.plan_timeline_json, state, plan_id, candidate, window)
    return Response(content=body, media_type="application/json")


@router.get(
    "/{plan_id}/candidates/{candidate}/launch",
    response_class=Response,
    summary="A candidate's complete launch artefacts (every action and rank)",
    responses={
        200: {"model": Launch, "description": "The complete launch artefacts."},
        **problems_of(401, 403, 404, 409, 413, 422, 503),
    },
)
async def candidate_launch(
    plan_id: PlanId,
    candidate: Annotated[int, PathParam(ge=0, le=999, description="Rank in the plan (0 = best).")],
    state: StateDep,
) -> Response:
    """A plan stores each candidate's schedule by its generator's parameters; this answers
    the executor config with the schedule's actions and every rank, and the schedule's
    torch.distributed.pipelining CSV (what `stagewright run` and torchrun need)."""
    body = await offload(state, launches.candidate_launch, state, plan_id, candidate)
    return Response(content=body, media_type="application/json")


@router.get(
    "/{plan_id}/launch.tar.gz",
    response_class=Response,
    summary="Every ranked candidate's launch artefacts, as stagewright plan --emit writes them",
    responses={
        200: {
            "content": {"application/gzip": {}},
            "description": "A gzipped tar of one folder per ranked candidate (candidate-1 is "
            "the best): executor-config.json, run-node<i>.sh with the torchrun line of node i, "
            "Megatron-LM arguments and scripts and the torch.distributed.pipelining CSV where "
            "those runtimes can run it; plan.json and README.md.",
        },
        **problems_of(401, 403, 404, 409, 413, 422, 503),
    },
)
async def plan_launch_archive(plan_id: PlanId, state: StateDep) -> Response:
    """The files a person needs to launch any ranked candidate: the same files, made by the
    same code, as `stagewright plan REQUEST.json --emit DIR`."""
    body = await offload(state, launches.plan_archive, state, plan_id)
    return Response(
        content=body,
        media_type="application/gzip",
        headers={
            "Content-Disposition": f'attachment; filename="stagewright-plan-{plan_id}.tar.gz"'
        },
    )
