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
from planner.profiles import Link, profile_from_spec

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
    profile = profile_from_spec(body)
    with state.database.session(write=True) as session:
        outcome = upsert_hardware(
            session=session, profile=profile, origin="api", report=WriteReport()
        )
        row = get_hardware(session=session, name=body.name)
        assert row is not None
        public = _public(row, session)  # read under this transaction's lock: as stored
        session.commit()
    return public, outcome == "created"
