"""/healthz and /metrics: what operators and their monitoring read."""

from __future__ import annotations

from importlib import metadata

from fastapi import APIRouter
from starlette.responses import Response

from api.deps import SessionDep, StateDep
from api.metrics import CONTENT_TYPE
from api.routes._docs import problems
from api.schemas import Health
from api.store import crud

__all__ = ["router", "version"]

router = APIRouter(tags=["operations"])


def version() -> str:
    try:
        return metadata.version("stagewright")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


@router.get(
    "/healthz",
    response_model=Health,
    summary="Ready: the database answers",
    responses=problems(503),
)
def healthz(session: SessionDep, state: StateDep) -> Health:
    """200 when this process can reach its database (it asks it for the job counts),
    503 problem+json when it cannot: usable as a readiness probe."""
    counts = crud.count_jobs(session=session)
    return Health(
        status="ok",
        database=state.database.dialect,
        version=version(),
        jobs_queued=counts["queued"],
        jobs_running=counts["running"],
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics (text format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}}}},
)
def metrics(state: StateDep) -> Response:
    """Always 200: a database outage shows as stagewright_database_up 0."""
    jobs = None
    try:
        with state.database.session() as session:
            jobs = crud.count_jobs(session=session)
    except Exception:  # reported through the gauge, not as an error
        jobs = None
    text = state.metrics.render(
        jobs=jobs, database_up=jobs is not None, in_progress=state.runner.in_progress
    )
    return Response(content=text, media_type=CONTENT_TYPE)
