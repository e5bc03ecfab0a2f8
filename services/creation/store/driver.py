"""The asyncpg connection under one of the engine's pooled connections, for the engine's
hot statements: asyncpg prepares each once per connection and sends it with one round
trip and no SQLAlchemy work per call. Checked out through SQLAlchemy's pool, so its size,
checkout deadline, statement and lock timeouts and dead-connection handling all stay.

A statement sent here runs on its own (no BEGIN/COMMIT): each is written as one
statement that does all its work, so it is its own transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[Any]:
    """An ``asyncpg.Connection`` borrowed from ``engine``'s pool for the block."""
    async with engine.connect() as connection:
        pooled = await connection.get_raw_connection()
        raw = pooled.driver_connection
        try:
            yield raw
        except BaseException:
            if raw is not None and raw.is_closed():
                # Gone mid-statement: never hand it to the next caller.
                await connection.invalidate()
            raise
