"""/v1/profiles: the measured layer points and links the cost model uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from api.deps import WRITE, JsonBodyRoute, StateDep, strict_body
from api.routes._docs import problems_of
from api.schemas import HARDWARE_NAME_PATTERN, ProfilesIn, ProfilesPublic, ProfilesWriteResult
from api.services import profiles
from api.state import offload

__all__ = ["router"]

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], route_class=JsonBodyRoute)


@router.get(
    "",
    response_model=ProfilesPublic,
    summary="Layer points and links",
    responses=problems_of(401, 403, 422, 503),
)
async def read_profiles(
    state: StateDep,
    gpu: Annotated[
        str | None,
        Query(pattern=HARDWARE_NAME_PATTERN, description="Only this hardware's profiles."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Layer points per page.")] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Layer points to skip.")] = 0,
) -> ProfilesPublic:
    return await offload(state, profiles.read_profiles, state, gpu=gpu, limit=limit, offset=offset)


@router.post(
    "",
    response_model=ProfilesWriteResult,
    status_code=201,
    dependencies=[*WRITE, Depends(strict_body(ProfilesIn))],
    summary="Store layer points and links (replacing those of the same shape)",
    responses={
        200: {
            "model": ProfilesWriteResult,
            "description": "Nothing was new (all replaced or identical).",
        },
        **problems_of(400, 401, 403, 408, 413, 415, 422, 503),
    },
)
async def write_profiles(
    body: ProfilesIn, state: StateDep, response: Response
) -> ProfilesWriteResult:
    result = await offload(state, profiles.write_profiles, state, body)
    if not result.created:
        response.status_code = 200
    return result
