"""Initial schema: hardware, links (comm_profiles), layer profiles, plans, jobs, measurements.

Times are naive UTC ``DateTime`` columns (api.store.models.UTCDateTime). The bundled
profiles are not loaded here: ``stagewright profiles load`` (and ``stagewright serve``, which
runs it) loads them idempotently, so a newer release can update them without a migration.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hardware",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("peak_flops", sa.JSON(), nullable=False),
        sa.Column("memory_gib", sa.Double(), nullable=False),
        sa.Column("usable_memory_gib", sa.Double(), nullable=False),
        sa.Column("memory_bandwidth_gbps", sa.Double(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "comm_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("bandwidth_gbps", sa.Double(), nullable=False),
        sa.Column("latency_us", sa.Double(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["gpu"], ["hardware.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("gpu", "scope", name="uq_comm_profiles_gpu_scope"),
    )
    op.create_index("ix_comm_profiles_gpu", "comm_profiles", ["gpu"])
    op.create_table(
        "layer_profiles",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("precision", sa.String(length=8), nullable=False),
        sa.Column("hidden_size", sa.Integer(), nullable=False),
        sa.Column("num_attention_heads", sa.Integer(), nullable=False),
        sa.Column("ffn_hidden_size", sa.Integer(), nullable=False),
        sa.Column("seq_length", sa.Integer(), nullable=False),
        sa.Column("micro_batch_size", sa.Integer(), nullable=False),
        sa.Column("t", sa.Integer(), nullable=False),
        sa.Column("recompute", sa.String(length=16), nullable=False),
        sa.Column("sequence_parallel", sa.Boolean(), nullable=False),
        sa.Column("flash_attention", sa.Boolean(), nullable=False),
        sa.Column("forward_ms", sa.Double(), nullable=False),
        sa.Column("backward_ms", sa.Double(), nullable=False),
        sa.Column("weight_ms", sa.Double(), nullable=True),
        sa.Column("activation_bytes", sa.Double(), nullable=True),
        sa.Column("includes_tp_comm", sa.Boolean(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["gpu"], ["hardware.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
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
    op.create_index("ix_layer_profiles_gpu", "layer_profiles", ["gpu"])
    op.create_table(
        "plans",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("hardware_revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_plans_created_at", "plans", ["created_at"])
    op.create_index("ix_plans_gpu", "plans", ["gpu"])
    op.create_index("ix_plans_request_hash_status", "plans", ["request_hash", "status"])
    op.create_index("ix_plans_status", "plans", ["status"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("plan_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claim", sa.String(length=32), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_plan_id", "jobs", ["plan_id"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(length=32), nullable=False),
        sa.Column("candidate", sa.Integer(), nullable=False),
        sa.Column("step_time_s", sa.Double(), nullable=False),
        sa.Column("peak_activation_bytes", sa.JSON(), nullable=False),
        sa.Column("predicted_iteration_time_s", sa.Double(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_measurements_plan_id", "measurements", ["plan_id"])


def downgrade() -> None:
    op.drop_table("measurements")
    op.drop_table("jobs")
    op.drop_table("plans")
    op.drop_table("layer_profiles")
    op.drop_table("comm_profiles")
    op.drop_table("hardware")
