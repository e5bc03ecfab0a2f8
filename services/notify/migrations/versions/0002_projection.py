"""the job state projection: the latest state of every job, and its change cursor

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("change_seq", schema="notify")))
    op.create_table(
        "job_states",
        sa.Column("job_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("terminal", sa.Boolean(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column(
            "seq",
            sa.BigInteger(),
            server_default=sa.text("nextval('notify.change_seq')"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_states")),
        schema="notify",
    )
    op.create_index("ix_job_states_user_id_seq", "job_states", ["user_id", "seq"], schema="notify")
    op.create_index("ix_job_states_seq", "job_states", ["seq"], schema="notify")


def downgrade() -> None:
    op.drop_index("ix_job_states_seq", table_name="job_states", schema="notify")
    op.drop_index("ix_job_states_user_id_seq", table_name="job_states", schema="notify")
    op.drop_table("job_states", schema="notify")
    op.execute(sa.schema.DropSequence(sa.Sequence("change_seq", schema="notify")))
