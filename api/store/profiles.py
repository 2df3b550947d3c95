"""Hardware, link and layer profiles in SQL, and the planner's view of them.

:class:`SqlProfileStore` implements ``planner.profiles.ProfileStore`` on these tables: the
service plans with whatever the database holds. Writes are upserts keyed by hardware name,
(gpu, link scope) and a layer point's shape (INSERT ... ON CONFLICT DO NOTHING, then the
existing row locked and updated); a write that changes nothing bumps nothing, so loading
the bundled ``profiles/`` twice is a no-op. Every change raises the hardware's ``revision``
once per write, in SQL, and the revision is part of a plan's cache key. A write locks its
hardware rows first, in name order, so concurrent writers queue instead of deadlocking.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from api.store.models import CommProfile, Hardware, LayerProfile, utcnow
from planner.errors import StagewrightError
from planner.profiles import (
    BUNDLED_PROFILES,
    CalibrationRecord,
    HardwareProfile,
    JsonProfileStore,
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
    "layer_point",
    "list_hardware",
    "list_layer_points",
    "list_links",
    "load_bundled_profiles",
    "load_profile_folders",
    "lock_hardware",
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
    # Bundled measured runs (profiles/measurements/) stored, and found already stored (of
    # which withdrawn, and kept so: a withdrawn bundled run does not come back).
    runs_created: int = 0
    runs_unchanged: int = 0
    runs_withdrawn: int = 0
    # Hardware whose revision this write already raised: one write is one revision.
    bumped: set[str] = field(default_factory=set)
    # Calibrated profiles this write replaced without their fit, as (name, the calibrated
    # revision): the fit stays in the calibrations table, but plans no longer use it.
    uncalibrated: list[tuple[str, int]] = field(default_factory=list)

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
            return [layer_point(row) for row in rows]


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


def layer_point(row: LayerProfile) -> LayerPoint:
    """The planner's LayerPoint of a stored row."""
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


def lock_hardware(*, session: Session, names: Iterable[str]) -> list[str]:
    """Lock the hardware rows ``names`` for this transaction (in name order, the order every
    profile write takes them, so two writers cannot deadlock) and return the names that do
    not exist. Every profile write locks its hardware first: its revision is raised at the
    end of the same transaction."""
    wanted = sorted(set(names))
    found = set(
        session.scalars(
            select(Hardware.name)
            .where(Hardware.name.in_(wanted))
            .order_by(Hardware.name)
            .with_for_update()
        )
    )
    return [name for name in wanted if name not in found]


def _record(session: Session, gpu: str, outcome: str, report: WriteReport) -> None:
    """Report the revision a write leaves ``gpu`` at: raised once per write if this entry
    changed, else the current one."""
    if outcome != "unchanged":
        _bump(session, gpu, report)
        return
    if gpu not in report.revisions:
        revision = session.scalar(select(Hardware.revision).where(Hardware.name == gpu))
        if revision is not None:
            report.revisions[gpu] = int(revision)


def _bump(session: Session, gpu: str, report: WriteReport) -> None:
    """Raise the revision of ``gpu`` by one, in SQL (revision = revision + 1 ... RETURNING):
    twenty concurrent changes give twenty revisions, each reported as stored."""
    if gpu in report.bumped:
        return
    revision = session.scalar(
        update(Hardware)
        .where(Hardware.name == gpu)
        .values(revision=Hardware.revision + 1, updated_at=utcnow())
        .returning(Hardware.revision)
        .execution_options(synchronize_session=False)
    )
    if revision is None:  # pragma: no cover - callers check the hardware exists first
        raise UnknownHardwareError(f"unknown GPU {gpu!r}")
    loaded = session.identity_map.get(identity_key(Hardware, gpu))
    if loaded is not None:  # the row this session holds shows the stored revision
        set_committed_value(loaded, "revision", int(revision))
    report.bumped.add(gpu)
    report.revisions[gpu] = int(revision)


def _insert_new(session: Session, model: Any, values: dict[str, Any], key: Sequence[str]) -> bool:
    """INSERT ... ON CONFLICT (key) DO NOTHING: True if this call created the row. Two
    writers creating the same entry at once get one 'created' and one existing row, never
    a unique-constraint error."""
    dialect = session.get_bind().dialect.name
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    statement = (
        insert(model)
        .values(**values)
        .on_conflict_do_nothing(index_elements=list(key))
        .returning(*(getattr(model, k) for k in key))
    )
    return session.execute(statement).first() is not None


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


def _locked(session: Session, stmt: Any) -> Any:
    """The row of ``stmt``, read anew and locked for this transaction (FOR UPDATE)."""
    return session.scalar(stmt.with_for_update().execution_options(populate_existing=True))


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
    fitted parameters and calibration record (a release's new peaks still apply). Creation
    is an INSERT ... ON CONFLICT DO NOTHING; an existing row is locked, compared and
    updated, and the revision raised in SQL once for the whole write."""
    now = utcnow()
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
    created = _insert_new(
        session,
        Hardware,
        {
            "name": profile.name,
            "origin": origin,
            "revision": 1,
            "created_at": now,
            "updated_at": now,
            **values,
        },
        ("name",),
    )
    row = _locked(session, select(Hardware).where(Hardware.name == profile.name))
    assert row is not None
    if created:
        outcome = "created"
        report.revisions[profile.name] = row.revision
        report.bumped.add(profile.name)
    elif keep_api_rows and row.origin == "api":
        report.revisions[profile.name] = row.revision
        report.add("unchanged")
        return "unchanged"
    else:
        if keep_api_rows and row.calibration is not None:
            del values["parameters"], values["calibration"]
        elif row.calibration is not None and values["calibration"] != row.calibration:
            report.uncalibrated.append((profile.name, row.revision))
        changed = _assign(row, values)
        row.origin = origin  # who wrote it last; not a change of the profile
        session.flush()
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
    """Create or replace the ``scope`` link of ``gpu`` (whose hardware must exist and be
    locked by this transaction: see :func:`lock_hardware`)."""
    values = {
        "kind": link.kind,
        "bandwidth_gbps": link.bandwidth_gbps,
        "latency_us": link.latency_us,
        "source": source,
    }
    now = utcnow()
    if _insert_new(
        session,
        CommProfile,
        {"gpu": gpu, "scope": scope, "origin": origin, "updated_at": now, **values},
        ("gpu", "scope"),
    ):
        outcome = "created"
    else:
        row = _locked(
            session,
            select(CommProfile).where(CommProfile.gpu == gpu, CommProfile.scope == scope),
        )
        outcome = _replace(row, values, origin, now, keep_api_rows)
    session.flush()
    _record(session, gpu, outcome, report)
    return outcome


def upsert_layer_point(
    *,
    session: Session,
    point: LayerPoint,
    origin: Origin,
    report: WriteReport,
    keep_api_rows: bool = False,
) -> str:
    """Create or replace the point of this shape (whose hardware must exist and be locked
    by this transaction: see :func:`lock_hardware`)."""
    key = {name: getattr(point, name) for name in _POINT_KEY}
    values = {name: getattr(point, name) for name in _POINT_VALUES}
    now = utcnow()
    if _insert_new(
        session,
        LayerProfile,
        {"origin": origin, "created_at": now, "updated_at": now, **key, **values},
        _POINT_KEY,
    ):
        outcome = "created"
    else:
        row = _locked(
            session,
            select(LayerProfile).where(*(getattr(LayerProfile, k) == v for k, v in key.items())),
        )
        outcome = _replace(row, values, origin, now, keep_api_rows)
    session.flush()
    _record(session, point.gpu, outcome, report)
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
    lock_hardware(session=session, names=[profile.name for profile in hardware])
    for profile in sorted(hardware, key=lambda h: h.name):
        upsert_hardware(
            session=session, profile=profile, origin="bundled", report=report, keep_api_rows=True
        )
    for point in _known(session, points):
        upsert_layer_point(
            session=session, point=point, origin="bundled", report=report, keep_api_rows=True
        )
    runs = load_bundled_runs(session=session, folder=folder)
    report.runs_created, report.runs_unchanged = runs.created, runs.unchanged
    report.runs_withdrawn = runs.kept_withdrawn
    session.commit()
    return report


def load_profile_folders(*, session: Session, folders: Sequence[Path]) -> WriteReport:
    """Load profile folders (``hardware.json`` and ``layers/*.json``, as ``stagewright
    profile --out`` writes them or a person edits them) as the team's own profiles, the way
    ``POST /v1/hardware`` and ``POST /v1/profiles`` store them: created or replaced, kept by
    later loads of the bundled profiles, each touched hardware's revision raised once; and
    commit. All or nothing: a file that cannot be read, or a layer point of a GPU that
    neither the folders nor the store has a profile of, stores nothing (StagewrightError)."""
    store = JsonProfileStore.load(*folders)  # a bad file: one error naming it
    hardware = [store.hardware(name) for name in store.hardware_names()]
    points = store.all_layer_points()
    report = WriteReport()
    defined = {profile.name for profile in hardware}
    unknown = lock_hardware(session=session, names=defined | {p.gpu for p in points})
    missing = [name for name in unknown if name not in defined]
    if missing:
        session.rollback()
        raise StagewrightError(
            f"layer points of {', '.join(map(repr, missing))} in {', '.join(map(str, folders))}"
            ", which neither a hardware.json there nor the store defines; add the GPU to a "
            "folder's hardware.json (or POST /v1/hardware) and load again"
        )
    for profile in hardware:
        upsert_hardware(session=session, profile=profile, origin="api", report=report)
    for point in points:
        upsert_layer_point(session=session, point=point, origin="api", report=report)
    session.commit()
    return report


def _known(session: Session, points: Iterable[LayerPoint]) -> list[LayerPoint]:
    names = set(session.scalars(select(Hardware.name)))
    return [p for p in points if p.gpu in names]
