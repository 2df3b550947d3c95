"""/v1/schedules: the schedule registry, for clients and the dashboard."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import ScheduleFamilyPublic
from planner.schedules import families

__all__ = ["router"]

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


@router.get("", response_model=list[ScheduleFamilyPublic], summary="Registered schedules")
async def list_schedules() -> list[ScheduleFamilyPublic]:
    """Every schedule family requests may name, in listing order, with its parameters,
    what the executor needs, its training semantics and the runtimes that can run it."""
    return [ScheduleFamilyPublic.model_validate(f.describe()) for f in families()]
