"""A job write wakes the relay (and a queued job the workers) with pg_notify, and every
notifying commit on the server queues for one lock (migration 0024). Other databases'
notifying commits keep that queue busy here; with a lock bound of 1 ms, far shorter than
the queue's waits, a submit and a cancel still commit: only the statement timeout bounds
their wait for the queue. The same commit without the lift is refused by the lock bound,
which shows the queue really was waited on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.creation.store import jobs as store
from services.dev.postgres import connect_kwargs
from services.kit.db import Database
from services.kit.settings import DatabaseSettings
from tests.integration.creation.helpers import LIMITS, T0, command, new_user

NOISY = 12
ROUNDS = 15
# The lock bound far below a commit's wait in the notification queue.
SHORT_LOCK_BOUND = DatabaseSettings(
    statement_timeout_seconds=10, lock_timeout_seconds=0.001, pool_size=4
)


@pytest.fixture
async def noise(database_url: str) -> AsyncIterator[None]:
    """Connections committing notifying writes back to back, as other writers would."""
    table = f"noise_{uuid.uuid4().hex[:8]}"
    setup = await asyncpg.connect(**connect_kwargs(database_url))
    await setup.execute(f"CREATE TABLE public.{table} (x int)")
    stop = asyncio.Event()

    async def writer() -> None:
        connection = await asyncpg.connect(**connect_kwargs(database_url))
        try:
            while not stop.is_set():
                async with connection.transaction():
                    await connection.execute(f"INSERT INTO public.{table} VALUES (1)")
                    await connection.execute("SELECT pg_notify('atelier_test_noise', '')")
        finally:
            await connection.close()

    writers = [asyncio.create_task(writer()) for _ in range(NOISY)]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*writers)
        await setup.execute(f"DROP TABLE public.{table}")
        await setup.close()


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url, "notify-queue-test", limits=SHORT_LOCK_BOUND)
    yield db
    await db.close()


async def test_job_writes_commit_behind_a_busy_notification_queue(
    noise: None, database: Database, database_url: str
) -> None:
    user = new_user()
    for _ in range(ROUNDS):
        submitted = await store.submit(database.engine, user, command(), LIMITS, T0)
        cancelled = await store.cancel(database.engine, user, submitted.job.job_id, T0)
        assert cancelled.changed and cancelled.job.status.value == "cancelled"

    # The control: a notifying commit with only the lock bound is refused by it.
    control = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        await control.execute("SET lock_timeout = '1ms'")
        refused = 0
        for _ in range(ROUNDS):
            try:
                async with control.transaction():
                    await control.execute("SELECT pg_notify('atelier_test_control', '')")
            except asyncpg.LockNotAvailableError:
                refused += 1
        assert refused > 0
    finally:
        await control.close()


@pytest.mark.parametrize("function", ["notify_outbox", "notify_job_queued"])
@pytest.mark.parametrize(("statement_timeout", "lock_timeout_after"), [("5s", "0"), ("0", "1s")])
async def test_a_wake_up_lifts_the_lock_bound_only_where_a_statement_timeout_bounds_it(
    database_url: str, function: str, statement_timeout: str, lock_timeout_after: str
) -> None:
    connection = await asyncpg.connect(**connect_kwargs(database_url))
    try:
        await connection.execute(
            f"SET statement_timeout = '{statement_timeout}'; SET lock_timeout = '1s'"
        )
        await connection.execute(
            "CREATE TEMP TABLE probe (x int);"
            " CREATE TRIGGER probe_wakes AFTER INSERT ON probe"
            f" FOR EACH STATEMENT EXECUTE FUNCTION creation.{function}()"
        )
        async with connection.transaction():
            await connection.execute("INSERT INTO probe VALUES (1)")
            assert await connection.fetchval("SHOW lock_timeout") == lock_timeout_after
        # SET LOCAL: the next transaction has the session's bound again.
        assert await connection.fetchval("SHOW lock_timeout") == "1s"
    finally:
        await connection.close()
