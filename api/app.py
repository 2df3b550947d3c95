"""The REST service: ``create_app(settings)`` builds the FastAPI application.

The application owns one database engine, one job runner (planner threads plus a poller)
and its metrics. It does not migrate: ``stagewright serve`` migrates and loads the bundled
profiles before it starts the server processes. If the database is unreachable the
application still starts; requests that need it answer 503 until it is back.

Middleware, outermost first: metrics (sees every answer), write authentication (before any
body is read), body size limit, then FastAPI's routing and the problem+json handlers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles

from api.core.config import Settings
from api.core.db import Database
from api.deps import AppState
from api.jobs import JobRunner, Planner
from api.limits import BodyLimitMiddleware
from api.metrics import Metrics, MetricsMiddleware
from api.problems import install_problem_handlers
from api.routes import (
    dashboard,
    hardware,
    health,
    measurements,
    plans,
    profiles,
    schedules,
    simulate,
)
from api.routes.health import version
from api.schemas import Problem
from api.security import WriteAuthMiddleware
from planner.search import plan

__all__ = ["create_app"]

log = logging.getLogger("stagewright.api")

_DESCRIPTION = """\
Plans pipeline-parallel training of large language models: POST a PlanRequest to
/v1/plans and get the ranked, launchable configurations; simulate any schedule at
/v1/simulate; manage the hardware and layer profiles the cost model uses.

Errors are RFC 9457 problem details (application/problem+json) whose `detail` says what to
change. When the server sets STAGEWRIGHT_API_TOKEN, every POST needs
`Authorization: Bearer <token>`; reads are open.
"""


def create_app(settings: Settings | None = None, *, planner: Planner | None = None) -> FastAPI:
    """The application for ``settings`` (default: from the ``STAGEWRIGHT_*`` environment,
    which is how ``uvicorn --factory api.app:create_app`` and worker processes call it).
    ``planner`` replaces ``planner.search.plan`` in the background jobs (tests, embedding)."""
    settings = settings or Settings.from_env()
    database = Database(settings.database_url)
    metrics = Metrics()
    runner = JobRunner(
        database=database, settings=settings, metrics=metrics, planner=planner or plan
    )
    state = AppState(settings=settings, database=database, metrics=metrics, runner=runner)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runner.start()
        log.info("stagewright %s on %s", version(), database)
        try:
            yield
        finally:
            runner.stop()
            database.dispose()

    app = FastAPI(
        title="stagewright",
        version=version(),
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.stagewright = state
    install_problem_handlers(app)
    for module in (plans, simulate, schedules, hardware, profiles, measurements, health, dashboard):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC), name="static")

    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(WriteAuthMiddleware, token=settings.api_token)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the Problem model the error responses refer to."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in problem.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["Problem"] = problem
    app.openapi_schema = schema
    return schema
