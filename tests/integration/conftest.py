"""Fixtures shared by media's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.media.storage.s3 import S3Settings, S3Storage
from tests.support.media import MediaHarness, media_database, media_settings, running_media


@pytest.fixture(scope="module")
def media_url(postgres_admin_url: str) -> Iterator[str]:
    """A migrated database of media's own, one per test module."""
    with media_database(postgres_admin_url) as url:
        yield url


@pytest.fixture(params=["local", "s3"])
def bucket(request: pytest.FixtureRequest) -> S3Settings | None:
    """None for the local backend; else a fresh bucket on the S3 server."""
    if request.param == "local":
        return None
    found: S3Settings = request.getfixturevalue("s3_bucket")
    return found


@pytest.fixture
async def any_media(
    bucket: S3Settings | None, media_url: str, tmp_path: Path
) -> AsyncIterator[MediaHarness]:
    """media running in this process, once on each storage backend."""
    storage = None if bucket is None else S3Storage(bucket)
    async with running_media(media_settings(media_url, tmp_path), storage) as harness:
        yield harness
