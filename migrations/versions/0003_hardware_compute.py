"""Hardware profiles carry their compute facts for the shape-aware layer model.

``compute`` holds a device's SM count, L2 bandwidth and GEMM tile shapes
(``planner.profiles.ComputeUnits``); null for a device without them (its GEMMs are priced
without tile and wave quantization). Existing rows get null until the bundled profiles are
loaded again (every start of ``stagewright serve`` does).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("compute", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("compute")
