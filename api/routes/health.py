"""/healthz and /metrics: what operators and their monitoring read. Both answer within
``health_timeout_s`` whatever the database does (``api.services.health``)."""

from __future__ import annotations

from importlib import metadata

from fastapi import APIRouter, Request
from starlette.responses import Response

from api import problems
from api.deps import StateDep
from api.metrics import CONTENT_TYPE
from api.routes._docs import problems_of
from api.schemas import Health

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
    responses=problems_of(503),
)
async def healthz(state: StateDep, request: Request) -> Health:
    """200 when this process's database answers within the health timeout (it asks it for
    the job counts), 503 problem+json when it does not: usable as a readiness probe. Open
    without a token; where reads need one, a caller without it is told only the status."""
    counts = await state.health.job_counts()
    if counts is None:
        raise problems.database_unavailable()
    if getattr(request.state, "probe_only", False):
        return Health(status="ok", database=None, version=None, jobs_queued=None, jobs_running=None)
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
async def metrics(state: StateDep) -> Response:
    """Always 200: a database that does not answer within the health timeout shows as
    stagewright_database_up 0."""
    jobs = await state.health.job_counts()
    text = state.metrics.render(
        jobs=jobs,
        database_up=jobs is not None,
        in_progress=state.runner.in_progress,
        deletions_heard=state.deletions.live,
    )
    return Response(content=text, media_type=CONTENT_TYPE)
