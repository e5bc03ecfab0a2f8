"""an operator's grant names the operator identity that made it
(points_ledger.granted_by, from ATELIER_SERVICE_IDENTITIES); nullable, no default: adding
it rewrites nothing, and earlier grants (and the welcome, and job entries) name nobody.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"


def upgrade() -> None:
    op.add_column("points_ledger", sa.Column("granted_by", sa.Text()), schema=SCHEMA)


def downgrade() -> None:
    op.drop_column("points_ledger", "granted_by", schema=SCHEMA)
