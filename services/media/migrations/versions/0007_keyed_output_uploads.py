"""assets.idempotency_key on uploads too: a remote worker's outputs are reserved under the
server's key (job, attempt, index) with their size and hash declared, and uploaded with a
presigned PUT, so a keyed asset may now declare a size. Only the server keys (PutAsset and
ReserveOutputUpload on the internal listener); a client's uploads keep upload_request_id.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "media"
NAME = "ck_assets_idempotency_key_shape"


def upgrade() -> None:
    # op.f: the name is final; the naming convention must not prefix it again.
    op.drop_constraint(op.f(NAME), "assets", type_="check", schema=SCHEMA)
    op.create_check_constraint(
        op.f(NAME),
        "assets",
        "idempotency_key IS NULL OR idempotency_key ~ '^[A-Za-z0-9._:-]{1,200}$'",
        schema=SCHEMA,
    )


def downgrade() -> None:
    # Keyed uploads cannot be kept under the older rule: their rows go (objects stay).
    op.execute(
        "DELETE FROM media.assets"
        " WHERE idempotency_key IS NOT NULL AND declared_size_bytes IS NOT NULL"
    )
    op.drop_constraint(op.f(NAME), "assets", type_="check", schema=SCHEMA)
    op.create_check_constraint(
        op.f(NAME),
        "assets",
        "idempotency_key IS NULL OR (declared_size_bytes IS NULL"
        " AND idempotency_key ~ '^[A-Za-z0-9._:-]{1,200}$')",
        schema=SCHEMA,
    )
