"""The kit's engine on real PostgreSQL: every session carries the statement and lock
timeouts, and running past either is an outage answer, not a hang or a bug; contention
is ABORTED and a unique violation names its constraint (the kit's db_errors)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from services.dev.postgres import connect_kwargs
from services.kit.db import Database, driver_connection
from services.kit.db_errors import unique_violation
from services.kit.outages import Outage, classify
from services.kit.settings import DatabaseSettings
from tests.support.workers import until

LIMITS = DatabaseSettings(
    statement_timeout_seconds=0.5, lock_timeout_seconds=0.2, pool_timeout_seconds=0.3, pool_size=1
)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url, "deadline-test", limits=LIMITS)
    yield db
    await db.close()


async def test_sessions_carry_the_timeouts(database: Database) -> None:
    async with database.engine.connect() as connection:
        statement = (await connection.execute(text("SHOW statement_timeout"))).scalar_one()
        lock = (await connection.execute(text("SHOW lock_timeout"))).scalar_one()
    assert (statement, lock) == ("500ms", "200ms")


async def test_a_slow_statement_is_cancelled(database: Database) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - what it is, classify says
        async with database.engine.connect() as connection:
            await connection.execute(text("SELECT pg_sleep(5)"))
    assert classify(caught.value) == Outage("database", "statement_timeout")


async def test_a_lock_wait_ends_at_the_lock_timeout(database: Database, database_url: str) -> None:
    holder = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT pg_advisory_xact_lock(424242)")
        with pytest.raises(Exception) as caught:  # noqa: PT011
            async with database.engine.begin() as connection:
                await connection.execute(text("SELECT pg_advisory_xact_lock(424242)"))
    finally:
        await holder.close()
    assert classify(caught.value) == Outage("database", "lock_timeout")


async def test_a_deadlock_victim_is_contention_not_a_bug(
    database: Database, database_url: str
) -> None:
    """Two transactions each waiting for the other's lock: PostgreSQL aborts one, and
    that one is a lock wait to retry (ABORTED), not INTERNAL nor a worker loop's death."""
    holder = await asyncpg.connect(**connect_kwargs(database_url))
    watcher = await asyncpg.connect(**connect_kwargs(database_url))
    holder_wait: asyncio.Task[object] | None = None

    async def holder_waits() -> bool | None:
        waiting = await watcher.fetchval(
            "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted",
            holder.get_server_pid(),
        )
        return True if waiting else None

    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT pg_advisory_xact_lock(515151)")
        with pytest.raises(Exception) as caught:  # noqa: PT011 - what it is, classify says
            async with database.engine.begin() as connection:
                # This side's detector runs first (the holder's waits a second), so it is
                # the one PostgreSQL picks, before its own lock_timeout could end the wait.
                await connection.execute(text("SET LOCAL deadlock_timeout = '20ms'"))
                await connection.execute(text("SELECT pg_advisory_xact_lock(525252)"))
                holder_wait = asyncio.create_task(
                    holder.fetchval("SELECT pg_advisory_xact_lock(525252)")
                )
                # The holder's wait is in place before ours starts: the detector runs
                # once per wait, when its timer fires, and must find the cycle closed.
                await until(holder_waits, 10, "the holder waiting for our lock", every=0.01)
                await connection.execute(text("SELECT pg_advisory_xact_lock(515151)"))
        assert holder_wait is not None
        await holder_wait  # ours rolled back: the holder gets its lock
    finally:
        await holder.close()
        await watcher.close()
    assert classify(caught.value) == Outage("database", "deadlock")
    api = Outage("database", "deadlock").api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")


async def test_a_full_pool_is_an_outage_after_the_pool_timeout(database: Database) -> None:
    # A fixed pool of one: the second checkout waits, then fails.
    async with database.engine.connect() as first:
        await first.execute(text("SELECT 1"))
        with pytest.raises(Exception) as caught:  # noqa: PT011
            async with database.engine.connect():
                pass
    assert classify(caught.value) == Outage("database", "pool_timeout")


@pytest.fixture
async def probe_table(database_url: str) -> AsyncIterator[str]:
    """A table of this test's own, with a named unique constraint."""
    name = f"probe_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        await admin.execute(
            f"CREATE TABLE public.{name} (id int PRIMARY KEY, n int NOT NULL,"
            f" CONSTRAINT uq_{name}_n UNIQUE (n))"
        )
        await admin.execute(f"INSERT INTO public.{name} VALUES (1, 1)")
        yield name
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS public.{name}")
        await admin.close()


async def test_a_lost_serialization_race_is_contention(
    database: Database, database_url: str, probe_table: str
) -> None:
    """A repeatable-read transaction whose row another committed a change to meanwhile
    (SQLSTATE 40001) did nothing and may succeed when run again: ABORTED, like a lock wait."""
    other = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        with pytest.raises(Exception) as caught:  # noqa: PT011 - what it is, classify says
            async with database.engine.connect() as connection:
                await connection.execution_options(isolation_level="REPEATABLE READ")
                async with connection.begin():
                    await connection.execute(text(f"SELECT n FROM public.{probe_table}"))
                    await other.execute(f"UPDATE public.{probe_table} SET n = 2 WHERE id = 1")
                    await connection.execute(
                        text(f"UPDATE public.{probe_table} SET n = 3 WHERE id = 1")
                    )
    finally:
        await other.close()
    assert classify(caught.value) == Outage("database", "serialization_failure")
    api = Outage("database", "serialization_failure").api_error()
    assert (api.code, api.reason) == (grpc.StatusCode.ABORTED, "LOCK_TIMEOUT")
    assert api.retry_after_seconds


async def test_a_unique_violation_names_its_constraint_on_either_path(
    database: Database, probe_table: str
) -> None:
    """Through SQLAlchemy (an IntegrityError) and on the pool's asyncpg connection (the hot
    path) alike, a store learns which constraint it broke; neither is an outage."""
    duplicate = f"INSERT INTO public.{probe_table} VALUES (2, 1)"
    with pytest.raises(IntegrityError) as by_sqlalchemy:
        async with database.engine.begin() as connection:
            await connection.execute(text(duplicate))
    with pytest.raises(asyncpg.UniqueViolationError) as by_driver:
        async with driver_connection(database.engine) as connection:
            await connection.execute(duplicate)
    for caught in (by_sqlalchemy, by_driver):
        assert unique_violation(caught.value) == f"uq_{probe_table}_n"
        assert classify(caught.value) is None
