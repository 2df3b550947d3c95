"""SQL tables (SQLAlchemy 2.0 declarative, ``Mapped``). Alembic's revisions in
``migrations/`` create exactly these; a test compares the two.

Times are stored as naive UTC (both backends agree on that) and read back as aware UTC.
JSON columns use the portable ``JSON`` type (``json`` on PostgreSQL, text on SQLite).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Date,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "Base",
    "Calibration",
    "CommProfile",
    "Hardware",
    "Job",
    "LayerProfile",
    "MeasuredRunRecord",
    "Measurement",
    "PlanRecord",
    "ProfileSnapshot",
    "UTCDateTime",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A UTC instant: stored naive (in UTC), returned timezone-aware."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class Hardware(Base):
    """A hardware profile (peaks, memory); its links are in ``comm_profiles``. ``revision``
    goes up on every change to it, its links or its layer points: plans are cached per
    (request, revision), so a changed profile is never answered from an old plan.

    ``parameters`` overrides the cost model's free parameters (``{name: value}``, names
    from ``planner.costmodel.parameters``); ``calibration`` is the record of the fit that
    set them (``planner.profiles.CalibrationRecord`` as JSON), or null. ``compute`` holds the
    device facts of the shape-aware layer model (``planner.profiles.ComputeUnits``), or null."""

    __tablename__ = "hardware"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text)
    peak_flops: Mapped[dict[str, float]] = mapped_column(JSON)
    memory_gib: Mapped[float] = mapped_column(Double)
    usable_memory_gib: Mapped[float] = mapped_column(Double)
    memory_bandwidth_gbps: Mapped[float] = mapped_column(Double)
    source: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(String(16))
    revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    parameters: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    compute: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class CommProfile(Base):
    """Bandwidth and latency of one link scope of a hardware profile (the pipeline,
    tensor- and data-parallel traffic is priced with these)."""

    __tablename__ = "comm_profiles"
    __table_args__ = (UniqueConstraint("gpu", "scope", name="uq_comm_profiles_gpu_scope"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gpu: Mapped[str] = mapped_column(
        String(64), ForeignKey("hardware.name", ondelete="CASCADE"), index=True
    )
    scope: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(64))
    bandwidth_gbps: Mapped[float] = mapped_column(Double)
    latency_us: Mapped[float] = mapped_column(Double)
    source: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LayerProfile(Base):
    """One measured layer point (planner.profiles.LayerPoint). The shape columns are unique
    together: writing a point of a known shape replaces its timings."""

    __tablename__ = "layer_profiles"
    __table_args__ = (
        UniqueConstraint(
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
            name="uq_layer_profiles_shape",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gpu: Mapped[str] = mapped_column(
        String(64), ForeignKey("hardware.name", ondelete="CASCADE"), index=True
    )
    precision: Mapped[str] = mapped_column(String(8))
    hidden_size: Mapped[int] = mapped_column(Integer)
    num_attention_heads: Mapped[int] = mapped_column(Integer)
    ffn_hidden_size: Mapped[int] = mapped_column(Integer)
    seq_length: Mapped[int] = mapped_column(Integer)
    micro_batch_size: Mapped[int] = mapped_column(Integer)
    t: Mapped[int] = mapped_column(Integer)
    recompute: Mapped[str] = mapped_column(String(16))
    sequence_parallel: Mapped[bool]
    flash_attention: Mapped[bool]
    forward_ms: Mapped[float] = mapped_column(Double)
    backward_ms: Mapped[float] = mapped_column(Double)
    weight_ms: Mapped[float | None] = mapped_column(Double)
    activation_bytes: Mapped[float | None] = mapped_column(Double)
    includes_tp_comm: Mapped[bool]
    source: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ProfileSnapshot(Base):
    """The profiles one revision of a hardware profile priced plans with: the hardware (with
    its links) and every layer point, as the planner reads them. Written the first time a
    plan is made on that revision and never changed, so a plan can be priced again exactly
    (its timeline, a re-run) after the profile has moved on."""

    __tablename__ = "profile_snapshots"

    gpu: Mapped[str] = mapped_column(String(64), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON)
    layer_points: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class PlanRecord(Base):
    """A plan request and, once its job is done, the Plan (or the problem that stopped it).

    ``request_hash`` covers the request, the hardware profile's revision and the planner's
    version: an identical request is answered from here until one of them changes.
    ``dedup_key`` is that hash while the plan can answer it (queued, running or done) and
    null once it failed; being unique, it lets exactly one of many identical concurrent
    requests create the plan (the others join it). The plan is priced with the profiles of
    (``gpu``, ``hardware_revision``), kept in ``profile_snapshots``. ``created_by`` names the
    token that created it (never the secret)."""

    __tablename__ = "plans"
    __table_args__ = (
        Index("ix_plans_request_hash_status", "request_hash", "status"),
        Index("ix_plans_created_at", "created_at"),
        Index("uq_plans_dedup_key", "dedup_key", unique=True),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    dedup_key: Mapped[str | None] = mapped_column(String(64))
    created_by: Mapped[str | None] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    warnings: Mapped[list[str]] = mapped_column(JSON)
    model_name: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[str] = mapped_column(String(64), index=True)
    num_gpus: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(16))
    hardware_revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Job(Base):
    """A background search. A process claims a queued job by writing its ``claim`` token
    (only if still queued), renews ``heartbeat_at`` while it runs, and finishes it only while
    the claim is still its own; a job whose heartbeat is older than the lease goes back to
    the queue (the process that ran it died)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    plan_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("plans.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    claim: Mapped[str | None] = mapped_column(String(32))
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)


class Measurement(Base):
    """What the executor measured when it ran one of a plan's candidates. It is also stored
    as a measured run for calibration: ``measured_run_id`` is that run (or the identical one
    already stored), ``not_calibrated_because`` why the store refused it; both are null for
    a measurement stored before either was recorded (schema revision 0008)."""

    __tablename__ = "measurements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("plans.id", ondelete="CASCADE"), index=True
    )
    candidate: Mapped[int] = mapped_column(Integer)
    step_time_s: Mapped[float] = mapped_column(Double)
    peak_activation_bytes: Mapped[list[int]] = mapped_column(JSON)
    predicted_iteration_time_s: Mapped[float | None] = mapped_column(Double)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # No foreign key: measured runs are never deleted (only withdrawn), so the id stays
    # valid; measured_runs.measurement_id keys the link the other way, and a key each way
    # would make the two tables depend on each other (neither created or dropped first).
    measured_run_id: Mapped[int | None] = mapped_column(Integer)
    not_calibrated_because: Mapped[str | None] = mapped_column(Text)


class MeasuredRunRecord(Base):
    """One measured run (``planner.measurements.MeasuredRun``): ``run`` is its JSON, the
    source of truth; the other columns repeat what lists filter and sort on. ``fingerprint``
    (SHA-256 of the canonical JSON) keeps one copy of identical runs. A run reported for a
    plan's candidate (``POST /v1/plans/{id}/measurements``) links to that measurement; the
    run stays when the plan is deleted. A withdrawn run (``withdrawn_at`` set, with the
    reason given) is kept but left out of lists and calibration: calibration records name
    the runs they used, and a deleted bundled run would come back at the next start."""

    __tablename__ = "measured_runs"
    __table_args__ = (UniqueConstraint("fingerprint", name="uq_measured_runs_fingerprint"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[str] = mapped_column(String(64), ForeignKey("hardware.name"), index=True)
    kind: Mapped[str] = mapped_column(String(8))
    model_name: Mapped[str] = mapped_column(String(200), index=True)
    num_gpus: Mapped[int] = mapped_column(Integer)
    t: Mapped[int] = mapped_column(Integer)
    p: Mapped[int] = mapped_column(Integer)
    d: Mapped[int] = mapped_column(Integer)
    micro_batch_size: Mapped[int] = mapped_column(Integer)
    recompute: Mapped[str] = mapped_column(String(16))
    schedule: Mapped[str] = mapped_column(String(32))
    step_time_s: Mapped[float | None] = mapped_column(Double)
    mfu: Mapped[float | None] = mapped_column(Double)
    peak_memory_gib: Mapped[list[float] | None] = mapped_column(JSON)
    pass_layers: Mapped[int | None] = mapped_column(Integer)
    forward_ms: Mapped[float | None] = mapped_column(Double)
    backward_ms: Mapped[float | None] = mapped_column(Double)
    weight_ms: Mapped[float | None] = mapped_column(Double)
    source: Mapped[str] = mapped_column(Text)
    measured_on: Mapped[date | None] = mapped_column(Date)
    run: Mapped[dict[str, Any]] = mapped_column(JSON)
    origin: Mapped[str] = mapped_column(String(16))
    measurement_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("measurements.id", ondelete="SET NULL"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    withdrawn_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    withdrawn_reason: Mapped[str | None] = mapped_column(Text)


class Calibration(Base):
    """One fit of a hardware profile's parameters (``stagewright calibrate``): the revision
    it produced, the parameters before and after, its error and the runs it used. The
    profile itself carries the latest one; this table keeps them all."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gpu: Mapped[str] = mapped_column(
        String(64), ForeignKey("hardware.name", ondelete="CASCADE"), index=True
    )
    revision: Mapped[int] = mapped_column(Integer)
    base_revision: Mapped[int] = mapped_column(Integer)
    parameters_before: Mapped[dict[str, float]] = mapped_column(JSON)
    parameters_after: Mapped[dict[str, float]] = mapped_column(JSON)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
