"""the operators' list of failed pushes (NotifyAdminService.ListFailedPushes): a partial
index on the pushes given up on, or dropped for a device token APNs refused, newest first.
Few rows match, so the index stays small however many pushes were sent.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As services/notify/tables.py states it (a migration imports none of our code).
FAILED_PUSH = "status = 'failed' OR (status = 'dropped' AND last_reason = 'BadDeviceToken')"


def upgrade() -> None:
    op.create_index(
        "ix_pushes_created_at_push_id_failed",
        "pushes",
        ["created_at", "push_id"],
        schema="notify",
        postgresql_where=sa.text(FAILED_PUSH),
    )


def downgrade() -> None:
    op.drop_index("ix_pushes_created_at_push_id_failed", table_name="pushes", schema="notify")
