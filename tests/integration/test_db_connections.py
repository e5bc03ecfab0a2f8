"""The kit's connection pool on real PostgreSQL: no ping per checkout, no churn, and a
connection the server dropped never reaches a caller as an error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.kit.db import (
    DriverStatement,
    create_engine,
    driver_connection,
    driver_fetch,
    fetch,
    read,
)
from services.kit.settings import DatabaseSettings

BACKEND_PID = text("SELECT pg_backend_pid()")


@pytest.fixture
async def kit_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, limits=DatabaseSettings(pool_size=1))
    yield engine
    await engine.dispose()


async def _driver(engine: AsyncEngine) -> Any:
    """The asyncpg connection the pool of one holds (checked out and back once)."""
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        return raw.driver_connection


async def _terminate(admin: AsyncEngine, pid: int) -> None:
    async with admin.connect() as connection:
        await connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await connection.commit()
        deadline = time.monotonic() + 10
        while True:
            alive = (
                await connection.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
                )
            ).scalar_one()
            # A transaction reads pg_stat_activity once: end it to see the backend go.
            await connection.rollback()
            if not alive:
                return
            assert time.monotonic() < deadline, "the backend did not exit"
            await asyncio.sleep(0.02)


async def test_a_checkout_sends_no_ping(kit_engine: AsyncEngine) -> None:
    sent: list[str] = []
    driver = await _driver(kit_engine)
    driver.add_query_logger(lambda record: sent.append(record.query))
    for _ in range(3):
        await fetch(kit_engine, BACKEND_PID)
    assert sent == []  # no BEGIN, ";" or ROLLBACK around the reads
    assert await _driver(kit_engine) is driver  # the same connection every time: no churn


async def test_a_connection_the_server_closed_is_replaced_at_checkout(
    kit_engine: AsyncEngine, engine: AsyncEngine
) -> None:
    driver = await _driver(kit_engine)
    (before,) = await fetch(kit_engine, BACKEND_PID)
    await _terminate(engine, before[0])
    deadline = time.monotonic() + 10
    while not driver.is_closed():  # asyncpg sees the socket close
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    async with kit_engine.begin() as connection:  # a transaction, not only a read
        after = (await connection.execute(BACKEND_PID)).scalar_one()
    assert after != before[0]


async def test_a_read_on_a_connection_dropped_unnoticed_runs_once_more(
    kit_engine: AsyncEngine, engine: AsyncEngine
) -> None:
    driver = await _driver(kit_engine)
    (before,) = await fetch(kit_engine, BACKEND_PID)
    # Keep asyncpg from reading the socket while the server closes it, so the pool cannot
    # know: the read goes out on the dead connection and fails there first.
    driver._transport.pause_reading()
    await _terminate(engine, before[0])
    driver._transport.resume_reading()
    attempts = 0

    async def pid(connection: AsyncConnection) -> int:
        nonlocal attempts
        attempts += 1
        return int((await connection.execute(BACKEND_PID)).scalar_one())

    assert await read(kit_engine, pid) != before[0]
    assert attempts == 2


async def test_a_failing_read_is_not_repeated(kit_engine: AsyncEngine) -> None:
    attempts = 0

    async def broken(connection: AsyncConnection) -> None:
        nonlocal attempts
        attempts += 1
        await connection.execute(text("SELECT 1 / 0"))

    with pytest.raises(DBAPIError):
        await read(kit_engine, broken)
    assert attempts == 1


# -- the driver helpers: asyncpg on the pool's connections ---------------------------------

DRIVER_PID = DriverStatement.of(text("SELECT pg_backend_pid() AS pid"))


async def test_a_driver_read_is_one_statement_on_the_pools_connection(
    kit_engine: AsyncEngine,
) -> None:
    sent: list[str] = []
    driver = await _driver(kit_engine)
    driver.add_query_logger(lambda record: sent.append(record.query))
    for _ in range(3):
        await driver_fetch(kit_engine, DRIVER_PID)
    await asyncio.sleep(0)  # asyncpg calls its loggers with call_soon: one turn runs them
    assert sent == [DRIVER_PID.sql] * 3  # no BEGIN, ping or ROLLBACK around them
    assert await _driver(kit_engine) is driver  # back in the pool, not replaced


async def test_a_driver_read_on_a_connection_dropped_unnoticed_runs_once_more(
    kit_engine: AsyncEngine, engine: AsyncEngine
) -> None:
    driver = await _driver(kit_engine)
    (before,) = await driver_fetch(kit_engine, DRIVER_PID)
    driver._transport.pause_reading()
    await _terminate(engine, before["pid"])
    driver._transport.resume_reading()
    (after,) = await driver_fetch(kit_engine, DRIVER_PID)
    assert after["pid"] != before["pid"]
    assert await _driver(kit_engine) is not driver  # the dead one was discarded


async def test_a_failing_driver_read_is_not_repeated_and_keeps_its_connection(
    kit_engine: AsyncEngine,
) -> None:
    sent: list[str] = []
    driver = await _driver(kit_engine)
    driver.add_query_logger(lambda record: sent.append(record.query))
    broken = DriverStatement.of(text("SELECT 1 / 0"))
    with pytest.raises(asyncpg.exceptions.DivisionByZeroError):
        await driver_fetch(kit_engine, broken)
    await asyncio.sleep(0)
    assert sent == [broken.sql]
    assert await _driver(kit_engine) is driver  # the server answered: the connection is fine


async def test_a_driver_statement_past_its_client_timeout_discards_the_connection(
    kit_engine: AsyncEngine,
) -> None:
    driver = await _driver(kit_engine)
    with pytest.raises(TimeoutError):
        async with driver_connection(kit_engine) as connection:
            await connection.fetch("SELECT pg_sleep(5)", timeout=0.1)
    # Possibly mid-protocol: never handed to the next caller.
    assert await _driver(kit_engine) is not driver
