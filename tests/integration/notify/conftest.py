"""notify's integration tests: each module gets a migrated database of notify's own, and
each test starts from an empty projection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.kit.db import asyncpg_url
from tests.support.databases import migrated_database


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture
async def engine(notify_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(notify_url))
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "TRUNCATE notify.job_states, notify.push_attempts, notify.pushes,"
                " notify.push_tokens"
            )
        )
    yield engine
    await engine.dispose()
