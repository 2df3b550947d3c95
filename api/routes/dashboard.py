"""The dashboard: the page at / (served with its assets by this app, no CDN), what it reads
beyond the plan itself (a rejected configuration's memory; its Gantt chart reads GET
/v1/plans/{id}/timeline in ``api.routes.plans``), and the API documentation pages /docs
(Swagger UI) and /redoc (ReDoc), whose scripts come from a pinned package
(``fastapi-offline``) rather than a CDN, so they work without a network."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, Response

from api.deps import StateDep
from api.routes._docs import problems_of
from api.services import timelines
from api.state import offload

__all__ = ["DOCS_ASSETS", "STATIC", "router"]

STATIC = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


def _docs_assets() -> Path:
    import fastapi_offline  # the pinned package that ships Swagger UI's and ReDoc's files

    return Path(fastapi_offline.__file__).resolve().parent / "static"


DOCS_ASSETS = _docs_assets()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/docs", include_in_schema=False)
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="stagewright API",
        swagger_js_url="/docs-assets/swagger-ui-bundle.js",
        swagger_css_url="/docs-assets/swagger-ui.css",
        swagger_favicon_url="/docs-assets/favicon.png",
    )


@router.get("/redoc", include_in_schema=False)
async def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="stagewright API (ReDoc)",
        redoc_js_url="/docs-assets/redoc.standalone.js",
        redoc_favicon_url="/docs-assets/favicon.png",
        with_google_fonts=False,
    )


@router.get(
    "/v1/plans/{plan_id}/rejected/{index}",
    tags=["plans"],
    response_class=Response,
    summary="A rejected configuration with each pipeline device's memory",
    responses={
        200: {"content": {"application/json": {"schema": {"type": "object"}}}},
        **problems_of(401, 403, 404, 409, 410, 422, 503),
    },
)
async def rejected_configuration(
    plan_id: Annotated[str, PathParam(description="The plan's id (from POST /v1/plans).")],
    index: Annotated[
        int,
        PathParam(
            ge=0, le=10_000_000, description="Place in the plan's rejected list (0 = first)."
        ),
    ],
    state: StateDep,
) -> Response:
    """The rejected entry (config, reason, predicted) with ``memory``: per pipeline device,
    parameters, gradients, optimizer states, activations, allowance and total GiB as the
    plan counted them, priced with the profiles the plan was priced with. 409 when the
    configuration broke a constraint before it was priced (it has no memory figure)."""
    body = await offload(state, timelines.rejected_memory_json, state, plan_id, index)
    return Response(content=body, media_type="application/json")
