"""Outputs to delete: what an attempt that ended without success may have landed in media.
A trigger (migration 0006) lists them in the transaction that ends the attempt, whoever
wrote it; the purger deletes them through media, then the row."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlalchemy import delete, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import output_keys
from services.creation.tables import output_purges


@dataclass(frozen=True)
class Purge:
    job_id: str
    attempt: int
    user_id: str
    num_outputs: int

    @property
    def keys(self) -> list[str]:
        """media's idempotency keys of every output the attempt may have landed."""
        return output_keys(self.job_id, self.attempt, self.num_outputs)


@asynccontextmanager
async def claim(
    engine: AsyncEngine, limit: int, job_id: str | None = None
) -> AsyncIterator[list[Purge]]:
    """Locks up to ``limit`` listed purges (of one job, when given), skipping rows another
    process holds; they are removed when the block ends without an error, kept for a
    later sweep otherwise (one job's: rides pk_output_purges; a sweep reads the whole
    table, which holds only attempts ended since the last purge)."""
    query = (
        select(output_purges)
        .order_by(output_purges.c.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    if job_id is not None:
        query = query.where(output_purges.c.job_id == job_id)
    async with engine.begin() as connection:
        rows = (await connection.execute(query)).all()
        purges = [
            Purge(str(r.job_id), int(r.attempt), str(r.user_id), int(r.num_outputs)) for r in rows
        ]
        yield purges
        if purges:
            await connection.execute(
                delete(output_purges).where(
                    tuple_(output_purges.c.job_id, output_purges.c.attempt).in_(
                        [(p.job_id, p.attempt) for p in purges]
                    )
                )
            )
