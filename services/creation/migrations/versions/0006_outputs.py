"""outputs become a list: jobs.num_outputs and jobs.outputs (asset ids) replace
jobs.output_asset_id; output_purges, filled by a trigger, lists what an attempt that ended
without success may have landed in media

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

# The shape rules as 0003 wrote them (one output) and as they are now (a list); history
# is frozen, so both are spelled out here.
OLD_SHAPES = {
    "queued_shape": (
        "status <> 'queued' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND output_asset_id IS NULL AND NOT cancel_requested)"
    ),
    "running_shape": (
        "status <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL AND completed_at IS NULL AND output_asset_id IS NULL AND step IS NOT NULL AND attempt >= 1 AND lease_epoch >= 1)"
    ),
    "succeeded_shape": (
        "status <> 'succeeded' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND started_at IS NOT NULL AND completed_at IS NOT NULL AND output_asset_id IS NOT NULL AND error_code IS NULL AND progress = 100)"
    ),
    "failed_shape": (
        "status <> 'failed' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND output_asset_id IS NULL AND error_code IS NOT NULL)"
    ),
    "cancelled_shape": (
        "status <> 'cancelled' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND output_asset_id IS NULL)"
    ),
    "attention_shape": (
        "status <> 'needs_attention' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND output_asset_id IS NULL AND error_code IS NOT NULL)"
    ),
}
NEW_SHAPES = {
    "queued_shape": (
        "status <> 'queued' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND cardinality(outputs) = 0 AND NOT cancel_requested)"
    ),
    "running_shape": (
        "status <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL AND completed_at IS NULL AND cardinality(outputs) = 0 AND step IS NOT NULL AND attempt >= 1 AND lease_epoch >= 1)"
    ),
    "succeeded_shape": (
        "status <> 'succeeded' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND started_at IS NOT NULL AND completed_at IS NOT NULL AND cardinality(outputs) = num_outputs AND error_code IS NULL AND progress = 100)"
    ),
    "failed_shape": (
        "status <> 'failed' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND cardinality(outputs) = 0 AND error_code IS NOT NULL)"
    ),
    "cancelled_shape": (
        "status <> 'cancelled' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NOT NULL AND cardinality(outputs) = 0)"
    ),
    "attention_shape": (
        "status <> 'needs_attention' OR (lease_owner IS NULL AND lease_expires_at IS NULL AND completed_at IS NULL AND cardinality(outputs) = 0 AND error_code IS NOT NULL)"
    ),
}


def _add_shapes(shapes: dict[str, str]) -> None:
    for name, rule in shapes.items():
        # op.f: the name is final; the naming convention must not prefix it again.
        op.create_check_constraint(op.f(f"ck_jobs_{name}"), "jobs", rule, schema=SCHEMA)


def _drop_shapes() -> None:
    for name in NEW_SHAPES:
        op.drop_constraint(op.f(f"ck_jobs_{name}"), "jobs", type_="check", schema=SCHEMA)


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("num_outputs", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        schema=SCHEMA,
    )
    op.add_column(
        "jobs",
        sa.Column(
            "outputs",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        schema=SCHEMA,
    )
    op.execute(
        "UPDATE creation.jobs SET outputs = ARRAY[output_asset_id::text]"
        " WHERE output_asset_id IS NOT NULL"
    )
    # The rules name output_asset_id: they go before it does.
    _drop_shapes()
    op.drop_column("jobs", "output_asset_id", schema=SCHEMA)
    _add_shapes(NEW_SHAPES)
    _add_shapes(
        {
            "num_outputs_range": "num_outputs BETWEEN 1 AND 4",
            "outputs_have_no_null": "array_position(outputs, NULL) IS NULL",
        }
    )
    op.create_table(
        "output_purges",
        sa.Column("job_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("num_outputs", sa.SmallInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["creation.jobs.job_id"], name=op.f("fk_output_purges_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="pk_output_purges"),
        schema=SCHEMA,
    )
    # An attempt that reached the provider (it has a request id) may have landed outputs
    # before it ended: when it ends without success (failed, cancelled — running, or
    # queued to resume —, needs attention, or queued for a fresh attempt, which drops the
    # request), what it may have landed is listed for deletion in the same transaction,
    # whoever wrote the change (worker, reaper, owner, operator). Handing back or resuming
    # keeps the request: the attempt goes on and lands onto the same assets. The WHEN
    # clause costs nothing on other updates.
    op.execute(
        """
        CREATE FUNCTION creation.list_output_purge() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO creation.output_purges
                (job_id, attempt, user_id, num_outputs, created_at)
            VALUES (OLD.job_id, OLD.attempt, OLD.user_id, OLD.num_outputs, now())
            ON CONFLICT DO NOTHING;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER jobs_attempt_unsuccessful AFTER UPDATE OF status ON creation.jobs"
        " FOR EACH ROW WHEN (OLD.provider_request_id IS NOT NULL"
        " AND (NEW.status IN ('failed', 'cancelled', 'needs_attention')"
        " OR NEW.provider_request_id IS NULL))"
        " EXECUTE FUNCTION creation.list_output_purge()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_attempt_unsuccessful ON creation.jobs")
    op.execute("DROP FUNCTION creation.list_output_purge()")
    op.drop_table("output_purges", schema=SCHEMA)
    for name in ("outputs_have_no_null", "num_outputs_range"):
        op.drop_constraint(op.f(f"ck_jobs_{name}"), "jobs", type_="check", schema=SCHEMA)
    _drop_shapes()
    op.add_column("jobs", sa.Column("output_asset_id", sa.UUID(as_uuid=False)), schema=SCHEMA)
    # A job of several outputs keeps its first: the old schema has room for one.
    op.execute("UPDATE creation.jobs SET output_asset_id = outputs[1]::uuid")
    op.drop_column("jobs", "outputs", schema=SCHEMA)
    op.drop_column("jobs", "num_outputs", schema=SCHEMA)
    _add_shapes(OLD_SHAPES)
