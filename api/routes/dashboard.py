"""The dashboard: the page at / (served with its assets by this app, no CDN). Its Gantt
chart reads GET /v1/plans/{id}/timeline (``api.routes.plans``)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse

__all__ = ["STATIC", "router"]

STATIC = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")
