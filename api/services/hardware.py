"""Hardware profiles: list, read, create or replace (atomically, revision raised in SQL)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from api import problems
from api.schemas import (
    HARDWARE_NAME_PATTERN,
    HardwareIn,
    HardwarePublic,
    LinkSpec,
)
from api.services import read_retried
from api.store.models import Hardware
from api.store.profiles import (
    WriteReport,
    get_hardware,
    hardware_profile,
    list_hardware,
    upsert_hardware,
)
from planner.hardware_spec import ComputeSpec
from planner.profiles import ComputeUnits, HardwareProfile, Link

if TYPE_CHECKING:
    from api.state import AppState

__all__ = ["hardware_list", "read_hardware", "write_hardware"]


def _public(row: Hardware, session: Session) -> HardwarePublic:
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


@read_retried
def hardware_list(state: AppState) -> list[HardwarePublic]:
    with state.database.session() as session:
        return [_public(row, session) for row in list_hardware(session=session)]


@read_retried
def read_hardware(state: AppState, name: str) -> HardwarePublic:
    with state.database.session() as session:
        row = get_hardware(session=session, name=name) if _valid(name) else None
        if row is None:
            raise problems.not_found(
                "hardware-not-found",
                "Hardware not found",
                f"no hardware profile {problems.echoed(name)}; GET /v1/hardware lists them, "
                "POST adds one",
            )
        return _public(row, session)


def _valid(name: str) -> bool:
    return re.fullmatch(HARDWARE_NAME_PATTERN, name) is not None


def write_hardware(state: AppState, body: HardwareIn) -> tuple[HardwarePublic, bool]:
    """Create or replace a profile; returns it as stored and whether it was created. Twenty
    clients writing at once get one 'created' and twenty revisions, never an error."""
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
    with state.database.session(write=True) as session:
        outcome = upsert_hardware(
            session=session, profile=profile, origin="api", report=WriteReport()
        )
        row = get_hardware(session=session, name=body.name)
        assert row is not None
        public = _public(row, session)  # read under this transaction's lock: as stored
        session.commit()
    return public, outcome == "created"
