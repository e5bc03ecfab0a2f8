"""What an asset is, independent of protobuf, SQL and storage: its states, the content
types media accepts, and the rule that makes object keys."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Purpose(StrEnum):
    AI_INPUT = "ai_input"  # uploaded by a client
    AI_OUTPUT = "ai_output"  # written only by the server


class Status(StrEnum):
    UPLOADING = "uploading"
    READY = "ready"
    DELETED = "deleted"


# MIME type → the Pillow format name the bytes must decode as.
CONTENT_TYPES: dict[str, str] = {
    "image/jpeg": "JPEG",
    "image/png": "PNG",
    "image/webp": "WEBP",
}

_SHA256 = re.compile(r"[0-9a-f]{64}")
# An asset's thumbnail lives beside its object, under the object's key plus this.
THUMBNAIL_SUFFIX = ".thumb"
# Every key media writes (objects and their thumbnails); the local HTTP listener refuses
# any other path.
KEY_PATTERN = re.compile(
    r"(ai_input|ai_output)/[0-9]{4}/[0-9]{2}/"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    rf"(?:{re.escape(THUMBNAIL_SUFFIX)})?"
)


def object_key(purpose: Purpose, asset_id: uuid.UUID, created_at: datetime) -> str:
    """``<purpose>/<yyyy>/<mm>/<asset_id>``: made only of server values, so no user input
    ever reaches storage paths."""
    return f"{purpose.value}/{created_at:%Y}/{created_at:%m}/{asset_id}"


def thumbnail_key(asset_object_key: str) -> str:
    """Where the thumbnail of the asset stored under ``asset_object_key`` goes. Derived,
    never stored: whoever removes an object can remove its thumbnail without a lookup."""
    return asset_object_key + THUMBNAIL_SUFFIX


def owning_object_key(key: str) -> str:
    """The asset object key a stored key belongs to (itself, or a thumbnail's asset's)."""
    return key.removesuffix(THUMBNAIL_SUFFIX)


def normalize_sha256(text: str) -> str | None:
    """Lowercase hex SHA-256, or None when ``text`` is not one."""
    lowered = text.strip().lower()
    return lowered if _SHA256.fullmatch(lowered) else None


def normalize_content_type(text: str) -> str | None:
    """One of CONTENT_TYPES, or None."""
    lowered = text.strip().lower()
    return lowered if lowered in CONTENT_TYPES else None


@dataclass(frozen=True)
class Asset:
    asset_id: uuid.UUID
    owner_user_id: str
    purpose: Purpose
    status: Status
    content_type: str
    declared_size_bytes: int | None
    declared_sha256: str | None
    size_bytes: int | None
    sha256: str | None
    width: int | None
    height: int | None
    rejected_uploads: int
    object_key: str
    created_at: datetime
    upload_expires_at: datetime | None
    ready_at: datetime | None
    deleted_at: datetime | None
    # A calling service's key that makes its PutAsset repeatable (None for uploads).
    idempotency_key: str | None = None
    # The thumbnail's MIME type when media stored one (under thumbnail_key(object_key)).
    thumbnail_content_type: str | None = None
    # A client's request_id that makes its CreateUpload repeatable (None for server puts).
    upload_request_id: str | None = None

    def upload_expired(self, now: datetime) -> bool:
        """An upload that was never completed and whose time ran out."""
        return (
            self.ready_at is None
            and self.upload_expires_at is not None
            and self.upload_expires_at <= now
        )


@dataclass(frozen=True)
class ContentFacts:
    """What media measured about stored bytes."""

    size_bytes: int
    sha256: str
    width: int
    height: int
