"""creation's integration tests: each module gets a migrated database of its own, and
each test starts from an empty job queue, so a claim takes exactly the jobs the test made
(no priority tricks, no other test's rows)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.kit.db import asyncpg_url
from tests.integration.creation.worker_kit import Engine, worker_stack
from tests.support.databases import migrated_database
from tests.support.pg_outage import OwnPostgres, own_migrated

# Every table a test's jobs and points touch; the catalog (seeded by migration) stays.
_JOB_TABLES = (
    "creation.outbox, creation.job_events, creation.points_ledger, creation.output_purges,"
    " creation.remote_claims, creation.remote_calls, creation.jobs"
)


async def empty_job_tables(engine: AsyncEngine, attempts: int = 5) -> None:
    """TRUNCATE locks the tables in its list's order; a module's service still running
    (its gauges, relay or reaper read jobs with the outbox or ledger) may hold them in
    another, and PostgreSQL then aborts one of the two as a deadlock. Each side's retry
    goes through once the other is done."""
    for attempt in range(attempts):
        try:
            async with engine.begin() as connection:
                await connection.execute(text(f"TRUNCATE {_JOB_TABLES}"))
            return
        except DBAPIError as error:
            deadlock = getattr(error.orig, "sqlstate", None) == "40P01"
            if not deadlock or attempt == attempts - 1:
                raise


@pytest.fixture(scope="module")
def creation_url(postgres_admin_url: str) -> Iterator[str]:
    """A database with creation's schema only, for this module alone."""
    with migrated_database(postgres_admin_url, "creation") as url:
        yield url


@pytest.fixture(scope="module")
def own_pg() -> Iterator[tuple[OwnPostgres, str]]:
    """A PostgreSQL of the module's own with creation's schema, which its tests may stop
    and freeze (never the shared server)."""
    with own_migrated("creation") as made:
        yield made


@pytest.fixture
async def engine(creation_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the module's database, whose job tables are emptied first."""
    engine = create_async_engine(asyncpg_url(creation_url))
    await empty_job_tables(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
async def rig(
    engine: AsyncEngine, creation_url: str, media_url: str, tmp_path: Path
) -> AsyncIterator[Engine]:
    """creation's job engine beside a real media, on this module's database, with a
    provider the test scripts."""
    async with worker_stack(engine, creation_url, media_url, tmp_path) as built:
        yield built
