"""Fixtures shared by media's integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.media.storage.s3 import S3Settings
from tests.support.media import media_database


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
