"""Plans: submit a request, wait for its search, read, list and delete plans.

A request is checked against the server's limits (structure first, then the up-front cost
of its search: ``api.limits``), then admitted in one write transaction: the profiles of
the hardware's current revision are recorded (the search and every later re-pricing use
them), and the plan is found by its dedup key (request hash + profile revision + planner)
or created with its queued job. Identical requests share one plan; the queue cap is exact.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session

from api import problems
from api.hashing import request_hash
from api.limits import check_plan_request
from api.schemas import HARDWARE_NAME_PATTERN, HARDWARE_NAME_RULE, PlanList, PlanSummary
from api.security import Principal
from api.services import read_retried
from api.store import crud
from api.store.models import PlanRecord
from api.store.snapshots import snapshot_current
from planner.assemble import no_fit_summary
from planner.profiles import UnknownHardwareError
from planner.specs import STORED, Plan, PlanRequest, Rejected

if TYPE_CHECKING:
    from api.state import AppState

__all__ = [
    "PlanAnswer",
    "answer_admission",
    "delete_plan",
    "list_plans",
    "load_done_plan",
    "load_plan",
    "plan_document",
    "ranked_candidate",
    "read_plan",
    "submit_plan",
    "wait_for_plan",
]

_PLAN_ID = re.compile(r"[0-9a-f]{32}")
_HARDWARE_NAME = re.compile(HARDWARE_NAME_PATTERN)


@dataclass(frozen=True)
class PlanAnswer:
    """What answers a plan request: the status, the JSON body and the headers."""

    status: int
    body: bytes
    headers: dict[str, str]
    problem: bool = False


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def plan_document(record: PlanRecord, *, include_rejected: bool) -> dict[str, Any]:
    """The PlanPublic JSON of a record: the stored Plan's fields (their defaults, or empty,
    until done; a field added to Plan after a plan was stored gets its default) and the job's
    status around them. Plans stored before candidates were compact (with every action of
    their schedules) are served as they were stored. A done plan without candidates says
    why in ``warnings``, with what may make the request fit."""
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
        created_by=record.created_by,
        warnings=list(record.warnings or []),
        error=record.error,
    )
    if record.status == "done" and doc["best"] is None:
        doc["warnings"].append(_no_fit_warning(doc["request"], result.get("rejected") or []))
    return doc


def _no_fit_warning(request: dict[str, Any], rejected: list[dict[str, Any]]) -> str:
    """Why a done plan has no candidate, and what may help (the CLI's text, from the same
    function), from the stored request and rejections."""
    summary = no_fit_summary(
        PlanRequest.model_validate(request, context={STORED: True}),
        [Rejected.model_validate(r) for r in rejected],
    )
    more = " ?include_rejected=true lists why each was rejected." if rejected else ""
    return summary + more


def load_plan(session: Session, plan_id: str) -> PlanRecord:
    """The plan ``plan_id``, or a 404 problem (anything but 32 hex digits is not an id and
    is answered without asking the database)."""
    record = (
        crud.get_plan(session=session, plan_id=plan_id) if _PLAN_ID.fullmatch(plan_id) else None
    )
    if record is None:
        raise problems.plan_not_found(plan_id)
    return record


def load_done_plan(session: Session, plan_id: str, what: str) -> PlanRecord:
    """The plan ``plan_id`` if its search is done, else a 409 saying to ``what`` later."""
    record = load_plan(session, plan_id)
    if record.status != "done":
        raise problems.plan_not_done(plan_id, record.status, what)
    return record


def ranked_candidate(record: PlanRecord, index: int) -> dict[str, Any]:
    """Candidate ``index`` (0 = best) of a done plan's JSON, or a 404 naming the range."""
    candidates = (record.result or {}).get("candidates") or []
    if index >= len(candidates):
        raise problems.not_found(
            "candidate-not-found",
            "Candidate not found",
            f"plan {record.id} has {len(candidates)} ranked candidates; ask for "
            f"0..{max(0, len(candidates) - 1)}",
        )
    found: dict[str, Any] = candidates[index]
    return found


def submit_plan(state: AppState, body: PlanRequest, principal: Principal) -> crud.Admission:
    """Check the request against the limits, record the profiles it is priced with, and
    find or create its plan (with a queued job, handed to this process's runner)."""
    settings = state.settings
    request, warnings = check_plan_request(body, settings)
    gpu = request.cluster.gpu
    if not _HARDWARE_NAME.fullmatch(gpu):
        raise UnknownHardwareError(f"unknown GPU {gpu!r}: {HARDWARE_NAME_RULE}")
    with state.database.session(write=True) as session:
        snapshot = snapshot_current(session=session, gpu=gpu)
        # Fails now (422) for e.g. bf16 on a V100, instead of in the background job.
        snapshot.profile().peak(request.training.precision)
        try:
            admission = crud.admit_plan(
                session=session,
                request=request.model_dump(mode="json"),
                request_hash=request_hash(request, snapshot.revision),
                model_name=request.model.name,
                gpu=gpu,
                num_gpus=request.cluster.num_gpus,
                method=request.search.method,
                hardware_revision=snapshot.revision,
                warnings=warnings,
                created_by=principal.name,
                max_queued=settings.max_queued_jobs,
            )
        except crud.QueueFull as exc:
            raise problems.queue_full(exc.queued) from None
        session.commit()  # the snapshot, when this request recorded it and joined a plan
    state.metrics.cache(hit=not admission.created)
    if admission.created and admission.job_id is not None:
        state.runner.submit(admission.job_id)
    return admission


def _status(state: AppState, plan_id: str) -> str:
    """Polled while a request waits: reads the status column only."""
    with state.database.session() as session:
        status = crud.plan_status(session=session, plan_id=plan_id)
    if status is None:
        raise problems.plan_not_found(plan_id)
    return status


async def wait_for_plan(state: AppState, admission: crud.Admission, wait_s: float) -> None:
    """Wait up to ``wait_s`` for the plan's job without holding a thread or a connection:
    on this process's future, or, if another process runs the job, by polling the
    status column (on a thread, briefly, every 0.1 s)."""
    from api.state import offload  # the state module imports the services

    if admission.job_id is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    future = state.runner.future(admission.job_id)
    if future is not None:
        try:
            # shield: a timeout must not cancel the job's future (other requests share it).
            outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_s)
        except TimeoutError:
            return
        if outcome is not None:
            return
    while loop.time() < deadline:
        if await offload(state, _status, state, admission.plan_id) not in crud.ACTIVE:
            return
        await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))


def _answer(
    state: AppState,
    record: PlanRecord,
    status: int,
    *,
    since: int,
    include_rejected: bool,
    cache: str | None,
    failure_as_problem: bool,
) -> PlanAnswer:
    headers = {"Location": f"/v1/plans/{record.id}"}
    if cache is not None:
        headers["Stagewright-Cache"] = cache
    if record.status in crud.ACTIVE:
        headers["Retry-After"] = "1"
    if record.status == "failed" and failure_as_problem:
        error = dict(record.error or {})
        error.setdefault("instance", f"/v1/plans/{record.id}")
        return PlanAnswer(int(error["status"]), json.dumps(error).encode(), headers, problem=True)
    body = json.dumps(plan_document(record, include_rejected=include_rejected)).encode()
    if record.status == "done":  # final: the same bytes answer every later read
        state.plans.put(record.id, include_rejected, body, since=since)
    return PlanAnswer(status, body, headers)


def _cached(
    state: AppState, plan_id: str, status: int, *, include_rejected: bool, cache: str | None
) -> PlanAnswer | None:
    """The answer from this process's cache of done plans, if the plan is there and still
    stored (it may have been deleted by another process: :mod:`api.services.plan_deletions`)."""
    body = state.cached(state.plans, plan_id, include_rejected)
    if body is None:
        return None
    headers = {"Location": f"/v1/plans/{plan_id}"}
    if cache is not None:
        headers["Stagewright-Cache"] = cache
    return PlanAnswer(status, body, headers)


def answer_admission(
    state: AppState, admission: crud.Admission, *, include_rejected: bool
) -> PlanAnswer:
    """201 with a plan this request searched for, 200 with one answered from the store,
    202 while the search goes on, the stored problem when it failed."""
    cache = "miss" if admission.created else "hit"
    if admission.status == "done":
        found = _cached(
            state, admission.plan_id, 200, include_rejected=include_rejected, cache=cache
        )
        if found is not None:
            return found
    since = state.plans.generation
    with state.database.session() as session:
        record = load_plan(session, admission.plan_id)
    status = (201 if admission.created else 200) if record.status == "done" else 202
    return _answer(
        state,
        record,
        status,
        since=since,
        include_rejected=include_rejected,
        cache=cache,
        failure_as_problem=True,
    )


@read_retried
def read_plan(state: AppState, plan_id: str, *, include_rejected: bool) -> PlanAnswer:
    found = _cached(state, plan_id, 200, include_rejected=include_rejected, cache=None)
    if found is not None:
        return found
    since = state.plans.generation
    with state.database.session() as session:
        record = load_plan(session, plan_id)
    return _answer(
        state,
        record,
        200,
        since=since,
        include_rejected=include_rejected,
        cache=None,
        failure_as_problem=False,
    )


@read_retried
def list_plans(
    state: AppState,
    *,
    status: str | None,
    gpu: str | None,
    model: str | None,
    limit: int,
    offset: int,
) -> PlanList:
    with state.database.session() as session:
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
                "created_by": row.created_by,
                "best_config": (row.summary or {}).get("best_config"),
                "best_predicted": (row.summary or {}).get("best_predicted"),
                "error": row.error,
            }
        )
        for row in rows
    ]
    return PlanList(items=items, total=total, limit=limit, offset=offset)


def delete_plan(state: AppState, plan_id: str, principal: Principal) -> None:
    """Delete a plan: its creator (the same token) or an admin may."""
    with state.database.session(write=True) as session:
        record = load_plan(session, plan_id)
        owner = record.created_by
        if not principal.can("admin") and (principal.name is None or principal.name != owner):
            raise problems.forbidden(
                f"plan {plan_id} was created by "
                + (f"the token {owner!r}" if owner else "an anonymous client")
                + "; only that token or one with the admin scope may delete it"
            )
        crud.delete_plan(session=session, plan_id=plan_id)
    state.forget_plan(plan_id)
