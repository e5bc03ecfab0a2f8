"""jobs.deleted_at (DeleteJob keeps a tombstone without the user's words) and the index
ListJobs' status filter rides

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

# Only a finished job is deleted, and a deleted one holds none of the user's words.
DELETED_SHAPE = (
    "deleted_at IS NULL OR (status IN ('succeeded', 'failed', 'cancelled')"
    " AND deleted_at >= completed_at AND prompt = '' AND negative_prompt = ''"
    " AND parameters = '{}'::jsonb AND error_message IS NULL AND idempotency_key IS NULL"
    " AND request_hash = '')"
)


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing.
    op.add_column("jobs", sa.Column("deleted_at", sa.DateTime(timezone=True)), schema=SCHEMA)
    op.create_check_constraint(op.f("ck_jobs_deleted_shape"), "jobs", DELETED_SHAPE, schema=SCHEMA)
    op.create_index(
        "ix_jobs_user_status_newest",
        "jobs",
        ["user_id", "status", sa.text("created_at DESC"), sa.text("job_id DESC")],
        schema=SCHEMA,
        postgresql_where=sa.text("deleted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_user_status_newest", table_name="jobs", schema=SCHEMA)
    op.drop_constraint(op.f("ck_jobs_deleted_shape"), "jobs", type_="check", schema=SCHEMA)
    op.drop_column("jobs", "deleted_at", schema=SCHEMA)
