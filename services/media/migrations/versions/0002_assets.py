"""assets: every stored image, its life cycle enforced by CHECK constraints

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"

CHECKS = {
    "purpose_known": "purpose IN ('ai_input', 'ai_output')",
    "status_known": "status IN ('uploading', 'ready', 'deleted')",
    "content_type_known": "content_type IN ('image/jpeg', 'image/png', 'image/webp')",
    "owner_present": "length(owner_user_id) BETWEEN 1 AND 256",
    "key_from_ids": (
        "object_key ~ ('^' || purpose || '/[0-9]{4}/[0-9]{2}/' || asset_id::text || '$')"
    ),
    "declared_size_positive": "declared_size_bytes IS NULL OR declared_size_bytes > 0",
    "declared_sha256_hex": "declared_sha256 IS NULL OR declared_sha256 ~ '^[0-9a-f]{64}$'",
    "size_positive": "size_bytes IS NULL OR size_bytes > 0",
    "rejections_counted": "rejected_uploads >= 0",
    "sha256_hex": "sha256 IS NULL OR sha256 ~ '^[0-9a-f]{64}$'",
    "dimensions_positive": "(width IS NULL OR width > 0) AND (height IS NULL OR height > 0)",
    "facts_together": (
        "(size_bytes IS NULL AND sha256 IS NULL AND width IS NULL AND height IS NULL"
        " AND ready_at IS NULL)"
        " OR (size_bytes IS NOT NULL AND sha256 IS NOT NULL AND width IS NOT NULL"
        " AND height IS NOT NULL AND ready_at IS NOT NULL)"
    ),
    "uploading_has_expiry_and_no_facts": (
        "status <> 'uploading' OR (upload_expires_at IS NOT NULL AND ready_at IS NULL)"
    ),
    "ready_has_facts": "status <> 'ready' OR ready_at IS NOT NULL",
    "deleted_iff_deleted_at": "(status = 'deleted') = (deleted_at IS NOT NULL)",
    "ready_matches_declaration": (
        "ready_at IS NULL"
        " OR ((declared_size_bytes IS NULL OR declared_size_bytes = size_bytes)"
        " AND (declared_sha256 IS NULL OR declared_sha256 = sha256))"
    ),
}


def upgrade() -> None:
    op.create_table(
        "assets",
        sa.Column("asset_id", sa.Uuid(), nullable=False),
        sa.Column("owner_user_id", sa.Text(), nullable=False),
        sa.Column("purpose", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("content_type", sa.Text(), nullable=False),
        sa.Column("declared_size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("declared_sha256", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.Text(), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("rejected_uploads", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("upload_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        # op.f: the names are final; the naming convention must not prefix them again.
        *(
            sa.CheckConstraint(rule, name=op.f(f"ck_assets_{name}"))
            for name, rule in CHECKS.items()
        ),
        sa.PrimaryKeyConstraint("asset_id", name="pk_assets"),
        sa.UniqueConstraint("object_key", name="uq_assets_object_key"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_assets_upload_expiry",
        "assets",
        ["upload_expires_at"],
        schema=SCHEMA,
        postgresql_where=sa.text("status = 'uploading'"),
    )


def downgrade() -> None:
    op.drop_index("ix_assets_upload_expiry", table_name="assets", schema=SCHEMA)
    op.drop_table("assets", schema=SCHEMA)
