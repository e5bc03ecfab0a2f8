"""remote workers: remote_claims (a claim per pool and idempotency key, the token kept
as a hash) and remote_calls (the answers of the other job-changing calls, for replays)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"


def upgrade() -> None:
    op.create_table(
        "remote_claims",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=False), nullable=True),
        sa.Column("lease_generation", sa.BigInteger(), nullable=True),
        sa.Column("lease_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(job_id IS NULL) = (lease_generation IS NULL)",
            name=op.f("ck_remote_claims_claimed_shape"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            [f"{SCHEMA}.jobs.job_id"],
            name=op.f("fk_remote_claims_job_id_jobs"),
        ),
        sa.PrimaryKeyConstraint("pool", "request_id", name="pk_remote_claims"),
        sa.UniqueConstraint("token_hash", name="uq_remote_claims_token_hash"),
        schema=SCHEMA,
    )
    op.create_index("ix_remote_claims_created", "remote_claims", ["created_at"], schema=SCHEMA)
    op.create_table(
        "remote_calls",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            [f"{SCHEMA}.jobs.job_id"],
            name=op.f("fk_remote_calls_job_id_jobs"),
        ),
        sa.PrimaryKeyConstraint("pool", "request_id", name="pk_remote_calls"),
        schema=SCHEMA,
    )
    op.create_index("ix_remote_calls_created", "remote_calls", ["created_at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_index("ix_remote_calls_created", table_name="remote_calls", schema=SCHEMA)
    op.drop_table("remote_calls", schema=SCHEMA)
    op.drop_index("ix_remote_claims_created", table_name="remote_claims", schema=SCHEMA)
    op.drop_table("remote_claims", schema=SCHEMA)
