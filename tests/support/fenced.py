"""A test playing a worker's fenced write on one job: the batch statement the worker's
writer sends (``leases.apply``), with a batch of one."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job
from services.creation.store import leases
from services.creation.store.fenced import FencedItem, FencedWrite


async def fenced_write(
    engine: AsyncEngine,
    write: FencedWrite,
    job_id: str,
    lease_epoch: int,
    now: datetime,
    value: str | None = None,
) -> Job | None:
    """The job as written, or None when its lease (or cancel request) refused the write."""
    written = await leases.apply(engine, write, [FencedItem(job_id, lease_epoch, value)], now)
    return written.get(job_id)
