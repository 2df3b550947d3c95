"""Plans: a unique dedup key (identical requests share one plan and job), the token that
created each plan, and the profile snapshots plans are priced with.

Existing plans: the newest answering plan of each request hash (done before running
before queued; failed ones never) gets the hash as its dedup key, so the store keeps
answering what it answered before. Plans made before this revision have no snapshot; the
service uses the current profiles for them while the hardware revision is unchanged.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PREFERENCE = {"done": 0, "running": 1, "queued": 2}


def upgrade() -> None:
    op.create_table(
        "profile_snapshots",
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("layer_points", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("gpu", "revision"),
    )
    # Nullable columns and an index: ALTER TABLE on both backends, no table rebuild.
    op.add_column("plans", sa.Column("dedup_key", sa.String(length=64), nullable=True))
    op.add_column("plans", sa.Column("created_by", sa.String(length=64), nullable=True))
    plans = sa.table(
        "plans",
        sa.column("id", sa.String),
        sa.column("request_hash", sa.String),
        sa.column("status", sa.String),
        sa.column("created_at", sa.DateTime),
        sa.column("dedup_key", sa.String),
    )
    conn = op.get_bind()
    chosen: dict[str, tuple[tuple[int, float], str]] = {}
    rows = conn.execute(
        sa.select(plans.c.id, plans.c.request_hash, plans.c.status, plans.c.created_at).where(
            plans.c.status.in_(list(_PREFERENCE))
        )
    )
    for plan_id, digest, status, created in rows:
        rank = (_PREFERENCE[status], -created.timestamp())
        if digest not in chosen or rank < chosen[digest][0]:
            chosen[digest] = (rank, plan_id)
    for digest, (_, plan_id) in chosen.items():
        conn.execute(sa.update(plans).where(plans.c.id == plan_id).values(dedup_key=digest))
    op.create_index("uq_plans_dedup_key", "plans", ["dedup_key"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_plans_dedup_key", table_name="plans")
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("created_by")
        batch.drop_column("dedup_key")
    op.drop_table("profile_snapshots")
