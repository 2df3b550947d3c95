"""Measured runs can be withdrawn: kept, but left out of lists and calibration.

``withdrawn_at`` (when) and ``withdrawn_reason`` (why, as given) are null for a run in use,
which every run stored before this revision is. A run is withdrawn instead of deleted
because calibration records name the runs they were fitted to, and because the bundled
runs are loaded at every start: a deleted bundled run would silently come back.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns: ALTER TABLE ... ADD COLUMN on both backends, no table rebuild.
    op.add_column("measured_runs", sa.Column("withdrawn_at", sa.DateTime(), nullable=True))
    op.add_column("measured_runs", sa.Column("withdrawn_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    # Going back forgets which runs were withdrawn: they are fitted again.
    with op.batch_alter_table("measured_runs") as batch:
        batch.drop_column("withdrawn_reason")
        batch.drop_column("withdrawn_at")
