"""The REST service: ``create_app(settings)`` builds the FastAPI application.

The application owns one database engine (with statement and connection timeouts), one job
runner (planner threads, each with a search process, plus a poller), a health probe, caches
of done plans' answers (kept true by a feed of plan deletions on PostgreSQL) and its
metrics. It does not migrate: ``stagewright serve`` migrates and loads the bundled profiles
before it starts the server processes. If the database is unreachable the application
still starts; requests that need it answer 503 until it is back.

Layers: routes (``api/routes``) parse and answer; use cases (``api/services``) do the
work on threads (``api.state.offload``); the store (``api/store``) is SQL. Errors become
problem+json in one place (``api.problems``).

Middleware, outermost first: metrics (sees every answer), authentication and scopes
(before any body is read), body size and arrival-time limits, HEAD answered as GET without
the body, then FastAPI's routing and the problem+json handlers.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from api.core.config import Settings
from api.core.db import POOL_MARGIN, Database
from api.head_requests import HeadAsGetMiddleware
from api.jobs.runner import JobRunner
from api.jobs.search import InlineSearch, Planner, ProcessSearch, Searcher
from api.limits import BodyLimitMiddleware
from api.metrics import Metrics, MetricsMiddleware
from api.openapi import openapi_document
from api.problems import install_problem_handlers
from api.query_parameters import no_unknown_query_parameters
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
from api.security import AuthMiddleware, parse_tokens
from api.services.health import HealthProbe
from api.state import AppState

__all__ = ["SEARCH_FUNCTION", "connections_per_process", "create_app", "served_app"]

log = logging.getLogger("stagewright.api")

SEARCH_FUNCTION = "planner.plan:plan"

_DESCRIPTION = """\
Plans pipeline-parallel training of large language models: POST a PlanRequest to
/v1/plans and get the ranked, launchable configurations; simulate any schedule at
/v1/simulate; manage the hardware and layer profiles the cost model uses.

Errors are RFC 9457 problem details (application/problem+json) whose `detail` says what to
change. Writes need a bearer token with the `write` scope when the operator configured
tokens; reads need one with `read` only when some token lists that scope.
"""


def _database_threads(settings: Settings) -> int:
    """Threads of one server process that may hold a database connection at once: the
    request threads, the planner threads, the job poller and the health probe."""
    return settings.request_threads + settings.planner_threads + 2


def connections_per_process(settings: Settings) -> int:
    """The most PostgreSQL connections one server process opens: its pool (one per thread
    that may use the database, and the pool's margin) and the deletion feed's own."""
    return _database_threads(settings) + POOL_MARGIN + 1


def served_app() -> FastAPI:
    """The application of a ``stagewright serve`` process (uvicorn's factory): settings from
    the environment, the heap frozen once started."""
    return create_app(freeze_heap=True)


def create_app(
    settings: Settings | None = None,
    *,
    planner: Planner | None = None,
    search_function: str = SEARCH_FUNCTION,
    freeze_heap: bool = False,
) -> FastAPI:
    """The application for ``settings`` (default: from the ``STAGEWRIGHT_*`` environment,
    which is how ``uvicorn --factory api.app:create_app`` and worker processes call it).
    ``freeze_heap``: once started, move everything loaded so far out of the garbage
    collector's sight (:func:`served_app`, for a process that only serves).

    Searches run in search processes calling ``search_function`` (``module:name``); a
    ``planner`` callable runs them on the planner threads instead, without the processes'
    limits (tests, embedding)."""
    settings = settings or Settings.from_env()
    tokens = parse_tokens(settings.api_tokens, settings.api_token)
    database = Database(
        settings.database_url,
        statement_timeout_s=settings.db_statement_timeout_s,
        operation_timeout_s=settings.db_operation_timeout_s,
        connections=_database_threads(settings),
    )
    metrics = Metrics()
    searcher: Searcher = (
        InlineSearch(planner)
        if planner is not None
        else ProcessSearch(
            function=search_function,
            memory_mb=settings.job_memory_mb,
            timeout_s=settings.job_timeout_s,
            at_start=settings.search_processes_at_start,
        )
    )
    runner = JobRunner(database=database, settings=settings, metrics=metrics, searcher=searcher)
    health_probe = HealthProbe(database, settings.health_timeout_s)
    state = AppState(
        settings=settings, database=database, metrics=metrics, runner=runner, health=health_probe
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runner.start()
        state.deletions.start()
        log.info("stagewright %s on %s", version(), database)
        if freeze_heap:
            # Everything loaded so far (modules, schemas, the app) lives as long as the
            # process: out of the collector's sight, a full collection no longer walks it.
            # Those took 80-120 ms each in a serving process under load, blocking its event
            # loop.
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            runner.stop()
            state.deletions.close()
            health_probe.close()
            database.dispose()

    app = FastAPI(
        title="stagewright",
        version=version(),
        description=_DESCRIPTION,
        lifespan=lifespan,
        # /docs and /redoc are the dashboard router's, with assets from a pinned package.
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(no_unknown_query_parameters)],
        # A trailing slash is a 404 naming the path without it (api.problems), not a 307:
        # curl shows an empty body for a redirect, and behind a TLS proxy its Location
        # would name the proxy's inner http:// address.
        redirect_slashes=False,
    )
    app.state.stagewright = state
    install_problem_handlers(app)
    for module in (plans, simulate, schedules, hardware, profiles, measurements, health, dashboard):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC), name="static")
    app.mount("/docs-assets", StaticFiles(directory=dashboard.DOCS_ASSETS), name="docs-assets")

    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    app.add_middleware(AuthMiddleware, tokens=tokens)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    def openapi() -> dict[str, Any]:
        return openapi_document(app, settings)

    app.openapi = openapi  # type: ignore[method-assign]
    return app
