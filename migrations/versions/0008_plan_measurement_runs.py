"""A plan measurement records whether it became a measured run, and why not.

``POST /v1/plans/{id}/measurements`` also stores the measurement as a measured run, for
calibration; the store refuses one it cannot use (most often a step time 100 times off
the prediction: a unit slip). ``measured_run_id`` is the run it was stored as (or found
identical to), ``not_calibrated_because`` the store's refusal; both are null for a
measurement stored before this revision, except that the run linked to it
(``measured_runs.measurement_id``) is copied into ``measured_run_id``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns: ALTER TABLE ... ADD COLUMN on both backends, no table rebuild.
    op.add_column("measurements", sa.Column("measured_run_id", sa.Integer(), nullable=True))
    op.add_column("measurements", sa.Column("not_calibrated_because", sa.Text(), nullable=True))
    measurements = sa.table(
        "measurements", sa.column("id", sa.Integer()), sa.column("measured_run_id", sa.Integer())
    )
    runs = sa.table(
        "measured_runs", sa.column("id", sa.Integer()), sa.column("measurement_id", sa.Integer())
    )
    linked = (
        sa.select(sa.func.min(runs.c.id))
        .where(runs.c.measurement_id == measurements.c.id)
        .scalar_subquery()
    )
    op.execute(measurements.update().values(measured_run_id=linked))


def downgrade() -> None:
    # Going back forgets which measurements calibration could not use, and why; the runs
    # themselves, and their link to the measurement, stay.
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("not_calibrated_because")
        batch.drop_column("measured_run_id")
