"""an index for pruning delivered outbox rows

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The relay prunes delivered rows oldest first; without this it would scan the table.
    op.create_index(
        "ix_outbox_delivered",
        "outbox",
        ["delivered_at"],
        unique=False,
        schema="creation",
        postgresql_where=sa.text("delivered_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_outbox_delivered",
        table_name="outbox",
        schema="creation",
        postgresql_where=sa.text("delivered_at IS NOT NULL"),
    )
