"""Request fields checked before anything else runs: each bad field gets its own reason
and a field violation, never a database or storage error."""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Sequence

from atelier.media.v1 import asset_pb2
from atelier.media.v1 import media_internal_service_pb2 as internal_pb2
from services.kit.errors import ApiError, FieldViolation, invalid_argument
from services.kit.idempotency import choose_key
from services.kit.ids import parse_uuid
from services.kit.sizes import byte_size
from services.media.domain import (
    CONTENT_TYPES,
    Purpose,
    normalize_content_type,
    normalize_sha256,
)
from services.media.errors import Reason

PURPOSES: dict[int, Purpose] = {
    asset_pb2.ASSET_PURPOSE_AI_INPUT: Purpose.AI_INPUT,
    asset_pb2.ASSET_PURPOSE_AI_OUTPUT: Purpose.AI_OUTPUT,
}
MAX_OWNER_LENGTH = 256
_ALLOWED_TYPES = ", ".join(CONTENT_TYPES)
_PUT_ORDER = "the first message must be the header, and every later one a chunk"


def bad_field(reason: str, field: str, description: str) -> ApiError:
    return invalid_argument(reason, [FieldViolation(field, description)])


def asset_id(text: str) -> uuid.UUID:
    parsed = parse_uuid(text)
    if parsed is None:
        raise bad_field(Reason.INVALID_ASSET_ID, "asset_id", "must be an asset id (a UUID)")
    return parsed


def asset_ids(values: Sequence[str], field: str, maximum: int) -> list[str]:
    """GetAssetUrls' ids: at most ``maximum`` distinct ones (an empty list asks nothing).
    Malformed ids are kept: they name no asset, which the answer says by leaving them out."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) > maximum:
        raise bad_field(Reason.INVALID_ASSET_ID, field, f"must hold at most {maximum} ids")
    return distinct


def upload_purpose(value: int) -> Purpose:
    """Clients may upload inputs only; outputs are written by the server."""
    if value != asset_pb2.ASSET_PURPOSE_AI_INPUT:
        raise bad_field(
            Reason.UPLOAD_PURPOSE_NOT_ALLOWED, "purpose", "must be ASSET_PURPOSE_AI_INPUT"
        )
    return Purpose.AI_INPUT


def any_purpose(value: int, field: str) -> Purpose:
    purpose = PURPOSES.get(value)
    if purpose is None:
        raise bad_field(
            Reason.INVALID_PURPOSE,
            field,
            "must be ASSET_PURPOSE_AI_INPUT or ASSET_PURPOSE_AI_OUTPUT",
        )
    return purpose


def content_type(text: str, field: str) -> str:
    normalized = normalize_content_type(text)
    if normalized is None:
        raise bad_field(Reason.CONTENT_TYPE_NOT_ALLOWED, field, f"must be one of {_ALLOWED_TYPES}")
    return normalized


def size_bytes(value: int, maximum: int) -> int:
    if value <= 0:
        raise bad_field(Reason.INVALID_SIZE, "size_bytes", "must be the upload's size in bytes")
    if value > maximum:
        raise bad_field(
            Reason.UPLOAD_TOO_LARGE, "size_bytes", f"must be at most {byte_size(maximum)}"
        )
    return value


def sha256(text: str) -> str | None:
    """Optional: empty means not given."""
    if not text:
        return None
    normalized = normalize_sha256(text)
    if normalized is None:
        raise bad_field(Reason.INVALID_SHA256, "sha256", "must be 64 hex digits (SHA-256)")
    return normalized


def required_sha256(text: str) -> str:
    found = sha256(text)
    if found is None:
        raise bad_field(Reason.INVALID_SHA256, "sha256", "must be 64 hex digits (SHA-256)")
    return found


def owner_user_id(text: str, field: str) -> str:
    if (
        not text.strip()
        or len(text) > MAX_OWNER_LENGTH
        or any(unicodedata.category(ch).startswith("C") for ch in text)
    ):
        raise bad_field(
            Reason.INVALID_OWNER,
            field,
            f"must be a user id of 1 to {MAX_OWNER_LENGTH} printable characters",
        )
    return text


_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:\-]{1,200}")
MAX_KEYS_PER_DELETE = 100
_KEY_RULE = "1-200 characters of letters, digits and . _ : -"


def idempotency_key(text: str, field: str) -> str | None:
    """Optional: empty means not given."""
    if not text:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(text):
        raise bad_field(Reason.INVALID_IDEMPOTENCY_KEY, field, f"must be {_KEY_RULE}")
    return text


def required_idempotency_key(text: str, field: str) -> str:
    found = idempotency_key(text, field)
    if found is None:
        raise bad_field(Reason.INVALID_IDEMPOTENCY_KEY, field, f"must be {_KEY_RULE}")
    return found


def request_id(field: str, header: str | None) -> str | None:
    """CreateUpload's request_id or Idempotency-Key header (the kit's rule for both)."""
    key, problems = choose_key(field, header)
    if problems:
        raise invalid_argument(Reason.INVALID_IDEMPOTENCY_KEY, problems)
    return key


def idempotency_keys(values: Sequence[str], field: str) -> list[str]:
    """DeleteKeyedAssets' keys: 1 to MAX_KEYS_PER_DELETE valid keys."""
    if not 1 <= len(values) <= MAX_KEYS_PER_DELETE:
        raise bad_field(
            Reason.INVALID_IDEMPOTENCY_KEYS, field, f"must hold 1 to {MAX_KEYS_PER_DELETE} keys"
        )
    if any(not _IDEMPOTENCY_KEY.fullmatch(value) for value in values):
        raise bad_field(Reason.INVALID_IDEMPOTENCY_KEYS, field, f"each must be {_KEY_RULE}")
    return list(dict.fromkeys(values))


def put_header(message: internal_pb2.PutAssetRequest | None) -> internal_pb2.PutAssetHeader:
    """PutAsset's first message: the header."""
    if message is None or message.WhichOneof("part") != "header":
        raise bad_field(Reason.INVALID_PUT_STREAM, "header", _PUT_ORDER)
    return message.header


def put_chunk(message: internal_pb2.PutAssetRequest) -> bytes:
    """Every later PutAsset message: a chunk of the asset."""
    if message.WhichOneof("part") != "chunk":
        raise bad_field(Reason.INVALID_PUT_STREAM, "chunk", _PUT_ORDER)
    return message.chunk
