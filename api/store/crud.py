"""Plans, jobs and measurements: keyword-only functions over a Session.

Functions that write commit their own transaction (each is one unit of work). Job state
changes are conditional updates (``WHERE status = ... AND claim = ...``), so two processes
can never both run or both finish the same job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, defer

from api.store.models import Job, Measurement, PlanRecord, utcnow

__all__ = [
    "ACTIVE",
    "Admission",
    "Claimed",
    "QueueFull",
    "admit_plan",
    "claim_job",
    "count_jobs",
    "count_queued",
    "create_measurement",
    "delete_plan",
    "finish_job",
    "get_plan",
    "plan_status",
    "heartbeat",
    "job_for_plan",
    "list_measurements",
    "list_plans",
    "queued_job_ids",
    "release_jobs",
    "requeue_orphans",
    "rowcount",
    "running_workers",
]

ACTIVE = ("queued", "running")
# Any constant: the same in every process that creates plans (PostgreSQL advisory lock).
_ADMISSION_LOCK_KEY = 0x5747_5250


def new_id() -> str:
    return uuid.uuid4().hex


class QueueFull(Exception):
    """The queue holds ``queued`` searches, the server's limit: nothing was stored."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"{queued} search{'' if queued == 1 else 'es'} waiting")
        self.queued = queued


@dataclass(frozen=True)
class Admission:
    """Where a plan request stands after :func:`admit_plan`: the plan answering it, its
    status, the job to wait for (None when the plan is done), and whether this call
    created it."""

    plan_id: str
    status: str
    job_id: str | None
    created: bool


def _answering(session: Session, request_hash: str) -> Admission | None:
    found = session.execute(
        select(PlanRecord.id, PlanRecord.status).where(PlanRecord.dedup_key == request_hash)
    ).first()
    if found is None:
        return None
    plan_id, status = found
    job_id = None
    if status in ACTIVE:
        job_id = session.scalar(select(Job.id).where(Job.plan_id == plan_id).limit(1))
    return Admission(plan_id, str(status), job_id, created=False)


def admit_plan(
    *,
    session: Session,
    request: dict[str, Any],
    request_hash: str,
    model_name: str,
    gpu: str,
    num_gpus: int,
    method: str,
    hardware_revision: int,
    warnings: Sequence[str],
    created_by: str | None,
    max_queued: int,
) -> Admission:
    """The plan answering ``request_hash``, created with its queued job if there is none
    (committed). Identical requests arriving together share one plan: the dedup key is
    unique, and creations are serialized (a PostgreSQL advisory lock; a SQLite write
    session already holds the write lock), so the queue limit is exact too. Raises
    QueueFull, storing nothing, when ``max_queued`` searches already wait."""
    found = _answering(session, request_hash)
    if found is not None:
        return found
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_ADMISSION_LOCK_KEY)))
        found = _answering(session, request_hash)  # created while we waited for the lock
        if found is not None:
            return found
    queued = count_queued(session=session)
    if queued >= max_queued:
        raise QueueFull(queued)
    now = utcnow()
    plan = PlanRecord(
        id=new_id(),
        request_hash=request_hash,
        dedup_key=request_hash,
        created_by=created_by,
        request=request,
        status="queued",
        result=None,
        summary=None,
        error=None,
        warnings=list(warnings),
        # A label for listing; the request keeps the name exactly. PostgreSQL text cannot
        # hold NUL characters.
        model_name=model_name.replace("\x00", "")[:200],
        gpu=gpu,
        num_gpus=num_gpus,
        method=method,
        hardware_revision=hardware_revision,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )
    job = Job(
        id=new_id(), plan_id=plan.id, kind="plan", status="queued", attempts=0, created_at=now
    )
    session.add(plan)
    session.flush()
    session.add(job)
    session.commit()
    return Admission(plan.id, "queued", job.id, created=True)


def delete_plan(*, session: Session, plan_id: str) -> bool:
    """Delete a plan with its job and measurements (committed); False if there was none.
    A search still running for it finds its claim gone and drops its result."""
    session.execute(delete(Job).where(Job.plan_id == plan_id))
    session.execute(delete(Measurement).where(Measurement.plan_id == plan_id))
    done = session.execute(delete(PlanRecord).where(PlanRecord.id == plan_id))
    session.commit()
    return rowcount(done) == 1


def get_plan(*, session: Session, plan_id: str) -> PlanRecord | None:
    return session.get(PlanRecord, plan_id)


def plan_status(*, session: Session, plan_id: str) -> str | None:
    """The status of a plan alone, without loading its (possibly megabytes of) result."""
    status = session.scalar(select(PlanRecord.status).where(PlanRecord.id == plan_id))
    return None if status is None else str(status)


def list_plans(
    *,
    session: Session,
    status: str | None = None,
    gpu: str | None = None,
    model_name: str | None = None,
    limit: int = 20,
    offset: int = 0,
) -> tuple[list[PlanRecord], int]:
    """A page of plans, newest first, and how many match in all."""
    filters = []
    if status is not None:
        filters.append(PlanRecord.status == status)
    if gpu is not None:
        filters.append(PlanRecord.gpu == gpu)
    if model_name is not None:
        filters.append(PlanRecord.model_name == model_name)
    total = session.scalar(select(func.count()).select_from(PlanRecord).where(*filters)) or 0
    # Only the columns a listing shows: never the (possibly megabytes of) result JSON.
    rows = session.scalars(
        select(PlanRecord)
        .where(*filters)
        .order_by(PlanRecord.created_at.desc(), PlanRecord.id)
        .limit(limit)
        .offset(offset)
        .options(_listing_columns())
    )
    return list(rows), int(total)


def _listing_columns() -> Any:
    return defer(PlanRecord.result)


def job_for_plan(*, session: Session, plan_id: str) -> Job | None:
    return session.scalar(select(Job).where(Job.plan_id == plan_id).limit(1))


def count_queued(*, session: Session) -> int:
    """Jobs waiting for a worker (counts one status, not the whole table)."""
    return int(session.scalar(select(func.count()).where(Job.status == "queued")) or 0)


def count_jobs(*, session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
    for status, n in rows:
        counts[str(status)] = int(n)
    return counts


def _set_plan_status(session: Session, plan_id: str, status: str, now: datetime) -> None:
    session.execute(
        update(PlanRecord)
        .where(PlanRecord.id == plan_id)
        .values(status=status, updated_at=now)
        .execution_options(synchronize_session=False)
    )


@dataclass(frozen=True)
class Claimed:
    """A job this process now runs: its plan's request and the profiles to price it with
    (the snapshot of ``gpu`` at ``revision``)."""

    job_id: str
    plan_id: str
    claim: str
    request: dict[str, Any]
    gpu: str
    revision: int


def claim_job(*, session: Session, job_id: str, worker: str) -> Claimed | None:
    """Mark a queued job as running under a new claim token, if it is still queued (another
    process may have taken it). Returns what the worker needs, or None."""
    now = utcnow()
    claim = new_id()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued")
        .values(
            status="running",
            claim=claim,
            worker=worker,
            attempts=Job.attempts + 1,
            started_at=now,
            heartbeat_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    if rowcount(result) != 1:
        session.rollback()
        return None
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    plan = session.get(PlanRecord, job.plan_id)
    assert plan is not None
    _set_plan_status(session, plan.id, "running", now)
    session.commit()
    return Claimed(
        job_id=job_id,
        plan_id=plan.id,
        claim=claim,
        request=dict(plan.request),
        gpu=plan.gpu,
        revision=plan.hardware_revision,
    )


def finish_job(
    *,
    session: Session,
    claimed: Claimed,
    result: dict[str, Any] | None,
    summary: dict[str, Any] | None,
    error: dict[str, Any] | None,
) -> bool:
    """Store the outcome if the claim is still ours (False: the job was taken back because
    this process missed its lease; its result is dropped, the new run will store one)."""
    now = utcnow()
    status = "done" if error is None else "failed"
    done = session.execute(
        update(Job)
        .where(Job.id == claimed.job_id, Job.claim == claimed.claim, Job.status == "running")
        .values(
            status=status,
            finished_at=now,
            claim=None,
            error=None if error is None else str(error.get("detail", "")),
        )
        .execution_options(synchronize_session=False)
    )
    if rowcount(done) != 1:
        session.rollback()
        return False
    session.execute(
        update(PlanRecord)
        .where(PlanRecord.id == claimed.plan_id)
        .values(
            status=status,
            result=result,
            summary=summary,
            error=error,
            updated_at=now,
            finished_at=now,
            # A failed plan answers nothing: the same request searches again.
            **({"dedup_key": None} if error is not None else {}),
        )
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return True


def heartbeat(*, session: Session, claims: Sequence[str]) -> None:
    """Renew the lease of the jobs this process runs."""
    if not claims:
        return
    session.execute(
        update(Job)
        .where(Job.claim.in_(list(claims)), Job.status == "running")
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()


def release_jobs(*, session: Session, claims: Sequence[str]) -> int:
    """Put this process's running jobs back in the queue (a clean shutdown); the attempt
    does not count against the job."""
    released = 0
    for claim in claims:
        job = session.scalar(
            select(Job)
            .where(Job.claim == claim, Job.status == "running")
            .execution_options(populate_existing=True)
        )
        if job is None:
            continue
        _requeue(session, job, count_attempt=False)
        released += 1
    session.commit()
    return released


def _requeue(session: Session, job: Job, *, count_attempt: bool) -> None:
    now = utcnow()
    job.status = "queued"
    job.claim = None
    job.worker = None
    job.heartbeat_at = None
    if not count_attempt:
        job.attempts = max(0, job.attempts - 1)
    _set_plan_status(session, job.plan_id, "queued", now)


def requeue_orphans(
    *,
    session: Session,
    lease_s: float,
    max_attempts: int,
    interrupted: Callable[[str, int], dict[str, Any]],
    dead_workers: Sequence[str] = (),
) -> tuple[int, int]:
    """Jobs left 'running' by a process that died (lease expired, or a worker known to be
    dead on this host) go back to the queue, or fail after ``max_attempts`` runs with the
    problem ``interrupted(plan_id, attempts)``: bounded attempts, so a request that kills
    its server cannot do so forever. Returns (requeued, failed)."""
    now = utcnow()
    expired = now - timedelta(seconds=lease_s)
    fresh = {"populate_existing": True}  # rows other sessions changed: read them anew
    stale = select(Job).where(Job.status == "running", Job.heartbeat_at < expired)
    jobs = list(session.scalars(stale.execution_options(**fresh)))
    if dead_workers:
        jobs += list(
            session.scalars(
                select(Job)
                .where(
                    Job.status == "running",
                    Job.worker.in_(list(dead_workers)),
                    Job.heartbeat_at >= expired,
                )
                .execution_options(**fresh)
            )
        )
    requeued, failed = _take_back(session, jobs, max_attempts, interrupted)
    session.commit()
    return requeued, failed


def requeue_interrupted(
    *,
    session: Session,
    claim: str,
    max_attempts: int,
    interrupted: Callable[[str, int], dict[str, Any]],
) -> tuple[int, int]:
    """The job this process runs under ``claim`` was interrupted from outside (its search
    process stopped by a signal): back to the queue, or failed after ``max_attempts`` runs,
    as an orphan is. Returns (requeued, failed)."""
    jobs = list(
        session.scalars(
            select(Job)
            .where(Job.claim == claim, Job.status == "running")
            .execution_options(populate_existing=True)
        )
    )
    requeued, failed = _take_back(session, jobs, max_attempts, interrupted)
    session.commit()
    return requeued, failed


def _take_back(
    session: Session,
    jobs: Sequence[Job],
    max_attempts: int,
    interrupted: Callable[[str, int], dict[str, Any]],
) -> tuple[int, int]:
    now = utcnow()
    requeued = failed = 0
    for job in jobs:
        if job.attempts >= max_attempts:
            error = interrupted(job.plan_id, job.attempts)
            job.status = "failed"
            job.claim = None
            job.finished_at = now
            job.error = str(error.get("detail", ""))
            session.execute(
                update(PlanRecord)
                .where(PlanRecord.id == job.plan_id)
                .values(
                    status="failed",
                    updated_at=now,
                    finished_at=now,
                    error=error,
                    dedup_key=None,
                )
                .execution_options(synchronize_session=False)
            )
            failed += 1
        else:
            _requeue(session, job, count_attempt=True)
            requeued += 1
    return requeued, failed


def running_workers(*, session: Session) -> list[str]:
    return [
        w
        for w in session.scalars(select(Job.worker).where(Job.status == "running").distinct())
        if w
    ]


def queued_job_ids(*, session: Session, limit: int, exclude: Sequence[str] = ()) -> list[str]:
    """The oldest queued jobs not already in this process's queue."""
    stmt = select(Job.id).where(Job.status == "queued").order_by(Job.created_at, Job.id)
    if exclude:
        stmt = stmt.where(Job.id.not_in(list(exclude)))
    return list(session.scalars(stmt.limit(limit)))


def create_measurement(
    *,
    session: Session,
    plan_id: str,
    candidate: int,
    step_time_s: float,
    peak_activation_bytes: Sequence[int],
    predicted_iteration_time_s: float | None,
    data: dict[str, Any],
) -> Measurement:
    row = Measurement(
        plan_id=plan_id,
        candidate=candidate,
        step_time_s=step_time_s,
        peak_activation_bytes=list(peak_activation_bytes),
        predicted_iteration_time_s=predicted_iteration_time_s,
        data=data,
        created_at=utcnow(),
    )
    session.add(row)
    session.commit()
    return row


def list_measurements(*, session: Session, plan_id: str) -> list[Measurement]:
    return list(
        session.scalars(
            select(Measurement).where(Measurement.plan_id == plan_id).order_by(Measurement.id)
        )
    )


def rowcount(result: Any) -> int:
    """The rows an UPDATE or DELETE changed (``Session.execute`` is typed as returning a
    plain Result, which has no ``rowcount``)."""
    return int(getattr(result, "rowcount", 0) or 0)
