"""Hardware, link and layer profiles in SQL, and the planner's view of them.

:class:`SqlProfileStore` implements ``planner.profiles.ProfileStore`` on these tables: the
service plans with whatever the database holds. Writes are upserts keyed by hardware name,
(gpu, link scope) and a layer point's shape; a write that changes nothing bumps nothing, so
loading the bundled ``profiles/`` twice is a no-op. Every change bumps the hardware's
``revision``, which is part of a plan's cache key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.store.models import CommProfile, Hardware, LayerProfile, utcnow
from planner.profiles import (
    BUNDLED_PROFILES,
    CalibrationRecord,
    HardwareProfile,
    LayerPoint,
    Link,
    UnknownHardwareError,
    compute_from_dict,
    hardware_from_dict,
    points_from_dict,
)

__all__ = [
    "LINK_SCOPES",
    "SqlProfileStore",
    "WriteReport",
    "count_layer_points",
    "get_hardware",
    "hardware_profile",
    "list_hardware",
    "list_layer_points",
    "list_links",
    "load_bundled_profiles",
    "require_hardware",
    "upsert_hardware",
    "upsert_layer_point",
    "upsert_link",
]

Origin = Literal["bundled", "api"]
LINK_SCOPES = ("intra_node", "inter_node")
_POINT_KEY = (
    "gpu",
    "precision",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "seq_length",
    "micro_batch_size",
    "t",
    "recompute",
    "sequence_parallel",
    "flash_attention",
)
_POINT_VALUES = (
    "forward_ms",
    "backward_ms",
    "weight_ms",
    "activation_bytes",
    "includes_tp_comm",
    "source",
)


@dataclass
class WriteReport:
    """What a write did: entries new, replaced or already identical, and the revisions of
    the hardware profiles it touched."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    revisions: dict[str, int] = field(default_factory=dict)
    # Bundled measured runs (profiles/measurements/) stored, and found already stored.
    runs_created: int = 0
    runs_unchanged: int = 0
    # Hardware whose revision this write already raised: one write is one revision.
    bumped: set[str] = field(default_factory=set)

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)


class SqlProfileStore:
    """``planner.profiles.ProfileStore`` backed by SQL. Each call opens a short session of
    its own, so no connection is held while the planner computes."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def hardware(self, name: str) -> HardwareProfile:
        with self._sessions() as session:
            return hardware_profile(require_hardware(session=session, name=name), session)

    def hardware_names(self) -> list[str]:
        with self._sessions() as session:
            return list(session.scalars(select(Hardware.name).order_by(Hardware.name)))

    def layer_points(self, gpu: str) -> Sequence[LayerPoint]:
        with self._sessions() as session:
            rows = session.scalars(
                select(LayerProfile).where(LayerProfile.gpu == gpu).order_by(LayerProfile.id)
            )
            return [_point(row) for row in rows]


def get_hardware(*, session: Session, name: str) -> Hardware | None:
    return session.get(Hardware, name)


def require_hardware(*, session: Session, name: str) -> Hardware:
    """The hardware row called ``name``; UnknownHardwareError (listing the known names and
    how to add one) if there is none."""
    row = session.get(Hardware, name)
    if row is None:
        known = ", ".join(session.scalars(select(Hardware.name).order_by(Hardware.name)))
        raise UnknownHardwareError(
            f"unknown GPU {name!r}; known hardware profiles: {known or 'none'} "
            "(add one with POST /v1/hardware)"
        )
    return row


def list_hardware(*, session: Session) -> list[Hardware]:
    return list(session.scalars(select(Hardware).order_by(Hardware.name)))


def list_links(*, session: Session, gpu: str | None = None) -> list[CommProfile]:
    stmt = select(CommProfile).order_by(CommProfile.gpu, CommProfile.scope)
    if gpu is not None:
        stmt = stmt.where(CommProfile.gpu == gpu)
    return list(session.scalars(stmt))


def links_of(session: Session, gpu: str) -> dict[str, CommProfile]:
    return {row.scope: row for row in list_links(session=session, gpu=gpu)}


def list_layer_points(
    *, session: Session, gpu: str | None = None, limit: int = 100, offset: int = 0
) -> list[LayerProfile]:
    stmt = select(LayerProfile).order_by(LayerProfile.gpu, LayerProfile.id)
    if gpu is not None:
        stmt = stmt.where(LayerProfile.gpu == gpu)
    return list(session.scalars(stmt.limit(limit).offset(offset)))


def count_layer_points(*, session: Session, gpu: str | None = None) -> int:
    stmt = select(func.count()).select_from(LayerProfile)
    if gpu is not None:
        stmt = stmt.where(LayerProfile.gpu == gpu)
    return int(session.scalar(stmt) or 0)


def hardware_profile(row: Hardware, session: Session) -> HardwareProfile:
    """The planner's HardwareProfile of a row (with its two links)."""
    links = links_of(session, row.name)
    missing = [scope for scope in LINK_SCOPES if scope not in links]
    if missing:
        raise UnknownHardwareError(
            f"hardware profile {row.name!r} has no {' or '.join(missing)} link; "
            "post it with POST /v1/hardware or POST /v1/profiles"
        )
    return HardwareProfile(
        name=row.name,
        description=row.description,
        peak_flops=dict(row.peak_flops),
        memory_gib=row.memory_gib,
        usable_memory_gib=row.usable_memory_gib,
        memory_bandwidth_gbps=row.memory_bandwidth_gbps,
        intra_node=_link(links["intra_node"]),
        inter_node=_link(links["inter_node"]),
        source=row.source,
        compute=compute_from_dict(row.compute),
        parameters=dict(row.parameters or {}),
        calibration=None
        if row.calibration is None
        else CalibrationRecord.from_dict(row.calibration),
    )


def _link(row: CommProfile) -> Link:
    return Link(row.kind, row.bandwidth_gbps, row.latency_us)


def _point(row: LayerProfile) -> LayerPoint:
    return LayerPoint(
        gpu=row.gpu,
        precision=row.precision,
        hidden_size=row.hidden_size,
        num_attention_heads=row.num_attention_heads,
        ffn_hidden_size=row.ffn_hidden_size,
        seq_length=row.seq_length,
        micro_batch_size=row.micro_batch_size,
        t=row.t,
        recompute=row.recompute,
        sequence_parallel=row.sequence_parallel,
        flash_attention=row.flash_attention,
        forward_ms=row.forward_ms,
        backward_ms=row.backward_ms,
        weight_ms=row.weight_ms,
        activation_bytes=row.activation_bytes,
        includes_tp_comm=row.includes_tp_comm,
        source=row.source,
    )


def _record(session: Session, gpu: str, outcome: str, report: WriteReport) -> None:
    """Report the revision a write leaves ``gpu`` at: raised once per write if this entry
    changed, else the current one."""
    if outcome != "unchanged":
        _bump(session, gpu, report)
        return
    hw = session.get(Hardware, gpu)
    if hw is not None:
        report.revisions.setdefault(gpu, hw.revision)


def _bump(session: Session, gpu: str, report: WriteReport) -> None:
    row = session.get(Hardware, gpu)
    if row is None:  # pragma: no cover - callers check the hardware exists first
        raise UnknownHardwareError(f"unknown GPU {gpu!r}")
    if gpu not in report.bumped:
        row.revision += 1
        row.updated_at = utcnow()
        report.bumped.add(gpu)
    report.revisions[gpu] = row.revision


def _assign(row: Any, values: dict[str, Any]) -> bool:
    """Set ``values`` on ``row``; True if anything differed."""
    changed = False
    for key, value in values.items():
        if getattr(row, key) != value:
            setattr(row, key, value)
            changed = True
    return changed


def _replace(
    row: Any, values: dict[str, Any], origin: Origin, now: datetime, keep_api_rows: bool
) -> str:
    """Update an existing profile row in place; 'updated' if any value differed, else
    'unchanged'. With ``keep_api_rows`` (the bundled load) a row posted through the API is
    left as it is; otherwise the writer becomes the row's origin either way."""
    if keep_api_rows and row.origin == "api":
        return "unchanged"
    changed = _assign(row, values)
    row.origin = origin
    if not changed:
        return "unchanged"
    row.updated_at = now
    return "updated"


def upsert_hardware(
    *,
    session: Session,
    profile: HardwareProfile,
    origin: Origin,
    report: WriteReport,
    keep_api_rows: bool = False,
) -> str:
    """Create or replace a hardware profile and its two links (flushes, does not commit).

    Returns 'created', 'updated' or 'unchanged'. With ``keep_api_rows`` (the bundled load)
    a profile posted through the API is left as it is, and a calibrated profile keeps its
    fitted parameters and calibration record (a release's new peaks still apply)."""
    now = utcnow()
    row = session.get(Hardware, profile.name)
    values: dict[str, Any] = {
        "description": profile.description,
        "peak_flops": dict(profile.peak_flops),
        "memory_gib": profile.memory_gib,
        "usable_memory_gib": profile.usable_memory_gib,
        "memory_bandwidth_gbps": profile.memory_bandwidth_gbps,
        "source": profile.source,
        "compute": None if profile.compute is None else profile.compute.to_dict(),
        "parameters": dict(profile.parameters),
        "calibration": None
        if profile.calibration is None
        else profile.calibration.model_dump(mode="json"),
    }
    if keep_api_rows and row is not None and row.calibration is not None:
        del values["parameters"], values["calibration"]
    if row is None:
        row = Hardware(
            name=profile.name, origin=origin, revision=1, created_at=now, updated_at=now, **values
        )
        session.add(row)
        session.flush()
        outcome = "created"
        report.revisions[profile.name] = 1
        report.bumped.add(profile.name)
    elif keep_api_rows and row.origin == "api":
        report.revisions[profile.name] = row.revision
        return "unchanged"
    else:
        changed = _assign(row, values)
        row.origin = origin  # who wrote it last; not a change of the profile
        outcome = "updated" if changed else "unchanged"
        if changed:
            _bump(session, profile.name, report)
    for scope, link in (("intra_node", profile.intra_node), ("inter_node", profile.inter_node)):
        link_outcome = upsert_link(
            session=session,
            gpu=profile.name,
            scope=scope,
            link=link,
            source=profile.source,
            origin=origin,
            report=report,
            keep_api_rows=keep_api_rows,
        )
        if outcome == "unchanged" and link_outcome != "unchanged":
            outcome = "updated"
    report.revisions.setdefault(profile.name, row.revision)
    report.add(outcome)
    return outcome


def upsert_link(
    *,
    session: Session,
    gpu: str,
    scope: str,
    link: Link,
    source: str,
    origin: Origin,
    report: WriteReport,
    keep_api_rows: bool = False,
) -> str:
    """Create or replace the ``scope`` link of ``gpu`` (whose hardware must exist)."""
    row = session.scalar(
        select(CommProfile).where(CommProfile.gpu == gpu, CommProfile.scope == scope)
    )
    values = {
        "kind": link.kind,
        "bandwidth_gbps": link.bandwidth_gbps,
        "latency_us": link.latency_us,
        "source": source,
    }
    now = utcnow()
    if row is None:
        session.add(CommProfile(gpu=gpu, scope=scope, origin=origin, updated_at=now, **values))
        outcome = "created"
    else:
        outcome = _replace(row, values, origin, now, keep_api_rows)
    _record(session, gpu, outcome, report)
    session.flush()
    return outcome


def upsert_layer_point(
    *,
    session: Session,
    point: LayerPoint,
    origin: Origin,
    report: WriteReport,
    keep_api_rows: bool = False,
) -> str:
    """Create or replace the point of this shape (whose hardware must exist)."""
    key = {name: getattr(point, name) for name in _POINT_KEY}
    values = {name: getattr(point, name) for name in _POINT_VALUES}
    row = session.scalar(
        select(LayerProfile).where(*(getattr(LayerProfile, k) == v for k, v in key.items()))
    )
    now = utcnow()
    if row is None:
        session.add(LayerProfile(origin=origin, created_at=now, updated_at=now, **key, **values))
        outcome = "created"
    else:
        outcome = _replace(row, values, origin, now, keep_api_rows)
    _record(session, point.gpu, outcome, report)
    session.flush()
    report.add(outcome)
    return outcome


def _bundled(folder: Path) -> tuple[list[HardwareProfile], list[LayerPoint]]:
    data = json.loads((folder / "hardware.json").read_text(encoding="utf-8"))
    hardware = [hardware_from_dict(entry) for entry in data["hardware"]]
    points: list[LayerPoint] = []
    layers = folder / "layers"
    if layers.is_dir():
        for path in sorted(layers.glob("*.json")):
            points.extend(points_from_dict(json.loads(path.read_text(encoding="utf-8"))))
    return hardware, points


def load_bundled_profiles(*, session: Session, folder: Path = BUNDLED_PROFILES) -> WriteReport:
    """Load ``profiles/`` (hardware, links, layer points, measured runs) and commit.
    Idempotent: a second load finds everything identical and changes nothing. Entries
    posted through the API are kept; bundled entries changed by a newer release are
    updated; measured runs are only ever added."""
    # Imported here: the measured-runs store builds on this module.
    from api.store.measured_runs import load_bundled_runs

    hardware, points = _bundled(folder)
    report = WriteReport()
    for profile in hardware:
        upsert_hardware(
            session=session, profile=profile, origin="bundled", report=report, keep_api_rows=True
        )
    for point in _known(session, points):
        upsert_layer_point(
            session=session, point=point, origin="bundled", report=report, keep_api_rows=True
        )
    runs = load_bundled_runs(session=session, folder=folder)
    report.runs_created, report.runs_unchanged = runs.created, runs.unchanged
    session.commit()
    return report


def _known(session: Session, points: Iterable[LayerPoint]) -> list[LayerPoint]:
    names = set(session.scalars(select(Hardware.name)))
    return [p for p in points if p.gpu in names]
