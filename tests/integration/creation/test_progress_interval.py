"""Progress has its own interval, shorter than the heartbeat: between full beats the lease
keeper writes, in one statement, only the attempts whose progress changed; each job gets
at most one version per progress interval, carrying its newest progress, and none when
its progress did not change."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.worker.lease_keeper import LeaseKeeper
from services.kit.clock import SettableClock
from tests.integration.creation.helpers import T0, side_rows
from tests.integration.creation.test_leases import TTL, claimed, row
from tests.integration.creation.worker_kit import until


async def test_progress_goes_out_between_heartbeats_coalesced(engine: AsyncEngine) -> None:
    moving, quiet = await claimed(engine, 2)
    clock = SettableClock(T0 + timedelta(seconds=1))
    # A heartbeat far away: every write below is a progress beat.
    keeper = LeaseKeeper(engine, "w1", TTL, 600, clock, progress_seconds=0.05)
    leases = {job.job_id: keeper.hold(job) for job in (moving, quiet)}
    running = asyncio.create_task(keeper.run())
    try:
        # Three reports within one interval: one version, with the newest.
        for progress in (10, 20, 30):
            leases[moving.job_id].report(progress)
        await until(lambda: keeper.progress_beats >= 1)
        after = await row(engine, moving.job_id)
        assert (after.progress, after.version) == (30, moving.version + 1)
        assert after.lease_expires_at == clock() + TTL
        # The job with nothing new was not in the statement: no version, lease as claimed.
        untouched = await row(engine, quiet.job_id)
        assert (untouched.version, untouched.lease_expires_at) == (quiet.version, T0 + TTL)
        assert keeper.beats == 0
        # The same progress again is no version; a change is the next one.
        beats = keeper.progress_beats
        leases[moving.job_id].report(30)
        await until(lambda: keeper.progress_beats > beats)
        assert (await row(engine, moving.job_id)).version == moving.version + 1
        leases[moving.job_id].report(55)
        await until(lambda: keeper.progress_beats > beats + 1)
        now = await row(engine, moving.job_id)
        assert (now.progress, now.version) == (55, moving.version + 2)
        assert (await side_rows(engine, moving.job_id))["outbox_versions"] == [1, 2, 3, 4]
    finally:
        keeper.stop()
        await running


async def test_without_its_own_interval_progress_rides_the_heartbeat(
    engine: AsyncEngine,
) -> None:
    (job,) = await claimed(engine, 1)
    keeper = LeaseKeeper(engine, "w1", TTL, 600, SettableClock(T0))
    keeper.hold(job).report(40)
    running = asyncio.create_task(keeper.run())
    try:
        # No tick comes before the heartbeat: nothing is written meanwhile.
        await asyncio.sleep(0.2)
        assert keeper.progress_beats == 0
        assert (await row(engine, job.job_id)).progress == 0
    finally:
        keeper.stop()
        await running
