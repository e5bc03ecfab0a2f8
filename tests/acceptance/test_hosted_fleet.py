"""Fifty queued jobs of a hosted model and two worker processes: each process keeps at
most its cap of requests in flight at the vendor (measured at the fake vendor, by the
process header every call carries), jobs waiting for a slot keep their leases, and every
job runs once."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from services.creation.domain import Status
from services.creation.tables import jobs
from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import put_input
from tests.support.hosted import FAL, REPLICATE, Hosted, Vendor, enable_models, running_fake
from tests.support.workers import new_user, queue_jobs, read_jobs, serving, until

CAP = 3
USERS = 10
PER_USER = 5  # 100 welcome points at a price of 20
JOBS = USERS * PER_USER


@pytest.mark.parametrize("vendor", [REPLICATE, FAL], ids=lambda vendor: vendor.code)
async def test_two_workers_never_exceed_the_cap_per_process(
    api_of_its_own: Stack, http: httpx.AsyncClient, vendor: Vendor
) -> None:
    api = api_of_its_own
    others = [v.model_id for v in (REPLICATE, FAL) if v is not vendor]
    await enable_models(api.database_url, vendor.model_id, disable=others)
    db = create_async_engine(asyncpg_url(api.database_url))
    prefix = vendor.code.upper()
    limits = {
        f"ATELIER_{prefix}_MAX_IN_FLIGHT": str(CAP),
        f"ATELIER_{prefix}_RATE": "50",
        f"ATELIER_{prefix}_BURST": "5",
        # More jobs claimed than slots: the rest wait in the process, leases beating.
        "ATELIER_WORKER_CONCURRENCY": "8",
        "ATELIER_WORKER_CLAIM_BATCH": "8",
    }
    with running_fake(vendor) as fake:
        fake.pace(start_delay=0.05, duration=0.5, steps=5)
        hosted = Hosted(api, vendor, fake, db)
        try:
            users = [new_user(f"cap-{vendor.code}") for _ in range(USERS)]
            inputs = await asyncio.gather(*(put_input(api, user) for user in users))
            queued = await queue_jobs(
                db, dict(zip(users, inputs, strict=True)), PER_USER, vendor.model_id
            )
            job_ids = {q.job_id for q in queued}
            workers = [hosted.start_worker(f"{vendor.code}-cap-{n}", **limits) for n in (1, 2)]
            await asyncio.gather(*(serving(w) for w in workers))

            async def all_finished() -> bool | None:
                async with db.connect() as connection:
                    left = (
                        await connection.execute(
                            select(func.count())
                            .select_from(jobs)
                            .where(jobs.c.job_id.in_(list(job_ids)))
                            .where(jobs.c.status.in_([Status.QUEUED.value, Status.RUNNING.value]))
                        )
                    ).scalar_one()
                for worker in workers:
                    assert worker.child.alive(), worker.child.log_tail()
                return True if left == 0 else None

            await until(all_finished, within=120, what="every job finished", every=0.25)
            finished = await read_jobs(db, job_ids)
        finally:
            codes = [worker.stop() for worker in hosted.workers]
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
