"""A lease whose job the attempt's own write ended (a cancel acknowledged, a failure or a
success recorded) is the attempt's to finish: a beat that no longer finds it held does
not cancel what the attempt still does for the job (a cancelled job's outputs' purge),
while a lease that was held by nobody's doing of ours is lost and its attempt cancelled."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from prometheus_client import REGISTRY
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.tables import jobs
from services.creation.worker.lease_keeper import Lease, LeaseKeeper
from services.kit.clock import SettableClock
from tests.integration.creation.helpers import LIMITS, T0, command, new_user

TTL = timedelta(seconds=5)
TAKEN_OVER = {"why": "taken_over"}


async def claimed_lease(engine: AsyncEngine, keeper: LeaseKeeper) -> Lease:
    await store.submit(engine, new_user(), command(), LIMITS, T0)
    (job,) = await leases.claim(engine, "w1", 1, TTL, T0)
    lease = keeper.hold(job)
    lease.task = asyncio.create_task(asyncio.Event().wait())  # the attempt, still at work
    # The lease is no longer this worker's in the database.
    async with engine.begin() as connection:
        await connection.execute(
            update(jobs).where(jobs.c.job_id == job.job_id).values(lease_epoch=job.lease_epoch + 1)
        )
    return lease


def taken_over() -> float:
    return REGISTRY.get_sample_value("atelier_worker_leases_lost_total", TAKEN_OVER) or 0.0


async def test_a_beat_leaves_an_ended_lease_to_its_attempt(engine: AsyncEngine) -> None:
    keeper = LeaseKeeper(engine, "w1", TTL, 0.5, SettableClock(T0))
    lease = await claimed_lease(engine, keeper)
    assert lease.task is not None
    lease.ended = True  # as the attempt's terminal fenced write sets it
    before = taken_over()
    await keeper.beat()
    assert not lease.lost and not lease.task.done()
    assert keeper.held == 0 and taken_over() == before
    lease.task.cancel()


async def test_a_beat_cancels_the_attempt_of_a_lease_taken_from_it(engine: AsyncEngine) -> None:
    keeper = LeaseKeeper(engine, "w1", TTL, 0.5, SettableClock(T0))
    lease = await claimed_lease(engine, keeper)
    assert lease.task is not None
    before = taken_over()
    await keeper.beat()
    assert lease.lost and keeper.held == 0 and taken_over() == before + 1
    await asyncio.sleep(0)
    assert lease.task.cancelled()
