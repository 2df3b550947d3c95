"""PostgreSQL tells every listening server process when a plan row is deleted.

A trigger sends ``NOTIFY stagewright_plan_deleted, '<plan id>'`` for each deleted plan,
whoever deletes it (the service, a script, an operator in psql), and ``'*'`` when the table
is truncated. Notices are delivered when the deleting transaction commits, never for one
rolled back. Triggers do not fire while disabled (``ALTER TABLE ... DISABLE TRIGGER``,
``session_replication_role = replica``): restart the servers after deleting plans so.
Server processes keep done plans' answers in memory and drop them on the notice
(:mod:`api.services.plan_deletions`), so a cached read needs no database round trip.
SQLite has no notices: nothing to do there (its reads check the file instead).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channel name is also in api/services/plan_deletions.py (CHANNEL); a migration is
# frozen history, so it does not import the application.
_FUNCTION = """
CREATE OR REPLACE FUNCTION stagewright_plan_deleted() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('stagewright_plan_deleted', '*');
        RETURN NULL;
    END IF;
    PERFORM pg_notify('stagewright_plan_deleted', OLD.id);
    RETURN OLD;
END
$$ LANGUAGE plpgsql
"""
# One function for both: a deleted row names its plan, a truncation every plan ('*').
_TRIGGERS = (
    """CREATE TRIGGER plans_notify_deleted AFTER DELETE ON plans
    FOR EACH ROW EXECUTE FUNCTION stagewright_plan_deleted()""",
    """CREATE TRIGGER plans_notify_truncated AFTER TRUNCATE ON plans
    FOR EACH STATEMENT EXECUTE FUNCTION stagewright_plan_deleted()""",
)


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if _postgresql():
        for statement in (_FUNCTION, *_TRIGGERS):
            op.execute(statement)


def downgrade() -> None:
    if _postgresql():
        op.execute("DROP TRIGGER IF EXISTS plans_notify_truncated ON plans")
        op.execute("DROP TRIGGER IF EXISTS plans_notify_deleted ON plans")
        op.execute("DROP FUNCTION IF EXISTS stagewright_plan_deleted()")
