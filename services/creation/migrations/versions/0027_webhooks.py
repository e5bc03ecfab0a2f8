"""webhooks: endpoints (registered by operators, or made for one job by a trusted
caller's submit), the per-identity keys that sign per-job webhooks, and one delivery
row per (endpoint, event), written by the job change triggers (sql/job_changes.sql) in
the change's own transaction, so a job change and its deliveries commit together. Row
triggers wake the deliverers (LISTEN creation_webhooks) at the commit of new deliveries
and of a finished delivery made pending again.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-03
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

EVENT_TYPES = (
    "'job.queued', 'job.running', 'job.succeeded', 'job.failed', 'job.cancelled',"
    " 'job.needs_attention', 'job.deleted', 'job.progress'"
)

# The deliverers' wake-up, bounded as the outbox's is (migration 0024): a commit stuck
# behind PostgreSQL's notification queue ends by the statement timeout, not lock_timeout.
WAKE = """
    IF current_setting('statement_timeout') <> '0' THEN
        PERFORM set_config('lock_timeout', '0', true);
    END IF;
    PERFORM pg_notify('creation_webhooks', '');"""


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (0018's reader, copied: a migration imports
    nothing, not even another migration)."""
    found: list[str] = []
    lines: list[str] = []
    quoted = False
    for line in script.splitlines():
        lines.append(line)
        code = line.strip()
        if code.startswith("--"):
            continue
        quoted ^= code.count("$$") % 2 == 1
        if not quoted and code.endswith(";"):
            found.append("\n".join(lines).strip())
            lines = []
    if quoted or any(line.strip() and not line.strip().startswith("--") for line in lines):
        raise ValueError("the script ends inside a statement (a missing ';' or '$$')")
    return found


def _load(path: Path) -> None:
    for statement in statements(path.read_text()):
        op.execute(statement)


def _times() -> list[sa.Column[object]]:
    return [
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("endpoint_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("event_types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "user_ids", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column(
            "model_ids", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column("job_id", postgresql.UUID(as_uuid=False), nullable=True),
        sa.Column("signing_owner", sa.Text(), nullable=True),
        sa.Column("secret", sa.Text(), nullable=True),
        sa.Column("previous_secret", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("disabled_reason", sa.Text(), server_default="", nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_in_flight", sa.Integer(), server_default=sa.text("8"), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        *_times(),
        sa.CheckConstraint(
            "(job_id IS NULL) = (secret IS NOT NULL)",
            name=op.f("ck_webhook_endpoints_secret_or_job"),
        ),
        sa.CheckConstraint(
            "(job_id IS NULL) = (signing_owner IS NULL)",
            name=op.f("ck_webhook_endpoints_signing_owner_per_job"),
        ),
        sa.CheckConstraint(
            "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
            name=op.f("ck_webhook_endpoints_previous_secret_expires"),
        ),
        sa.CheckConstraint(
            f"event_types <@ ARRAY[{EVENT_TYPES}]::text[] AND cardinality(event_types) > 0",
            name=op.f("ck_webhook_endpoints_event_types_known"),
        ),
        sa.CheckConstraint(
            "disabled_reason IN ('', 'operator', 'gone', 'failing')",
            name=op.f("ck_webhook_endpoints_disabled_reason_known"),
        ),
        sa.CheckConstraint(
            "enabled = (disabled_reason = '')", name=op.f("ck_webhook_endpoints_disabled_says_why")
        ),
        sa.CheckConstraint(
            "max_in_flight BETWEEN 1 AND 1000",
            name=op.f("ck_webhook_endpoints_max_in_flight_range"),
        ),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("pk_webhook_endpoints")),
        schema=SCHEMA,
    )
    op.create_index("ix_webhook_endpoints_job_id", "webhook_endpoints", ["job_id"], schema=SCHEMA)
    op.create_table(
        "webhook_signing_keys",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("previous_secret", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
        *_times(),
        sa.CheckConstraint(
            "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
            name=op.f("ck_webhook_signing_keys_previous_secret_expires"),
        ),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_webhook_signing_keys")),
        schema=SCHEMA,
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column(
            "message_id",
            sa.Text(),
            server_default=sa.text("'msg_' || replace(gen_random_uuid()::text, '-', '')"),
            nullable=False,
        ),
        sa.Column("endpoint_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("job_id", postgresql.UUID(as_uuid=False), nullable=True),
        sa.Column("user_id", sa.Text(), nullable=True),
        sa.Column("job_version", sa.BigInteger(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), server_default="", nullable=False),
        sa.Column("last_response_excerpt", sa.Text(), server_default="", nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'succeeded', 'failed')",
            name=op.f("ck_webhook_deliveries_state_known"),
        ),
        sa.CheckConstraint(
            f"event_type IN ({EVENT_TYPES}, 'webhook.test')",
            name=op.f("ck_webhook_deliveries_event_type_known"),
        ),
        sa.CheckConstraint(
            "(state = 'pending') = (completed_at IS NULL)",
            name=op.f("ck_webhook_deliveries_completed_shape"),
        ),
        sa.CheckConstraint(
            "char_length(last_response_excerpt) <= 256",
            name=op.f("ck_webhook_deliveries_excerpt_short"),
        ),
        sa.CheckConstraint(
            "attempts >= 0", name=op.f("ck_webhook_deliveries_attempts_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            [f"{SCHEMA}.webhook_endpoints.endpoint_id"],
            name=op.f("fk_webhook_deliveries_endpoint_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("delivery_id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("message_id", name="uq_webhook_deliveries_message_id"),
        sa.UniqueConstraint(
            "endpoint_id",
            "job_id",
            "job_version",
            "event_type",
            name="uq_webhook_deliveries_endpoint_id_job_id_job_version_event_type",
        ),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"], schema=SCHEMA)
    op.create_index(
        "ix_webhook_deliveries_endpoint_id_delivery_id",
        "webhook_deliveries",
        ["endpoint_id", "delivery_id"],
        schema=SCHEMA,
    )
    # Wake-ups, at commit (PostgreSQL folds a transaction's equal notifications into one):
    # each new delivery, and a finished one made pending again (a redelivery). Row
    # triggers: a job change's insert that finds no endpoint writes no row and costs none.
    op.execute(
        f"""
        CREATE FUNCTION creation.notify_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN{WAKE}
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER webhook_deliveries_inserted AFTER INSERT ON creation.webhook_deliveries"
        " FOR EACH ROW EXECUTE FUNCTION creation.notify_webhooks()"
    )
    op.execute(
        "CREATE TRIGGER webhook_deliveries_redelivered AFTER UPDATE OF state"
        " ON creation.webhook_deliveries FOR EACH ROW"
        " WHEN (NEW.state = 'pending' AND OLD.state <> 'pending')"
        " EXECUTE FUNCTION creation.notify_webhooks()"
    )
    _load(FROZEN / "job_changes_0027.sql")


def downgrade() -> None:
    _load(FROZEN / "job_changes_0025.sql")
    op.execute("DROP TRIGGER webhook_deliveries_redelivered ON creation.webhook_deliveries")
    op.execute("DROP TRIGGER webhook_deliveries_inserted ON creation.webhook_deliveries")
    op.execute("DROP FUNCTION creation.notify_webhooks()")
    op.drop_table("webhook_deliveries", schema=SCHEMA)
    op.drop_table("webhook_signing_keys", schema=SCHEMA)
    op.drop_index("ix_webhook_endpoints_job_id", table_name="webhook_endpoints", schema=SCHEMA)
    op.drop_table("webhook_endpoints", schema=SCHEMA)
