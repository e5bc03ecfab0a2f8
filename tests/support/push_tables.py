"""Emptying notify's push tables (migration 0003_pushes) between tests."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def empty_push_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text("TRUNCATE notify.push_attempts, notify.pushes, notify.push_tokens")
        )
