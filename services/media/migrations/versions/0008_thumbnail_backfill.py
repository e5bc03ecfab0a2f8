"""assets.thumbnail_claimed_at, assets.thumbnail_failure: housekeeping's thumbnail backfill

Outputs stored before 0005 have no thumbnail; housekeeping makes them in small batches.
A replica claims a batch by stamping thumbnail_claimed_at (others skip it until the claim
is old), so no row lock is held while an image is read and decoded. An object that cannot
give a thumbnail (gone, or not an image Pillow reads) is marked with thumbnail_failure and
never tried again.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"
CHECKS = {
    "ck_assets_thumbnail_failure_known": (
        "thumbnail_failure IS NULL OR thumbnail_failure IN ('object_missing', 'not_decodable')"
    ),
    "ck_assets_thumbnail_or_failure": (
        "thumbnail_failure IS NULL OR thumbnail_content_type IS NULL"
    ),
}
INDEX = "ix_assets_thumbnail_backlog"


def upgrade() -> None:
    op.add_column(
        "assets", sa.Column("thumbnail_claimed_at", sa.DateTime(timezone=True)), schema=SCHEMA
    )
    op.add_column("assets", sa.Column("thumbnail_failure", sa.Text()), schema=SCHEMA)
    for name, rule in CHECKS.items():
        # op.f: the name is final; the naming convention must not prefix it again.
        op.create_check_constraint(op.f(name), "assets", rule, schema=SCHEMA)
    op.create_index(
        INDEX,
        "assets",
        ["asset_id"],
        schema=SCHEMA,
        postgresql_where=sa.text(
            "status = 'ready' AND purpose = 'ai_output'"
            " AND thumbnail_content_type IS NULL AND thumbnail_failure IS NULL"
        ),
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="assets", schema=SCHEMA)
    for name in CHECKS:
        op.drop_constraint(op.f(name), "assets", type_="check", schema=SCHEMA)
    op.drop_column("assets", "thumbnail_failure", schema=SCHEMA)
    op.drop_column("assets", "thumbnail_claimed_at", schema=SCHEMA)
