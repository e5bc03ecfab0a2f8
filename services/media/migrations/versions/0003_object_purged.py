"""assets.object_purged_at: when housekeeping last removed a deleted asset's object for good

Until then the row is watched: an object that appears for it (a crash before the delete, a
presigned S3 upload that outlived the deletion) is removed again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"


def upgrade() -> None:
    op.add_column(
        "assets", sa.Column("object_purged_at", sa.DateTime(timezone=True)), schema=SCHEMA
    )
    # op.f: the name is final; the naming convention must not prefix it again.
    op.create_check_constraint(
        op.f("ck_assets_purged_only_when_deleted"),
        "assets",
        "object_purged_at IS NULL OR status = 'deleted'",
        schema=SCHEMA,
    )
    op.create_index(
        "ix_assets_unpurged",
        "assets",
        ["asset_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'deleted' AND object_purged_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_assets_unpurged", table_name="assets", schema=SCHEMA)
    op.drop_constraint(
        op.f("ck_assets_purged_only_when_deleted"), "assets", type_="check", schema=SCHEMA
    )
    op.drop_column("assets", "object_purged_at", schema=SCHEMA)
