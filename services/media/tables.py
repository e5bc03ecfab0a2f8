"""The media schema as SQLAlchemy Core tables: what the migrations build, and what the
store queries. A migration test checks that the two agree.

The CHECK constraints are the asset life cycle written down where nothing can bypass it:
an uploading asset has no measured facts, a ready one has all of them, a deleted one has
its deletion time, and an object key is always ``<purpose>/<yyyy>/<mm>/<asset_id>``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    text,
)

from services.kit.db import NAMING_CONVENTION

SCHEMA = "media"

metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)

# Named rules; migrations spell them out as they were when written (history is frozen).
CHECKS: dict[str, str] = {
    "purpose_known": "purpose IN ('ai_input', 'ai_output')",
    "status_known": "status IN ('uploading', 'ready', 'deleted')",
    "content_type_known": "content_type IN ('image/jpeg', 'image/png', 'image/webp')",
    "owner_present": "length(owner_user_id) BETWEEN 1 AND 256",
    # purpose and asset_id are constrained above, so both are safe inside the pattern.
    "key_from_ids": (
        "object_key ~ ('^' || purpose || '/[0-9]{4}/[0-9]{2}/' || asset_id::text || '$')"
    ),
    "declared_size_positive": "declared_size_bytes IS NULL OR declared_size_bytes > 0",
    "declared_sha256_hex": "declared_sha256 IS NULL OR declared_sha256 ~ '^[0-9a-f]{64}$'",
    "size_positive": "size_bytes IS NULL OR size_bytes > 0",
    "rejections_counted": "rejected_uploads >= 0",
    "sha256_hex": "sha256 IS NULL OR sha256 ~ '^[0-9a-f]{64}$'",
    "dimensions_positive": "(width IS NULL OR width > 0) AND (height IS NULL OR height > 0)",
    # All measured facts arrive together, with the ready time, or not at all.
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
    "purged_only_when_deleted": "object_purged_at IS NULL OR status = 'deleted'",
    # Server puts only (they never carry a declared size); printable, bounded.
    # A thumbnail (stored under the object key + ".thumb") comes only with a ready image.
    "thumbnail_content_type_known": (
        "thumbnail_content_type IS NULL OR thumbnail_content_type IN ('image/webp', 'image/jpeg')"
    ),
    "thumbnail_only_when_ready": "thumbnail_content_type IS NULL OR ready_at IS NOT NULL",
    # Why housekeeping's backfill could make no thumbnail (never tried again); never both.
    "thumbnail_failure_known": (
        "thumbnail_failure IS NULL OR thumbnail_failure IN ('object_missing', 'not_decodable')"
    ),
    "thumbnail_or_failure": "thumbnail_failure IS NULL OR thumbnail_content_type IS NULL",
    # The server's keys: PutAsset's, and the output uploads it reserves (with a size).
    "idempotency_key_shape": (
        "idempotency_key IS NULL OR idempotency_key ~ '^[A-Za-z0-9._:-]{1,200}$'"
    ),
    # Client uploads only (they always declare a size); the kit's idempotency key rule.
    "upload_request_id_shape": (
        "upload_request_id IS NULL OR (purpose = 'ai_input' AND declared_size_bytes IS NOT NULL"
        " AND upload_request_id ~ '^[A-Za-z0-9._:-]{1,128}$')"
    ),
}

assets = Table(
    "assets",
    metadata,
    Column("asset_id", Uuid, primary_key=True),
    Column("owner_user_id", Text, nullable=False),
    Column("purpose", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("content_type", Text, nullable=False),
    # What a client promised in CreateUpload; CompleteUpload holds the bytes to it.
    Column("declared_size_bytes", BigInteger),
    Column("declared_sha256", Text),
    # What media measured, once ready.
    Column("size_bytes", BigInteger),
    Column("sha256", Text),
    Column("width", Integer),
    Column("height", Integer),
    # Bytes refused by CompleteUpload so far. Rejecting (and deleting the object) and
    # completing are both conditional on it: a check that read bytes since replaced can
    # neither delete the new upload nor make the asset ready.
    Column("rejected_uploads", Integer, nullable=False, server_default=text("0")),
    Column("object_key", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Past this, an upload that is not ready is removed by housekeeping.
    Column("upload_expires_at", DateTime(timezone=True)),
    Column("ready_at", DateTime(timezone=True)),
    Column("deleted_at", DateTime(timezone=True)),
    # Set once no object can appear for a deleted asset any more (its object was removed
    # after every upload URL expired); until then housekeeping keeps removing its object.
    Column("object_purged_at", DateTime(timezone=True)),
    # A calling service's key for a repeatable PutAsset (see the unique index below).
    Column("idempotency_key", Text),
    # Set when media stored a thumbnail beside the object (model.thumbnail_key): its type.
    Column("thumbnail_content_type", Text),
    # A client's request_id that makes its CreateUpload repeatable (see the index below).
    Column("upload_request_id", Text),
    # Housekeeping's thumbnail backfill: when a replica claimed the row (others skip it
    # until the claim is old), and why no thumbnail can be made (then it is not retried).
    Column("thumbnail_claimed_at", DateTime(timezone=True)),
    Column("thumbnail_failure", Text),
    *(CheckConstraint(rule, name=name) for name, rule in CHECKS.items()),
)

# Housekeeping finds expired uploads through this; it holds only rows still uploading.
Index(
    "ix_assets_upload_expiry",
    assets.c.upload_expires_at,
    postgresql_where=text("status = 'uploading'"),
)

# Housekeeping's watch list: deleted assets whose object may still (re)appear.
Index(
    "ix_assets_unpurged",
    assets.c.asset_id,
    postgresql_where=text("status = 'deleted' AND object_purged_at IS NULL"),
)

# The thumbnail backfill's work list: ready outputs without a thumbnail or a failure.
Index(
    "ix_assets_thumbnail_backlog",
    assets.c.asset_id,
    postgresql_where=text(
        "status = 'ready' AND purpose = 'ai_output'"
        " AND thumbnail_content_type IS NULL AND thumbnail_failure IS NULL"
    ),
)

# PutAsset's idempotency: one asset per owner and key, for good. A deleted asset keeps its
# key, so a key whose asset was removed can never bring a live asset back (a late caller
# gets ASSET_DELETED instead of leaving an asset nobody will delete).
Index(
    "uq_assets_owner_idempotency_key",
    assets.c.owner_user_id,
    assets.c.idempotency_key,
    unique=True,
    postgresql_where=text("idempotency_key IS NOT NULL"),
)

# CreateUpload's idempotency: one asset per owner and request id, for good (a deleted or
# expired upload keeps its key, so a replay can never make a second asset). Apart from
# PutAsset's keys: a client's key never names a server-made asset.
Index(
    "uq_assets_owner_upload_request_id",
    assets.c.owner_user_id,
    assets.c.upload_request_id,
    unique=True,
    postgresql_where=text("upload_request_id IS NOT NULL"),
)
