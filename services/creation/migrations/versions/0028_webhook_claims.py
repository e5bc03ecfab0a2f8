"""webhook claims per endpoint: the deliverer takes each enabled endpoint's due deliveries
in turn, up to its max_in_flight less those it has in flight, so one endpoint's backlog
never fills a batch others wait behind; these indexes make both looks cheap.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"


def upgrade() -> None:
    op.create_index(
        "ix_webhook_deliveries_endpoint_due",
        "webhook_deliveries",
        ["endpoint_id", "next_attempt_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_webhook_deliveries_in_flight",
        "webhook_deliveries",
        ["endpoint_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("claimed_until IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_in_flight", "webhook_deliveries", schema=SCHEMA)
    op.drop_index("ix_webhook_deliveries_endpoint_due", "webhook_deliveries", schema=SCHEMA)
