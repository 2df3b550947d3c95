"""Hardware profiles carry cost-model parameters and the record of their calibration.

``parameters`` holds a profile's overrides of the cost model's free parameters
(``planner.costmodel.parameters``); existing rows get ``{}`` (every parameter at its
declared default, which is what the cost model used before). ``calibration`` is null until
``stagewright calibrate`` fits the profile.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(
            sa.Column("parameters", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )
        batch.add_column(sa.Column("calibration", sa.JSON(), nullable=True))
    # The default only fills the rows that exist; new rows always say what they hold.
    with op.batch_alter_table("hardware") as batch:
        batch.alter_column("parameters", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("calibration")
        batch.drop_column("parameters")
