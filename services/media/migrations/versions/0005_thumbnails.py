"""assets.thumbnail_content_type: a generated output's thumbnail, stored beside its object

The thumbnail's key is derived (the object key + ".thumb"), so only its presence and type
are recorded; rows from before have none (their outputs are answered without a preview).

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

SCHEMA = "media"
CHECKS = {
    "ck_assets_thumbnail_content_type_known": (
        "thumbnail_content_type IS NULL OR thumbnail_content_type IN ('image/webp', 'image/jpeg')"
    ),
    "ck_assets_thumbnail_only_when_ready": (
        "thumbnail_content_type IS NULL OR ready_at IS NOT NULL"
    ),
}


def upgrade() -> None:
    op.add_column("assets", sa.Column("thumbnail_content_type", sa.Text()), schema=SCHEMA)
    for name, rule in CHECKS.items():
        # op.f: the name is final; the naming convention must not prefix it again.
        op.create_check_constraint(op.f(name), "assets", rule, schema=SCHEMA)


def downgrade() -> None:
    for name in CHECKS:
        op.drop_constraint(op.f(name), "assets", type_="check", schema=SCHEMA)
    op.drop_column("assets", "thumbnail_content_type", schema=SCHEMA)
