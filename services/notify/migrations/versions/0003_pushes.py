"""APNs: the push tokens users register, the pushes planned from job updates, and the
record of every attempt to send one

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UUID = postgresql.UUID(as_uuid=False)
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "push_tokens",
        sa.Column("token_id", _UUID, nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("environment", sa.Text(), nullable=False),
        sa.Column("bundle_id", sa.Text(), nullable=False),
        sa.Column("locale", sa.Text(), server_default="en", nullable=False),
        sa.Column("job_id", _UUID, nullable=True),
        sa.Column("activity_id", sa.Text(), nullable=True),
        sa.Column("device_id", _UUID, nullable=True),
        sa.Column("status", sa.Text(), server_default="active", nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("created_at", _TIME, server_default=sa.text("now()"), nullable=False),
        sa.Column("registered_at", _TIME, nullable=False),
        sa.Column("retired_at", _TIME, nullable=True),
        sa.CheckConstraint(
            "kind IN ('device', 'activity', 'push_to_start')", name=op.f("ck_push_tokens_kind")
        ),
        sa.CheckConstraint(
            "environment IN ('sandbox', 'production')", name=op.f("ck_push_tokens_environment")
        ),
        sa.CheckConstraint(
            "status IN ('active', 'retired', 'bad')", name=op.f("ck_push_tokens_status")
        ),
        sa.CheckConstraint(
            "token ~ '^([0-9a-f]{2}){32,100}$'", name=op.f("ck_push_tokens_token_hex")
        ),
        sa.CheckConstraint(
            "(kind = 'activity') = (job_id IS NOT NULL AND activity_id IS NOT NULL)",
            name=op.f("ck_push_tokens_activity_fields"),
        ),
        sa.CheckConstraint(
            "kind = 'device' OR device_id IS NOT NULL", name=op.f("ck_push_tokens_device")
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["notify.push_tokens.token_id"],
            name=op.f("fk_push_tokens_device_id_push_tokens"),
        ),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_push_tokens")),
        schema="notify",
    )
    op.create_index(
        "uq_push_tokens_kind_token_job",
        "push_tokens",
        ["kind", "token", sa.text("coalesce(job_id, '00000000-0000-0000-0000-000000000000')")],
        unique=True,
        schema="notify",
    )
    op.create_index(
        "ix_push_tokens_user_id_active",
        "push_tokens",
        ["user_id"],
        postgresql_where=sa.text("status = 'active'"),
        schema="notify",
    )
    op.create_index(
        "ix_push_tokens_job_id_activity_active",
        "push_tokens",
        ["job_id"],
        postgresql_where=sa.text("kind = 'activity' AND status = 'active'"),
        schema="notify",
    )
    op.create_index("ix_push_tokens_device_id", "push_tokens", ["device_id"], schema="notify")
    op.create_table(
        "pushes",
        sa.Column("push_id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("token_id", _UUID, nullable=False),
        sa.Column("job_id", _UUID, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("expires_at", _TIME, nullable=True),
        sa.Column("collapse_id", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", _TIME, nullable=False),
        sa.Column("apns_id", sa.Text(), nullable=True),
        sa.Column("last_http_status", sa.Integer(), nullable=True),
        sa.Column("last_reason", sa.Text(), nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("sent_at", _TIME, nullable=True),
        sa.CheckConstraint(
            "kind IN ('alert', 'la_start', 'la_update', 'la_end')", name=op.f("ck_pushes_kind")
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'sent', 'failed', 'dropped')", name=op.f("ck_pushes_status")
        ),
        sa.CheckConstraint("priority IN (1, 5, 10)", name=op.f("ck_pushes_priority")),
        sa.CheckConstraint(
            "octet_length(collapse_id) <= 64", name=op.f("ck_pushes_collapse_id_length")
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["notify.push_tokens.token_id"],
            name=op.f("fk_pushes_token_id_push_tokens"),
        ),
        sa.PrimaryKeyConstraint("push_id", name=op.f("pk_pushes")),
        sa.UniqueConstraint(
            "token_id",
            "job_id",
            "version",
            "kind",
            name=op.f("uq_pushes_token_id_job_id_version_kind"),
        ),
        schema="notify",
    )
    op.create_index(
        "ix_pushes_next_attempt_at_pending",
        "pushes",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
        schema="notify",
    )
    op.create_table(
        "push_attempts",
        sa.Column("exchange_id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("push_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("apns_id", sa.Text(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", _TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["push_id"], ["notify.pushes.push_id"], name=op.f("fk_push_attempts_push_id_pushes")
        ),
        sa.PrimaryKeyConstraint("exchange_id", name=op.f("pk_push_attempts")),
        schema="notify",
    )
    op.create_index(
        "ix_push_attempts_push_id", "push_attempts", ["push_id"], unique=False, schema="notify"
    )


def downgrade() -> None:
    op.drop_index("ix_push_attempts_push_id", table_name="push_attempts", schema="notify")
    op.drop_table("push_attempts", schema="notify")
    op.drop_index("ix_pushes_next_attempt_at_pending", table_name="pushes", schema="notify")
    op.drop_table("pushes", schema="notify")
    op.drop_index("ix_push_tokens_device_id", table_name="push_tokens", schema="notify")
    op.drop_index(
        "ix_push_tokens_job_id_activity_active", table_name="push_tokens", schema="notify"
    )
    op.drop_index("ix_push_tokens_user_id_active", table_name="push_tokens", schema="notify")
    op.drop_index("uq_push_tokens_kind_token_job", table_name="push_tokens", schema="notify")
    op.drop_table("push_tokens", schema="notify")
