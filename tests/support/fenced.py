"""A test playing a worker's fenced write on one job: the batch statement the worker's
writer sends (``leases.apply``), with a batch of one."""

from __future__ import annotations

from datetime import datetime, timedelta

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


async def claim_this(
    engine: AsyncEngine, worker_id: str, job_id: str, lease_ttl: timedelta, now: datetime
) -> Job:
    """Plays a worker that takes this very job from a queue others share, the way a worker
    would meet it: claims in claim order until it comes up, handing the jobs claimed before
    it straight back (no attempt spent, due again at once). No priority is changed."""
    passed: list[Job] = []
    try:
        while True:
            (claimed,) = await leases.claim(engine, worker_id, 1, lease_ttl, now) or (None,)
            if claimed is None:
                raise AssertionError(f"job {job_id} is not in the queue")
            if claimed.job_id == job_id:
                return claimed
            passed.append(claimed)
    finally:
        for other in passed:
            await leases.hand_back(engine, other.job_id, other.lease_epoch, timedelta(0), now)
