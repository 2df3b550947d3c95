"""/v1/hardware: the hardware profiles plans are made for."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from starlette.responses import Response

from api.deps import WRITE, JsonBodyRoute, StateDep, strict_body
from api.routes._docs import problems_of
from api.schemas import HardwareIn, HardwarePublic
from api.services import hardware
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/hardware", tags=["hardware"], route_class=JsonBodyRoute)


@router.get(
    "",
    response_model=list[HardwarePublic],
    summary="Hardware profiles",
    responses=problems_of(401, 403, 503),
)
async def read_hardware_list(state: StateDep) -> list[HardwarePublic]:
    return await offload(state, hardware.hardware_list, state)


@router.get(
    "/{name}",
    response_model=HardwarePublic,
    summary="One hardware profile",
    responses=problems_of(401, 403, 404, 503),
)
async def read_hardware(
    name: Annotated[str, PathParam(description="Hardware profile name.")], state: StateDep
) -> HardwarePublic:
    return await offload(state, hardware.read_hardware, state, name)


@router.post(
    "",
    status_code=201,
    response_model=HardwarePublic,
    dependencies=[*WRITE, Depends(strict_body(HardwareIn))],
    summary="Create or replace a hardware profile",
    responses={
        200: {"model": HardwarePublic, "description": "Replaced (or identical) profile."},
        **problems_of(400, 401, 403, 408, 413, 415, 422, 503),
    },
)
async def write_hardware(body: HardwareIn, state: StateDep, response: Response) -> HardwarePublic:
    """Creates the profile (201) or replaces it (200). Every change raises its ``revision``
    by one, atomically: concurrent writers each get the revision their write produced."""
    public, created = await offload(state, hardware.write_hardware, state, body)
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/hardware/{body.name}"
    return public
