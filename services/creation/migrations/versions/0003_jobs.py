"""jobs, events, outbox and points ledger

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


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("model_id", sa.Text(), nullable=False),
        sa.Column("style_id", sa.Text(), nullable=False),
        sa.Column("provider_code", sa.Text(), nullable=False),
        sa.Column("provider_model", sa.Text(), nullable=False),
        sa.Column("price_points", sa.BigInteger(), nullable=False),
        sa.Column("input_asset_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("negative_prompt", sa.Text(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column(
            "parameters",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("progress", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("step", sa.Text(), nullable=True),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("provider_request_id", sa.Text(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("output_asset_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "jsonb_typeof(parameters) = 'object'", name=op.f("ck_jobs_parameters_object")
        ),
        sa.CheckConstraint(
            "provider_request_id IS NULL OR coalesce(step IN ('generating', 'storing', 'done'), false)",
            name=op.f("ck_jobs_request_after_submit"),
        ),
        sa.CheckConstraint(
            "status <> 'cancelled' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND output_asset_id IS NULL)",
            name=op.f("ck_jobs_cancelled_shape"),
        ),
        sa.CheckConstraint(
            "status <> 'failed' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND output_asset_id IS NULL AND error_code IS NOT NULL)",
            name=op.f("ck_jobs_failed_shape"),
        ),
        sa.CheckConstraint(
            "status <> 'needs_attention' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND output_asset_id IS NULL AND error_code IS NOT NULL)",
            name=op.f("ck_jobs_attention_shape"),
        ),
        sa.CheckConstraint(
            "status <> 'queued' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND output_asset_id IS NULL AND NOT cancel_requested)",
            name=op.f("ck_jobs_queued_shape"),
        ),
        sa.CheckConstraint(
            "status <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL AND completed_at IS NULL AND output_asset_id IS NULL AND step IS NOT NULL AND attempt >= 1 AND lease_epoch >= 1)",
            name=op.f("ck_jobs_running_shape"),
        ),
        sa.CheckConstraint(
            "status <> 'succeeded' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND started_at IS NOT NULL AND completed_at IS NOT NULL AND output_asset_id IS NOT NULL AND error_code IS NULL AND progress = 100)",
            name=op.f("ck_jobs_succeeded_shape"),
        ),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'needs_attention')",
            name=op.f("ck_jobs_status_known"),
        ),
        sa.CheckConstraint(
            "step IS NULL OR step IN ('preparing', 'submitting', 'generating', 'storing', 'done')",
            name=op.f("ck_jobs_step_known"),
        ),
        sa.CheckConstraint(
            "provider_request_id IS NULL OR attempt >= 1", name=op.f("ck_jobs_request_has_attempt")
        ),
        sa.CheckConstraint(
            "attempt >= 0 AND attempt <= max_attempts", name=op.f("ck_jobs_attempts_bounded")
        ),
        sa.CheckConstraint(
            "completed_at IS NULL OR completed_at >= created_at",
            name=op.f("ck_jobs_completed_after_created"),
        ),
        sa.CheckConstraint(
            "idempotency_key IS NULL OR length(request_hash) = 64",
            name=op.f("ck_jobs_key_has_hash"),
        ),
        sa.CheckConstraint(
            "max_attempts BETWEEN 1 AND 100", name=op.f("ck_jobs_max_attempts_range")
        ),
        sa.CheckConstraint("price_points >= 0", name=op.f("ck_jobs_price_not_negative")),
        sa.CheckConstraint("progress BETWEEN 0 AND 100", name=op.f("ck_jobs_progress_percent")),
        sa.CheckConstraint(
            "started_at IS NULL OR started_at >= created_at",
            name=op.f("ck_jobs_started_after_created"),
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_jobs_version_positive")),
        sa.CheckConstraint(
            "width BETWEEN 64 AND 2048 AND height BETWEEN 64 AND 2048", name=op.f("ck_jobs_size")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["creation.models.model_id"], name=op.f("fk_jobs_model_id_models")
        ),
        sa.ForeignKeyConstraint(
            ["style_id"], ["creation.styles.style_id"], name=op.f("fk_jobs_style_id_styles")
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("user_id", "idempotency_key", name="uq_jobs_user_idempotency_key"),
        schema="creation",
    )
    op.create_index(
        "ix_jobs_claim_queue",
        "jobs",
        [sa.literal_column("priority DESC"), "next_attempt_at", "created_at"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_jobs_lease_expiry",
        "jobs",
        ["lease_expires_at"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_jobs_needs_attention",
        "jobs",
        ["updated_at", "job_id"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("status = 'needs_attention'"),
    )
    op.create_index(
        "ix_jobs_user_in_flight",
        "jobs",
        ["user_id"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )
    op.create_index(
        "ix_jobs_user_newest",
        "jobs",
        ["user_id", sa.literal_column("created_at DESC"), sa.literal_column("job_id DESC")],
        unique=False,
        schema="creation",
    )
    op.create_table(
        "job_events",
        sa.Column("event_id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("from_status", sa.Text(), nullable=True),
        sa.Column("to_status", sa.Text(), nullable=False),
        sa.Column("actor_kind", sa.Text(), nullable=False),
        sa.Column("actor_id", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "actor_kind IN ('user', 'worker', 'reaper', 'operator')",
            name=op.f("ck_job_events_actor_known"),
        ),
        sa.CheckConstraint(
            "to_status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'needs_attention')",
            name=op.f("ck_job_events_to_status_known"),
        ),
        sa.CheckConstraint(
            "from_status IS NULL OR from_status <> to_status",
            name=op.f("ck_job_events_is_a_change"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["creation.jobs.job_id"], name=op.f("fk_job_events_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_job_events")),
        sa.UniqueConstraint("job_id", "version", name="uq_job_events_job_id_version"),
        schema="creation",
    )
    op.create_table(
        "outbox",
        sa.Column("outbox_id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["creation.jobs.job_id"], name=op.f("fk_outbox_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("outbox_id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("job_id", "version", name="uq_outbox_job_id_version"),
        schema="creation",
    )
    op.create_index(
        "ix_outbox_undelivered",
        "outbox",
        ["outbox_id"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("delivered_at IS NULL"),
    )
    op.create_table(
        "points_ledger",
        sa.Column("entry_id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("job_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("grant_key", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(kind = 'grant') = (job_id IS NULL) AND (kind = 'grant') = (grant_key IS NOT NULL)",
            name=op.f("ck_points_ledger_grant_shape"),
        ),
        sa.CheckConstraint(
            "kind IN ('reserve', 'capture', 'release', 'grant')",
            name=op.f("ck_points_ledger_kind_known"),
        ),
        sa.CheckConstraint("amount >= 0", name=op.f("ck_points_ledger_amount_not_negative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["creation.jobs.job_id"], name=op.f("fk_points_ledger_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("entry_id", name=op.f("pk_points_ledger")),
        sa.UniqueConstraint("job_id", "kind", name="uq_points_ledger_job_id_kind"),
        sa.UniqueConstraint("user_id", "grant_key", name="uq_points_ledger_user_id_grant_key"),
        schema="creation",
    )
    op.create_index(
        "ix_points_ledger_user",
        "points_ledger",
        ["user_id", "kind"],
        unique=False,
        schema="creation",
    )

    # Every insert into the outbox wakes the relay (LISTEN creation_outbox) at commit.
    op.execute(
        """
        CREATE FUNCTION creation.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('creation_outbox', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON creation.outbox"
        " FOR EACH STATEMENT EXECUTE FUNCTION creation.notify_outbox()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON creation.outbox")
    op.execute("DROP FUNCTION creation.notify_outbox()")
    op.drop_index("ix_points_ledger_user", table_name="points_ledger", schema="creation")
    op.drop_table("points_ledger", schema="creation")
    op.drop_index(
        "ix_outbox_undelivered",
        table_name="outbox",
        schema="creation",
        postgresql_where=sa.text("delivered_at IS NULL"),
    )
    op.drop_table("outbox", schema="creation")
    op.drop_table("job_events", schema="creation")
    op.drop_index("ix_jobs_user_newest", table_name="jobs", schema="creation")
    op.drop_index("ix_jobs_user_in_flight", table_name="jobs", schema="creation")
    op.drop_index(
        "ix_jobs_needs_attention",
        table_name="jobs",
        schema="creation",
        postgresql_where=sa.text("status = 'needs_attention'"),
    )
    op.drop_index(
        "ix_jobs_lease_expiry",
        table_name="jobs",
        schema="creation",
        postgresql_where=sa.text("status = 'running'"),
    )
    op.drop_index(
        "ix_jobs_claim_queue",
        table_name="jobs",
        schema="creation",
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.drop_table("jobs", schema="creation")
