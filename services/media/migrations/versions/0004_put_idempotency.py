"""assets.idempotency_key: a calling service's key that makes PutAsset repeatable

One asset per (owner, key), deleted ones included: a worker that dies after landing an
output and resumes lands onto the same asset, and a key whose asset was removed never
brings a live asset back.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"


def upgrade() -> None:
    op.add_column("assets", sa.Column("idempotency_key", sa.Text()), schema=SCHEMA)
    # op.f: the name is final; the naming convention must not prefix it again.
    op.create_check_constraint(
        op.f("ck_assets_idempotency_key_shape"),
        "assets",
        "idempotency_key IS NULL OR (declared_size_bytes IS NULL"
        " AND idempotency_key ~ '^[A-Za-z0-9._:-]{1,200}$')",
        schema=SCHEMA,
    )
    op.create_index(
        "uq_assets_owner_idempotency_key",
        "assets",
        ["owner_user_id", "idempotency_key"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_assets_owner_idempotency_key", table_name="assets", schema=SCHEMA)
    op.drop_constraint(
        op.f("ck_assets_idempotency_key_shape"), "assets", type_="check", schema=SCHEMA
    )
    op.drop_column("assets", "idempotency_key", schema=SCHEMA)
