"""/v1/plans: submit a plan request, poll it, list plans, report measurements.

POST answers 201 with the plan when the search ends within the wait (``?wait_s=``, default
the server's ``plan_wait_s``), 202 with a Location to poll when it does not, and 200 when
an identical request (same request, same hardware-profile revision, same planner) was
already answered: the stored plan is returned without searching again.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session
from starlette.responses import Response

from api.deps import WRITE, AppState, SessionDep, StateDep, strict_body
from api.hashing import request_hash
from api.limits import check_plan_request
from api.problems import ApiProblem, problem_response
from api.routes._docs import problems
from api.schemas import (
    HARDWARE_NAME_PATTERN,
    MeasurementIn,
    MeasurementPublic,
    PlanList,
    PlanPublic,
    PlanStatus,
    PlanSummary,
)
from api.store import crud
from api.store.measured_runs import record_plan_measurement
from api.store.models import Measurement, PlanRecord
from api.store.profiles import hardware_profile, require_hardware
from planner.profiles import UnknownHardwareError
from planner.specs import Plan, PlanRequest

__all__ = ["router"]

router = APIRouter(prefix="/v1/plans", tags=["plans"])

PLAN_EXAMPLES = {
    "tiny": {
        "summary": "A tiny GPT on the 4-core CPU profile (every schedule)",
        "value": {
            "model": {
                "name": "tiny-gpt",
                "num_layers": 8,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "seq_length": 128,
                "vocab_size": 1024,
            },
            "cluster": {"gpu": "cpu", "num_nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": 16, "precision": "fp32"},
            "search": {"schedules": ["1f1b", "bpipe", "v-half"], "top_k": 5},
        },
    },
    "gpt3-96b": {
        "summary": "GPT-3 96B on 32 A100-80G (BPipe paper, Table 7)",
        "value": {
            "model": {
                "name": "gpt3-96b",
                "num_layers": 80,
                "hidden_size": 9984,
                "num_attention_heads": 104,
                "seq_length": 2048,
                "vocab_size": 51200,
            },
            "cluster": {"gpu": "a100-sxm-80g", "num_nodes": 4, "gpus_per_node": 8},
            "training": {"global_batch_size": 128},
            "search": {"schedules": ["1f1b", "bpipe"]},
        },
    },
}
_PLAN_ID = re.compile(r"[0-9a-f]{32}")
_HARDWARE_NAME = re.compile(HARDWARE_NAME_PATTERN)
PlanId = Annotated[str, PathParam(description="The plan's id (from POST /v1/plans).")]
IncludeRejected = Annotated[
    bool,
    Query(
        description="Include every rejected configuration with its reason (can be thousands; "
        "like `stagewright plan --all`)."
    ),
]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def plan_document(record: PlanRecord, *, include_rejected: bool) -> dict[str, Any]:
    """The PlanPublic JSON of a record: the stored Plan's fields (their defaults, or empty,
    until done; a field added to Plan after a plan was stored gets its default) and the job's
    status around them."""
    result = record.result or {}
    doc: dict[str, Any] = {}
    for name, field in Plan.model_fields.items():
        if name in result:
            doc[name] = result[name]
        elif field.is_required():
            doc[name] = None
        else:
            doc[name] = to_jsonable_python(field.get_default(call_default_factory=True))
    doc["id"] = record.id
    doc["request"] = result.get("request", record.request)
    doc["candidates"] = doc["candidates"] or []
    doc["rejected"] = (doc["rejected"] or []) if include_rejected else []
    doc.update(
        status=record.status,
        created_at=_iso(record.created_at),
        updated_at=_iso(record.updated_at),
        finished_at=_iso(record.finished_at),
        hardware_revision=record.hardware_revision,
        warnings=list(record.warnings or []),
        error=record.error,
    )
    return doc


def _respond(
    record: PlanRecord, status: int, *, include_rejected: bool, cache: str | None = None
) -> Response:
    headers = {"Location": f"/v1/plans/{record.id}"}
    if cache is not None:
        headers["Stagewright-Cache"] = cache
    if record.status in ("queued", "running"):
        headers["Retry-After"] = "1"
    return Response(
        content=json.dumps(plan_document(record, include_rejected=include_rejected)).encode(),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _failed(record: PlanRecord) -> Response:
    error = dict(record.error or {})
    error.setdefault("instance", f"/v1/plans/{record.id}")
    return problem_response(error, {"Location": f"/v1/plans/{record.id}"})


def _not_found(plan_id: str) -> ApiProblem:
    return ApiProblem(
        404,
        "plan-not-found",
        f"no plan with id {plan_id!r}; ids come from POST /v1/plans, GET /v1/plans lists them",
        title="Plan not found",
    )


def _load(session: Session, plan_id: str) -> PlanRecord:
    # Anything but 32 hex digits cannot be an id: answer without asking the database.
    record = (
        crud.get_plan(session=session, plan_id=plan_id) if _PLAN_ID.fullmatch(plan_id) else None
    )
    if record is None:
        raise _not_found(plan_id)
    return record


@dataclass(frozen=True)
class _Submission:
    """Where a POST /v1/plans stands after validation: the plan that answers it, and the
    job to wait for (None when the plan is already done)."""

    plan_id: str
    job_id: str | None
    created: bool


def _submit(state: AppState, body: PlanRequest) -> _Submission:
    """Check the request, find an identical plan or store a new one and queue its job."""
    settings, metrics = state.settings, state.metrics
    request, warnings = check_plan_request(body, settings)
    gpu = request.cluster.gpu
    if not _HARDWARE_NAME.fullmatch(gpu):
        raise UnknownHardwareError(
            f"unknown GPU {gpu!r}: hardware names are lower-case letters, digits, '.', '_' "
            "and '-'; GET /v1/hardware lists them"
        )
    with state.database.session() as session:
        hardware = require_hardware(session=session, name=gpu)
        # Fails now (422) for e.g. bf16 on a V100, instead of in the background job.
        hardware_profile(hardware, session).peak(request.training.precision)
        digest = request_hash(request, hardware.revision)
        existing = crud.find_plan_by_hash(session=session, request_hash=digest)
        if existing is not None:
            metrics.cache(hit=True)
            job = None
            if existing.status != "done":  # still searching: join it
                job = crud.job_for_plan(session=session, plan_id=existing.id)
            return _Submission(existing.id, job.id if job else None, created=False)
        metrics.cache(hit=False)
        queued = crud.count_queued(session=session)
        if queued >= settings.max_queued_jobs:
            raise ApiProblem(
                503,
                "queue-full",
                f"{queued} searches are waiting, this server's limit; retry in a minute",
                title="Planner queue full",
                headers={"Retry-After": "30"},
            )
        record, job = crud.create_plan(
            session=session,
            request=request.model_dump(mode="json"),
            request_hash=digest,
            model_name=request.model.name,
            gpu=gpu,
            num_gpus=request.cluster.num_gpus,
            method=request.search.method,
            hardware_revision=hardware.revision,
            warnings=warnings,
        )
    state.runner.submit(job.id)
    return _Submission(record.id, job.id, created=True)


def _status(state: AppState, plan_id: str) -> str:
    """Polled while a request waits: reads the status column only."""
    with state.database.session() as session:
        status = crud.plan_status(session=session, plan_id=plan_id)
    if status is None:
        raise _not_found(plan_id)
    return status


async def _await(state: AppState, submission: _Submission, wait_s: float) -> None:
    """Wait up to ``wait_s`` for the job without holding a thread or a connection: on this
    process's future, or, if another process took the job, by watching the database."""
    assert submission.job_id is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    future = state.runner.future(submission.job_id)
    if future is not None:
        try:
            # shield: a timeout must not cancel the job's future (other requests share it).
            outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_s)
        except TimeoutError:
            return
        if outcome is not None:
            return
    while loop.time() < deadline:
        if await run_in_threadpool(_status, state, submission.plan_id) not in crud.ACTIVE:
            return
        await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))


def _answer(state: AppState, submission: _Submission, include_rejected: bool) -> Response:
    with state.database.session() as session:
        record = _load(session, submission.plan_id)
        return _outcome(record, include_rejected=include_rejected, created=submission.created)


@router.post(
    "",
    status_code=201,
    response_model=PlanPublic,
    dependencies=[*WRITE, Depends(strict_body(PlanRequest))],
    summary="Plan a training run",
    responses={
        200: {"model": PlanPublic, "description": "Answered from the store (identical request)."},
        202: {"model": PlanPublic, "description": "Still searching: poll the Location."},
        **problems(400, 401, 413, 422, 503),
    },
)
async def create_plan(
    body: Annotated[PlanRequest, Body(openapi_examples=PLAN_EXAMPLES)],
    state: StateDep,
    wait_s: Annotated[
        float | None,
        Query(
            ge=0,
            le=600,
            description="Seconds to wait for the search before answering 202 (default: the "
            "server's plan_wait_s; 0 answers at once).",
        ),
    ] = None,
    include_rejected: IncludeRejected = False,
) -> Response:
    settings = state.settings
    if wait_s is not None and wait_s > settings.max_wait_s:
        raise ApiProblem(
            422,
            "limit-exceeded",
            f"wait_s {wait_s:g} is above this server's limit of {settings.max_wait_s:g} s; "
            "wait less and poll the Location",
            title="Request beyond the server's limits",
        )
    # Database work runs in the thread pool; the wait itself occupies neither a thread
    # nor a database connection, so many clients can wait at once.
    submission = await run_in_threadpool(_submit, state, body)
    if submission.job_id is not None:
        await _await(state, submission, settings.plan_wait_s if wait_s is None else wait_s)
    return await run_in_threadpool(_answer, state, submission, include_rejected)


def _outcome(record: PlanRecord, *, include_rejected: bool, created: bool) -> Response:
    cache = "miss" if created else "hit"
    if record.status == "done":
        status = 201 if created else 200
        return _respond(record, status, include_rejected=include_rejected, cache=cache)
    if record.status == "failed":
        return _failed(record)
    return _respond(record, 202, include_rejected=include_rejected, cache=cache)


@router.get(
    "/{plan_id}",
    response_model=PlanPublic,
    summary="A plan, or where its search stands",
    responses=problems(404, 422, 503),
)
def read_plan(
    plan_id: PlanId, session: SessionDep, include_rejected: IncludeRejected = False
) -> Response:
    return _respond(_load(session, plan_id), 200, include_rejected=include_rejected)


@router.get(
    "",
    response_model=PlanList,
    summary="List plans, newest first",
    responses=problems(422, 503),
)
def list_plans(
    session: SessionDep,
    status: Annotated[PlanStatus | None, Query(description="Only plans in this state.")] = None,
    gpu: Annotated[
        str | None,
        Query(pattern=HARDWARE_NAME_PATTERN, description="Only plans for this hardware."),
    ] = None,
    model: Annotated[
        str | None,
        Query(max_length=200, pattern=r"^[^\x00]*$", description="Only this model name."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Plans to skip.")] = 0,
) -> PlanList:
    rows, total = crud.list_plans(
        session=session, status=status, gpu=gpu, model_name=model, limit=limit, offset=offset
    )
    items = [
        PlanSummary.model_validate(
            {
                "id": row.id,
                "status": row.status,
                "model_name": row.model_name,
                "gpu": row.gpu,
                "num_gpus": row.num_gpus,
                "method": row.method,
                "created_at": row.created_at,
                "updated_at": row.updated_at,
                "finished_at": row.finished_at,
                "best_config": (row.summary or {}).get("best_config"),
                "best_predicted": (row.summary or {}).get("best_predicted"),
                "error": row.error,
            }
        )
        for row in rows
    ]
    return PlanList(items=items, total=total, limit=limit, offset=offset)


def _measurement(row: Measurement) -> MeasurementPublic:
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


@router.post(
    "/{plan_id}/measurements",
    status_code=201,
    response_model=MeasurementPublic,
    dependencies=[*WRITE, Depends(strict_body(MeasurementIn))],
    summary="Report what the executor measured for a candidate of this plan",
    responses=problems(400, 401, 404, 409, 413, 422, 503),
)
def create_measurement(
    plan_id: PlanId, body: MeasurementIn, session: SessionDep, response: Response
) -> MeasurementPublic:
    record = _load(session, plan_id)
    if record.status != "done":
        raise ApiProblem(
            409,
            "plan-not-done",
            f"plan {plan_id} is {record.status}; report measurements for a plan whose search "
            "is done (poll GET /v1/plans/{id} until status is 'done')",
            title="Plan not done",
        )
    candidates = (record.result or {}).get("candidates") or []
    if body.candidate >= len(candidates):
        raise ApiProblem(
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
    response.headers["Location"] = f"/v1/plans/{plan_id}/measurements"
    return _measurement(row)


@router.get(
    "/{plan_id}/measurements",
    response_model=list[MeasurementPublic],
    summary="Measurements reported for this plan",
    responses=problems(404, 503),
)
def list_measurements(plan_id: PlanId, session: SessionDep) -> list[MeasurementPublic]:
    _load(session, plan_id)
    return [_measurement(m) for m in crud.list_measurements(session=session, plan_id=plan_id)]
