"""assets.upload_request_id: a client's request_id that makes CreateUpload repeatable

One asset per (owner, request id), deleted ones included: a replay while the upload is
open gets the same asset, and a key whose upload expired or was deleted never makes a
second asset. Kept apart from PutAsset's idempotency_key, so that a key a client chooses
can never name an output the server stored under its own key.

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"


def upgrade() -> None:
    op.add_column("assets", sa.Column("upload_request_id", sa.Text()), schema=SCHEMA)
    # op.f: the name is final; the naming convention must not prefix it again.
    op.create_check_constraint(
        op.f("ck_assets_upload_request_id_shape"),
        "assets",
        "upload_request_id IS NULL OR (purpose = 'ai_input' AND declared_size_bytes IS NOT NULL"
        " AND upload_request_id ~ '^[A-Za-z0-9._:-]{1,128}$')",
        schema=SCHEMA,
    )
    op.create_index(
        "uq_assets_owner_upload_request_id",
        "assets",
        ["owner_user_id", "upload_request_id"],
        unique=True,
        schema=SCHEMA,
        postgresql_where=sa.text("upload_request_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_assets_owner_upload_request_id", table_name="assets", schema=SCHEMA)
    op.drop_constraint(
        op.f("ck_assets_upload_request_id_shape"), "assets", type_="check", schema=SCHEMA
    )
    op.drop_column("assets", "upload_request_id", schema=SCHEMA)
