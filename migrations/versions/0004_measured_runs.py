"""Measured runs (the calibration data) and the history of calibrations.

``measured_runs`` holds every measured run (``planner.measurements.MeasuredRun`` as JSON,
with the columns lists filter on). The executor's reports of a plan's candidate stay in
``measurements`` (the contract of ``POST /v1/plans/{id}/measurements``); each of them is
also a measured run from now on, linked by ``measurement_id``. This migration copies the
measurements already stored into ``measured_runs`` the same way, so none is left out of
calibration. (It uses the application's own conversion: the run JSON must be what the
application would write.)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "measured_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("t", sa.Integer(), nullable=False),
        sa.Column("p", sa.Integer(), nullable=False),
        sa.Column("d", sa.Integer(), nullable=False),
        sa.Column("micro_batch_size", sa.Integer(), nullable=False),
        sa.Column("recompute", sa.String(length=16), nullable=False),
        sa.Column("schedule", sa.String(length=32), nullable=False),
        sa.Column("step_time_s", sa.Double(), nullable=True),
        sa.Column("mfu", sa.Double(), nullable=True),
        sa.Column("peak_memory_gib", sa.JSON(), nullable=True),
        sa.Column("pass_layers", sa.Integer(), nullable=True),
        sa.Column("forward_ms", sa.Double(), nullable=True),
        sa.Column("backward_ms", sa.Double(), nullable=True),
        sa.Column("weight_ms", sa.Double(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("measured_on", sa.Date(), nullable=True),
        sa.Column("run", sa.JSON(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("measurement_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["gpu"], ["hardware.name"]),
        sa.ForeignKeyConstraint(["measurement_id"], ["measurements.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint", name="uq_measured_runs_fingerprint"),
    )
    op.create_index("ix_measured_runs_gpu", "measured_runs", ["gpu"])
    op.create_index("ix_measured_runs_model_name", "measured_runs", ["model_name"])
    op.create_index("ix_measured_runs_measurement_id", "measured_runs", ["measurement_id"])
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("base_revision", sa.Integer(), nullable=False),
        sa.Column("parameters_before", sa.JSON(), nullable=False),
        sa.Column("parameters_after", sa.JSON(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["gpu"], ["hardware.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_calibrations_gpu", "calibrations", ["gpu"])
    _copy_plan_measurements()


def _copy_plan_measurements() -> None:
    """Each stored plan measurement becomes a measured run (skipped only when its plan or
    candidate is gone, names hardware no longer stored, or no longer reads as a run; the
    measurement itself stays either way)."""
    from api.store.measured_runs import run_columns, run_from_plan_measurement
    from planner.measurements import fingerprint

    bind = op.get_bind()
    measurements = sa.table(
        "measurements",
        sa.column("id", sa.Integer()),
        sa.column("plan_id", sa.String()),
        sa.column("candidate", sa.Integer()),
        sa.column("step_time_s", sa.Double()),
        sa.column("created_at", sa.DateTime()),
    )
    plans = sa.table(
        "plans",
        sa.column("id", sa.String()),
        sa.column("request", sa.JSON()),
        sa.column("result", sa.JSON()),
    )
    hardware = sa.table("hardware", sa.column("name", sa.String()))
    known = {row.name for row in bind.execute(sa.select(hardware.c.name))}
    seen: set[str] = set()
    query = sa.select(
        measurements.c.id,
        measurements.c.plan_id,
        measurements.c.candidate,
        measurements.c.step_time_s,
        measurements.c.created_at,
        plans.c.request,
        plans.c.result,
    ).join(plans, plans.c.id == measurements.c.plan_id)
    for row in bind.execute(query.order_by(measurements.c.id)):
        candidates = (row.result or {}).get("candidates") or []
        if row.candidate >= len(candidates) or row.request["cluster"]["gpu"] not in known:
            continue
        try:
            run = run_from_plan_measurement(
                request=row.request,
                config=candidates[row.candidate]["config"],
                step_time_s=row.step_time_s,
                plan_id=row.plan_id,
                candidate=row.candidate,
                measured_on=row.created_at.date(),
            )
        except ValueError:  # a plan of an older format: its measurement stays as it is
            continue
        key = fingerprint(run)
        if key in seen:
            continue
        seen.add(key)
        values = {
            **run_columns(run),
            "fingerprint": key,
            "origin": "plan",
            "measurement_id": row.id,
            "created_at": row.created_at,
        }
        # Only the columns written, typed where JSON or dates need it: later revisions may
        # add columns this one knows nothing of.
        runs = sa.table("measured_runs", *(sa.column(k, _TYPES.get(k)) for k in values))
        bind.execute(runs.insert().values(**values))


_TYPES = {"peak_memory_gib": sa.JSON(), "run": sa.JSON(), "measured_on": sa.Date()}


def downgrade() -> None:
    op.drop_table("calibrations")
    op.drop_table("measured_runs")
