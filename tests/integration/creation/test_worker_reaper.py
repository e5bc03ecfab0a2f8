"""The reaper on real PostgreSQL: jobs whose worker died are resolved by step — retried,
resumed with their request, held for an operator when a submit's outcome is unknown, and
cancelled after telling the provider when the owner asked — once each, however many
reapers run, each decision an event by the reaper."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from sqlalchemy import select, update

from services.creation.domain import Job, Status
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite
from services.creation.tables import job_events, jobs
from services.kit.clock import system_clock
from tests.integration.creation.worker_kit import Engine, running, until
from tests.support.fenced import fenced_write

TTL = timedelta(seconds=5)


async def dead_workers_jobs(rig: Engine) -> dict[str, Job]:
    """Four jobs a worker held when it died, each stopped at another step."""
    for _ in range(4):
        await rig.submit()
    now = system_clock()
    claimed = await leases.claim(rig.db, "dead", 4, TTL, now)
    fresh, unknown, polling, cancelled = claimed
    for job in (unknown, polling, cancelled):
        await fenced_write(rig.db, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, now)
    for job in (polling, cancelled):
        request = f"req-{job.job_id}"
        await fenced_write(
            rig.db, FencedWrite.RECORD_REQUEST, job.job_id, job.lease_epoch, now, request
        )
    await store.cancel(rig.db, cancelled.user_id, cancelled.job_id, now)
    return {"fresh": fresh, "unknown": unknown, "polling": polling, "cancelled": cancelled}


def after_expiry() -> datetime:
    return system_clock() + TTL * 2


async def test_the_reaper_resolves_each_step_and_tells_the_provider(rig: Engine) -> None:
    held = await dead_workers_jobs(rig)
    reaper = rig.reaper(clock=after_expiry)
    async with running(reaper):
        await until(lambda: reaper.sweeps >= 1)
    got = {name: await rig.job(job.job_id) for name, job in held.items()}
    assert (got["fresh"].status, got["fresh"].step, got["fresh"].attempt) == (
        Status.QUEUED,
        None,
        1,
    )
    assert (got["polling"].status, got["polling"].provider_request_id) == (
        Status.QUEUED,
        f"req-{held['polling'].job_id}",
    )
    assert (got["unknown"].status, got["unknown"].error_code) == (
        Status.NEEDS_ATTENTION,
        "OUTCOME_UNKNOWN",
    )
    assert got["cancelled"].status is Status.CANCELLED
    # Only the cancelled job's provider was told, and before the job was cancelled.
    assert rig.provider.cancels == [f"req-{held['cancelled'].job_id}"]
    async with rig.db.connect() as connection:
        events = (
            await connection.execute(
                select(job_events.c.job_id, job_events.c.actor_kind, job_events.c.reason).where(
                    job_events.c.actor_kind == "reaper"
                )
            )
        ).all()
    assert sorted((e.job_id, e.reason) for e in events) == sorted(
        [
            (held["fresh"].job_id, "lease expired: retry"),
            (held["unknown"].job_id, "lease expired: attention"),
            (held["polling"].job_id, "lease expired: resume"),
            (held["cancelled"].job_id, "lease expired: cancel"),
        ]
    )


async def test_many_reapers_decide_each_job_once(rig: Engine) -> None:
    held = await dead_workers_jobs(rig)
    reapers = [rig.reaper(clock=after_expiry) for _ in range(3)]
    results = await asyncio.gather(*(r.sweep() for r in reapers))
    reaped = [job.job_id for result in results for job in result]
    assert sorted(reaped) == sorted(job.job_id for job in held.values())
    assert rig.provider.cancels == [f"req-{held['cancelled'].job_id}"]


async def test_a_reaped_job_with_a_request_is_resumed_by_the_next_worker(
    rig: Engine,
) -> None:
    held = await dead_workers_jobs(rig)
    await rig.reaper(clock=system_clock).sweep()  # nothing has expired yet
    statuses = [(await rig.job(j.job_id)).status for j in held.values()]
    assert statuses == [Status.RUNNING] * 4
    await rig.reaper(clock=after_expiry).sweep()
    # The resumed job was queued "now" in the reaper's (future) time; move it to ours.
    polling = held["polling"].job_id
    async with rig.db.begin() as connection:
        await connection.execute(
            update(jobs).where(jobs.c.job_id == polling).values(next_attempt_at=system_clock())
        )
    async with running(rig.worker()):
        done = await rig.until_job(polling, lambda j: j.status.terminal)
    assert done.status is Status.SUCCEEDED
    assert [s for s in rig.provider.submits if s[0] == polling] == []
    assert rig.provider.polls.count(f"req-{polling}") == 1
