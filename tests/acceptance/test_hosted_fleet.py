"""Fifty queued jobs of a hosted model and two worker processes: each process keeps at
most its cap of requests in flight at the vendor (measured at the fake vendor, by the
process header every call carries), jobs waiting for a slot keep their leases, and every
job runs once."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from services.creation.domain import Status
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.hosted import FAL, REPLICATE, Vendor, hosted_alone
from tests.support.workers import all_finished, new_user, queue_jobs, read_jobs, serving

CAP = 3
USERS = 10
PER_USER = 5  # 100 welcome points at a price of 20
JOBS = USERS * PER_USER


@pytest.mark.parametrize("vendor", [REPLICATE, FAL], ids=lambda vendor: vendor.code)
async def test_two_workers_never_exceed_the_cap_per_process(
    api_of_its_own: Stack, vendor: Vendor
) -> None:
    db = create_async_engine(asyncpg_url(api_of_its_own.database_url))
    prefix = vendor.code.upper()
    limits = {
        f"ATELIER_{prefix}_MAX_IN_FLIGHT": str(CAP),
        f"ATELIER_{prefix}_RATE": "50",
        f"ATELIER_{prefix}_BURST": "5",
        # More jobs claimed than slots: the rest wait in the process, leases beating.
        "ATELIER_WORKER_CONCURRENCY": "8",
        "ATELIER_WORKER_CLAIM_BATCH": "8",
    }
    try:
        async with hosted_alone(api_of_its_own, vendor) as hosted:
            fake = hosted.fake
            fake.pace(start_delay=0.05, duration=0.5, steps=5)
            users = [new_user(f"cap-{vendor.code}") for _ in range(USERS)]
            inputs = await asyncio.gather(*(put_input(hosted.api, user) for user in users))
            queued = await queue_jobs(
                db, dict(zip(users, inputs, strict=True)), PER_USER, vendor.model_id
            )
            job_ids = {q.job_id for q in queued}
            workers = [hosted.start_worker(f"{vendor.code}-cap-{n}", **limits) for n in (1, 2)]
            await asyncio.gather(*(serving(w) for w in workers))
            await all_finished(db, workers, within=120, job_ids=job_ids)
            finished = await read_jobs(db, job_ids)
            codes = [worker.stop() for worker in workers]
    finally:
        await db.dispose()
    assert codes == [0, 0]

    assert {job.status for job in finished.values()} == {Status.SUCCEEDED}
    # No job was reaped while it waited for a slot: one claim and one attempt each.
    assert {(job.attempt, job.lease_epoch) for job in finished.values()} == {(1, 1)}
    # One submit per job, the one whose request the job holds.
    assert fake.submit_count() == JOBS
    generations = {submit.generation_id for submit in fake.submits}
    held = {str(job.provider_request_id).rsplit("/", 1)[-1] for job in finished.values()}
    assert held == generations

    peaks = fake.max_in_flight()
    print(f"{vendor.code}: most requests in flight per process: {peaks}")
    assert len(peaks) == 2 and None not in peaks, peaks  # two processes, each named
    assert max(peaks.values()) <= CAP, peaks
    # Each process did fill its slots: a cap that was never reached proves nothing.
    assert min(peaks.values()) == CAP, peaks


async def test_a_job_waiting_longer_than_its_lease_for_a_slot_keeps_it(
    api_of_its_own: Stack,
) -> None:
    """One slot, three claimed jobs of three seconds each: the last waits longer than the
    lease (5 s) for the slot, and is still the same claim when it runs."""
    db = create_async_engine(asyncpg_url(api_of_its_own.database_url))
    limits = {
        "ATELIER_REPLICATE_MAX_IN_FLIGHT": "1",
        "ATELIER_WORKER_CONCURRENCY": "3",
        "ATELIER_WORKER_CLAIM_BATCH": "3",
    }
    try:
        async with hosted_alone(api_of_its_own, REPLICATE) as hosted:
            hosted.fake.pace(start_delay=0.05, duration=3.0, steps=5)
            user = new_user("slot-wait")
            queued = await queue_jobs(
                db, {user: await put_input(hosted.api, user)}, 3, REPLICATE.model_id
            )
            job_ids = {q.job_id for q in queued}
            worker = hosted.start_worker("replicate-one-slot", **limits)
            await serving(worker)
            await all_finished(db, [worker], within=60, job_ids=job_ids)
            finished = await read_jobs(db, job_ids)
            submits = list(hosted.fake.submits)
            peaks = hosted.fake.max_in_flight()
    finally:
        await db.dispose()
    assert {job.status for job in finished.values()} == {Status.SUCCEEDED}
    assert {(job.attempt, job.lease_epoch) for job in finished.values()} == {(1, 1)}
    assert list(peaks.values()) == [1]
    # The last submit came more than a lease after the first: that job waited that long.
    assert submits[-1].at - submits[0].at > 5
