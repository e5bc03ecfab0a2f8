"""What the operator's console reads: running jobs with their leases, a user's jobs and
points. The queue's depth comes from store.backlog (the gauges' statement)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.store import ledger
from services.creation.store.ledger import Balance
from services.creation.store.predicates import status_is
from services.creation.store.rows import job_from_row
from services.creation.tables import jobs
from services.kit.db import reading


async def running_jobs(engine: AsyncEngine, limit: int) -> tuple[int, list[Job]]:
    """How many jobs run, and up to ``limit`` of them, soonest lease expiry first (rides
    ix_jobs_lease_expiry, the reaper's index)."""
    async with reading(engine) as connection:
        count = (
            await connection.execute(
                select(func.count()).select_from(jobs).where(status_is(Status.RUNNING))
            )
        ).scalar_one()
        rows = (
            await connection.execute(
                select(jobs)
                .where(status_is(Status.RUNNING))
                .order_by(jobs.c.lease_expires_at, jobs.c.job_id)
                .limit(limit)
            )
        ).all()
    return int(count), [job_from_row(r._mapping) for r in rows]


async def user_balance(engine: AsyncEngine, user_id: str) -> Balance:
    """The user's balance as the ledger's totals hold it; reading grants nothing (no
    welcome points, unlike the owner's GetBalance)."""
    async with reading(engine) as connection:
        return await ledger.balance(connection, user_id)
