"""/v1/hardware: the hardware profiles plans are made for."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from sqlalchemy.orm import Session
from starlette.responses import Response

from api.deps import WRITE, SessionDep, strict_body
from api.problems import ApiProblem
from api.routes._docs import problems
from api.schemas import (
    HARDWARE_NAME_PATTERN,
    ComputeSpec,
    HardwareIn,
    HardwarePublic,
    LinkSpec,
)
from api.store.models import Hardware
from api.store.profiles import (
    WriteReport,
    get_hardware,
    hardware_profile,
    list_hardware,
    upsert_hardware,
)
from planner.profiles import ComputeUnits, HardwareProfile, Link

__all__ = ["router"]

router = APIRouter(prefix="/v1/hardware", tags=["hardware"])


def hardware_public(row: Hardware, session: Session) -> HardwarePublic:
    profile = hardware_profile(row, session)

    def link(value: Link) -> LinkSpec:
        return LinkSpec(
            kind=value.kind, bandwidth_gbps=value.bandwidth_gbps, latency_us=value.latency_us
        )

    return HardwarePublic(
        name=row.name,
        description=row.description,
        peak_flops=dict(row.peak_flops),
        memory_gib=row.memory_gib,
        usable_memory_gib=row.usable_memory_gib,
        memory_bandwidth_gbps=row.memory_bandwidth_gbps,
        intra_node=link(profile.intra_node),
        inter_node=link(profile.inter_node),
        source=row.source,
        compute=None
        if profile.compute is None
        else ComputeSpec.model_validate(profile.compute.to_dict()),
        parameters=dict(profile.parameters),
        calibration=profile.calibration,
        revision=row.revision,
        origin="api" if row.origin == "api" else "bundled",
        updated_at=row.updated_at,
    )


@router.get(
    "",
    response_model=list[HardwarePublic],
    summary="Hardware profiles",
    responses=problems(503),
)
def read_hardware_list(session: SessionDep) -> list[HardwarePublic]:
    return [hardware_public(row, session) for row in list_hardware(session=session)]


@router.get(
    "/{name}",
    response_model=HardwarePublic,
    summary="One hardware profile",
    responses=problems(404, 503),
)
def read_hardware(
    name: Annotated[str, PathParam(description="Hardware profile name.")], session: SessionDep
) -> HardwarePublic:
    row = get_hardware(session=session, name=name) if _valid_name(name) else None
    if row is None:
        raise ApiProblem(
            404,
            "hardware-not-found",
            f"no hardware profile {name!r}; GET /v1/hardware lists them, POST adds one",
            title="Hardware not found",
        )
    return hardware_public(row, session)


def _valid_name(name: str) -> bool:
    return re.fullmatch(HARDWARE_NAME_PATTERN, name) is not None


@router.post(
    "",
    status_code=201,
    response_model=HardwarePublic,
    dependencies=[*WRITE, Depends(strict_body(HardwareIn))],
    summary="Create or replace a hardware profile",
    responses={
        200: {"model": HardwarePublic, "description": "Replaced (or identical) profile."},
        **problems(400, 401, 413, 422, 503),
    },
)
def write_hardware(body: HardwareIn, session: SessionDep, response: Response) -> HardwarePublic:
    profile = HardwareProfile(
        name=body.name,
        description=body.description,
        peak_flops={str(k): v for k, v in body.peak_flops.items()},
        memory_gib=body.memory_gib,
        usable_memory_gib=body.usable_memory_gib,
        memory_bandwidth_gbps=body.memory_bandwidth_gbps,
        intra_node=Link(
            body.intra_node.kind, body.intra_node.bandwidth_gbps, body.intra_node.latency_us
        ),
        inter_node=Link(
            body.inter_node.kind, body.inter_node.bandwidth_gbps, body.inter_node.latency_us
        ),
        source=body.source,
        compute=None
        if body.compute is None
        else ComputeUnits(
            sm_count=body.compute.sm_count,
            l2_bandwidth_gbps=body.compute.l2_bandwidth_gbps,
            gemm_tiles=tuple(body.compute.gemm_tiles),
            source=body.compute.source,
        ),
        parameters=body.parameters,
    )
    report = WriteReport()
    outcome = upsert_hardware(session=session, profile=profile, origin="api", report=report)
    session.commit()
    if outcome != "created":
        response.status_code = 200
    response.headers["Location"] = f"/v1/hardware/{body.name}"
    row = get_hardware(session=session, name=body.name)
    assert row is not None
    return hardware_public(row, session)
