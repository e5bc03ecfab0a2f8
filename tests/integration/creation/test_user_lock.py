"""One user's burst waits on that user's lock, bounded in time and in connections, while
every other user goes on (the pool is shared by all of them). The user's lock is held by
a connection of the test's own, as by another replica stuck in a transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest

from services.creation.errors import UserBusy
from services.creation.store import jobs as store
from services.creation.store import users
from services.dev.postgres import connect_kwargs
from services.kit.db import Database
from services.kit.settings import DatabaseSettings
from tests.integration.creation.helpers import LIMITS, T0, command, new_user

# The lock wait outlasts the pool wait: were one user's waiters allowed to hold the pool,
# everyone else would time out on checkout.
LIMITS_FOR_TEST = DatabaseSettings(
    statement_timeout_seconds=5,
    lock_timeout_seconds=1,
    pool_timeout_seconds=0.3,
    pool_size=10,
)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url, "user-lock-test", limits=LIMITS_FOR_TEST)
    yield db
    await db.close()


async def _hold_user_lock(database_url: str, user: str) -> asyncpg.Connection:
    holder = await asyncpg.connect(**connect_kwargs(database_url))
    await holder.execute("BEGIN")
    await holder.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('creation.user:' || $1::text, 0))", user
    )
    return holder


async def test_a_burst_for_one_user_never_starves_the_others(
    database: Database, database_url: str
) -> None:
    busy, other = new_user(), new_user()
    holder = await _hold_user_lock(database_url, busy)
    try:
        burst = [
            asyncio.create_task(store.submit(database.engine, busy, command(), LIMITS, T0))
            for _ in range(40)
        ]
        # While the burst waits (the lock is still held), another user's submits all go
        # through on the same pool.
        for _ in range(5):
            done = await store.submit(database.engine, other, command(), LIMITS, T0)
            assert done.job.user_id == other
        assert not all(task.done() for task in burst)
        outcomes = await asyncio.gather(*burst, return_exceptions=True)
    finally:
        await holder.close()
    # Every request of the busy user is told to come back, each after a bounded wait (the
    # lock timeout, or its turn in the user's queue).
    assert all(isinstance(outcome, UserBusy) for outcome in outcomes), outcomes
    assert users._queues == {}
    # The lock is free again: the busy user is served.
    done = await store.submit(database.engine, busy, command(), LIMITS, T0)
    assert done.job.user_id == busy


def test_user_busy_is_aborted_with_a_retry_hint() -> None:
    error = UserBusy().to_api_error()
    assert error.code == grpc.StatusCode.ABORTED
    assert error.reason == "USER_BUSY"
    assert error.retry_after_seconds is not None and error.retry_after_seconds > 0


async def test_a_busy_users_lock_timeout_keeps_the_connection(database_url: str) -> None:
    # The server answered (lock_timeout): the connection is fine and goes back to the pool.
    limits = DatabaseSettings(statement_timeout_seconds=5, lock_timeout_seconds=0.2, pool_size=1)
    db = Database(database_url, "user-lock-test", limits=limits)
    user = new_user()
    try:
        async with db.engine.connect() as connection:
            before = (await connection.get_raw_connection()).driver_connection
        holder = await _hold_user_lock(database_url, user)
        try:
            with pytest.raises(UserBusy):
                await store.submit(db.engine, user, command(), LIMITS, T0)
        finally:
            await holder.close()
        async with db.engine.connect() as connection:
            assert (await connection.get_raw_connection()).driver_connection is before
    finally:
        await db.close()
