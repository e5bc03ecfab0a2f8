"""Object keys are made from server values only, and ids and hashes are read strictly."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.media.domain import (
    KEY_PATTERN,
    Asset,
    Purpose,
    Status,
    normalize_content_type,
    normalize_sha256,
    object_key,
)

ASSET_ID = uuid.UUID("0b5f4c1e-2f7a-4c3e-9d51-6f1b2a3c4d5e")


def test_key_is_purpose_year_month_and_id() -> None:
    created = datetime(2026, 3, 9, 23, 59, tzinfo=UTC)
    assert object_key(Purpose.AI_INPUT, ASSET_ID, created) == f"ai_input/2026/03/{ASSET_ID}"
    assert object_key(Purpose.AI_OUTPUT, ASSET_ID, created) == f"ai_output/2026/03/{ASSET_ID}"


def test_every_generated_key_has_the_shape_the_listener_accepts() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for month in range(12):
        for purpose in Purpose:
            key = object_key(purpose, uuid.uuid4(), start + timedelta(days=31 * month))
            assert KEY_PATTERN.fullmatch(key), key


@pytest.mark.parametrize(
    "key",
    [
        "ai_input/2026/03/../../etc/passwd",
        f"/ai_input/2026/03/{ASSET_ID}",
        f"ai_input/2026/03/{ASSET_ID}/x",
        f"uploads/2026/03/{ASSET_ID}",
        f"ai_input/26/3/{ASSET_ID}",
        "ai_input/2026/03/my-holiday.jpg",
        f"ai_input/2026/03/{str(ASSET_ID).upper()}",
    ],
)
def test_anything_else_is_not_a_key(key: str) -> None:
    assert KEY_PATTERN.fullmatch(key) is None


def test_sha256_is_64_lowercase_hex_digits() -> None:
    digest = "AB" * 32
    assert normalize_sha256(digest) == "ab" * 32
    assert normalize_sha256("ab" * 31) is None
    assert normalize_sha256("zz" * 32) is None


def test_only_jpeg_png_and_webp_are_content_types() -> None:
    assert normalize_content_type(" Image/PNG ") == "image/png"
    for refused in ("image/gif", "image/svg+xml", "text/plain", "image/jpeg; q=1", ""):
        assert normalize_content_type(refused) is None


def _asset(ready_at: datetime | None, expires_at: datetime | None) -> Asset:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Asset(
        asset_id=ASSET_ID,
        owner_user_id="u",
        purpose=Purpose.AI_INPUT,
        status=Status.UPLOADING if ready_at is None else Status.READY,
        content_type="image/png",
        declared_size_bytes=10,
        declared_sha256=None,
        size_bytes=None,
        sha256=None,
        width=None,
        height=None,
        rejected_uploads=0,
        object_key=object_key(Purpose.AI_INPUT, ASSET_ID, now),
        created_at=now,
        upload_expires_at=expires_at,
        ready_at=ready_at,
        deleted_at=None,
    )


def test_an_upload_expires_only_if_it_never_became_ready() -> None:
    deadline = datetime(2026, 1, 1, 0, 15, tzinfo=UTC)
    later = deadline + timedelta(seconds=1)
    assert _asset(None, deadline).upload_expired(later)
    assert _asset(None, deadline).upload_expired(deadline)
    assert not _asset(None, deadline).upload_expired(deadline - timedelta(seconds=1))
    assert not _asset(deadline - timedelta(minutes=1), deadline).upload_expired(later)
