"""Cancel and takeover while a job runs: the owner's cancel reaches CANCELLED within one
beat and tells the provider; an output that lands after the cancel is deleted from media;
a worker whose lease was taken over is stopped and writes nothing more, whether a beat
or its own fenced write finds out first."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import update

from services.creation.domain import Status, Step
from services.creation.providers.base import Done, Failed, PollResult, Running
from services.creation.store import jobs as store
from services.creation.tables import jobs
from services.kit.clock import system_clock
from tests.integration.creation.helpers import side_rows
from tests.integration.creation.worker_kit import (
    HEARTBEAT,
    Engine,
    output_png,
    running,
    until,
)


async def test_cancel_while_running_is_cancelled_within_one_beat(rig: Engine) -> None:
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        return Running(40)

    rig.provider.on_poll = poll
    worker = rig.worker()
    async with running(worker):
        running_job = await rig.until_job(
            job.job_id, lambda j: j.step is Step.GENERATING and j.status is Status.RUNNING
        )
        asked = time.monotonic()
        await store.cancel(rig.db, job.user_id, job.job_id, system_clock())
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
        took = time.monotonic() - asked
        # The attempt records its outcome after the write the poll above saw.
        await until(lambda: job.job_id in worker.context.outcomes)
    assert done.status is Status.CANCELLED
    # Seen on the next beat, acted on at once (the bound the issue sets, with slack for
    # the acknowledging write).
    assert took <= HEARTBEAT + 0.5, took
    assert rig.provider.cancels == [running_job.provider_request_id]
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [
        ("reserve", 5),
        ("release", 5),
    ]
    assert worker.context.outcomes[job.job_id] == "cancelled"


async def test_an_output_landed_after_a_cancel_is_deleted(rig: Engine) -> None:
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        # The owner cancels just as the provider finishes: the output lands regardless.
        await store.cancel(rig.db, job.user_id, job.job_id, system_clock())
        return Done([output_png()])

    rig.provider.on_poll = poll
    worker = rig.worker()
    async with running(worker):
        done = await rig.until_job(job.job_id, lambda j: j.status.terminal)
        await until(lambda: job.job_id in worker.context.outcomes)
    assert (done.status, done.outputs) == (Status.CANCELLED, ())
    # The one output media stored for this user is deleted.
    found = await rig.outputs(job.user_id)
    assert list(found.values()) == ["deleted"]
    assert (await side_rows(rig.db, job.job_id))["ledger"] == [
        ("reserve", 5),
        ("release", 5),
    ]


async def test_a_worker_whose_lease_was_taken_over_writes_nothing_more(
    rig: Engine,
) -> None:
    job = await rig.submit()
    release = asyncio.Event()

    async def poll(request_id: str) -> PollResult:
        if release.is_set():
            return Done([output_png()])
        return Running(30)

    rig.provider.on_poll = poll
    worker = rig.worker()
    async with running(worker):
        held = await rig.until_job(job.job_id, lambda j: j.step is Step.GENERATING)
        async with rig.db.begin() as connection:
            # Another worker took the lease over (what a reaper and a new claim do).
            await connection.execute(
                update(jobs)
                .where(jobs.c.job_id == job.job_id)
                .values(lease_epoch=jobs.c.lease_epoch + 1, lease_owner="other")
            )
        taken = await rig.job(job.job_id)
        # The next beat finds it gone and stops the attempt at once.
        await until(lambda: worker.keeper.held == 0 and worker.running == 0, HEARTBEAT * 4)
        polls = len(rig.provider.polls)
        release.set()  # the provider is done now: nobody is left to land or complete it
    after = await rig.job(job.job_id)
    assert after == taken  # no progress, no completion, no failure: not one write
    assert (after.status, after.lease_owner, after.version) == (
        Status.RUNNING,
        "other",
        held.version,
    )
    assert len(rig.provider.polls) == polls
    assert await rig.outputs(job.user_id) == {}
    assert job.job_id not in worker.context.outcomes  # cancelled, not ended by itself


@pytest.mark.parametrize(
    "answer",
    [
        Done([output_png()]),
        Failed("CONTENT_REJECTED", "refused", retryable=False),
        Failed("UNAVAILABLE", "busy", retryable=True),
    ],
    ids=["complete", "fail", "retry"],
)
async def test_a_stale_attempts_own_last_write_is_refused_by_the_fence(
    rig: Engine, answer: PollResult
) -> None:
    """The lease is taken over between two beats: no beat tells the attempt, so it goes
    on to its last write, which the fence refuses (an output it landed is never attached;
    what becomes of it is the landing's rule, tested with the outputs)."""
    job = await rig.submit()

    async def poll(request_id: str) -> PollResult:
        async with rig.db.begin() as connection:
            # Another worker takes the lease over just before the provider answers.
            await connection.execute(
                update(jobs)
                .where(jobs.c.job_id == job.job_id)
                .values(lease_epoch=jobs.c.lease_epoch + 1, lease_owner="other")
            )
        return answer

    rig.provider.on_poll = poll
    # Beats far apart (within the settings' bounds): the fence alone must stop the write.
    worker = rig.worker(LEASE_TTL="600", HEARTBEAT="300")
    async with running(worker):
        await until(lambda: job.job_id in worker.context.outcomes)
    assert worker.keeper.beats == 0
    assert worker.context.outcomes[job.job_id] == "lease_lost"
    after = await rig.job(job.job_id)
    assert (after.status, after.lease_owner, after.error_code, after.outputs) == (
        Status.RUNNING,
        "other",
        None,
        (),
    )
    rows = await side_rows(rig.db, job.job_id)
    # Claimed, then nothing but the takeover: no completion, failure, retry or capture.
    assert [to for _, _, to in rows["events"]] == ["queued", "running"]
    assert rows["ledger"] == [("reserve", 5)]
