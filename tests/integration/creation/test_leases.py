"""The lease keeper's one statement per beat on real PostgreSQL: leases extended for
every attempt at once, progress carried only when it changed (a version and an outbox row
each), cancel requests read, and a stale epoch that matches nothing. Also the fenced
operations the engine added: hand back, outcome unknown, complete refused after a cancel,
and the reaper telling the provider before it cancels."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.leases import Beat
from services.creation.store.rows import job_from_row
from services.creation.tables import jobs
from tests.integration.creation.helpers import LIMITS, T0, command, new_user, side_rows
from tests.support.fenced import fenced_write

TTL = timedelta(seconds=30)
ASSET = "7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90"


async def claimed(engine: AsyncEngine, n: int) -> list[Job]:
    for _ in range(n):
        await store.submit(engine, new_user(), command(), LIMITS, T0)
    got = await leases.claim(engine, "w1", n, TTL, T0)
    assert len(got) == n
    return got


async def row(engine: AsyncEngine, job_id: str) -> Job:
    async with engine.connect() as connection:
        found = (await connection.execute(select(jobs).where(jobs.c.job_id == job_id))).one()
    return job_from_row(found._mapping)


async def test_one_beat_extends_every_lease_and_versions_only_changed_progress(
    engine: AsyncEngine,
) -> None:
    a, b, c = await claimed(engine, 3)
    later = T0 + timedelta(seconds=10)
    result = await leases.beat(
        engine,
        "w1",
        [
            Beat(a.job_id, a.lease_epoch, 40),
            Beat(b.job_id, b.lease_epoch),
            Beat(c.job_id, c.lease_epoch, 0),
        ],
        TTL,
        later,
    )
    assert result.held == {a.job_id: False, b.job_id: False, c.job_id: False}
    assert [j.job_id for j in result.progressed] == [a.job_id]
    for job in (a, b, c):
        after = await row(engine, job.job_id)
        assert after.lease_expires_at == later + TTL
    # Only a's progress changed (c reported the progress it already had).
    assert (await row(engine, a.job_id)).progress == 40
    assert (await row(engine, a.job_id)).version == a.version + 1
    assert (await row(engine, b.job_id)).version == b.version
    assert (await row(engine, c.job_id)).version == c.version
    assert (await side_rows(engine, a.job_id))["outbox_versions"] == [1, 2, 3]
    assert (await side_rows(engine, b.job_id))["outbox_versions"] == [1, 2]
    # The same progress again is no new version.
    again = await leases.beat(engine, "w1", [Beat(a.job_id, a.lease_epoch, 40)], TTL, later)
    assert again.progressed == []
    assert (await row(engine, a.job_id)).version == a.version + 1


async def test_a_stale_epoch_matches_nothing_and_writes_nothing(engine: AsyncEngine) -> None:
    (job,) = await claimed(engine, 1)
    async with engine.begin() as connection:
        # Another worker took the lease over.
        await connection.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(lease_epoch=jobs.c.lease_epoch + 1, lease_owner="w2")
        )
    result = await leases.beat(
        engine, "w1", [Beat(job.job_id, job.lease_epoch, 70)], TTL, T0 + timedelta(seconds=5)
    )
    assert result.held == {}
    assert result.progressed == []
    after = await row(engine, job.job_id)
    assert (after.progress, after.version, after.lease_expires_at) == (0, job.version, T0 + TTL)
    assert (await side_rows(engine, job.job_id))["outbox_versions"] == [1, 2]


async def test_a_beat_reads_the_cancel_request_and_skips_finished_jobs(engine: AsyncEngine) -> None:
    a, b = await claimed(engine, 2)
    await store.cancel(engine, a.user_id, a.job_id, T0)
    requested = await row(engine, a.job_id)
    await fenced_write(
        engine, FencedWrite.COMPLETE, b.job_id, b.lease_epoch, T0, outputs_value([ASSET])
    )
    result = await leases.beat(
        engine, "w1", [Beat(a.job_id, a.lease_epoch), Beat(b.job_id, b.lease_epoch, 50)], TTL, T0
    )
    assert result.held == {a.job_id: True}
    assert (await row(engine, a.job_id)).version == requested.version
    assert (await row(engine, b.job_id)).status is Status.SUCCEEDED


async def test_an_empty_beat_sends_nothing(engine: AsyncEngine) -> None:
    result = await leases.beat(engine, "w1", [], TTL, T0)
    assert (result.held, result.progressed) == ({}, [])


async def test_hand_back_keeps_the_request_or_returns_the_attempt(engine: AsyncEngine) -> None:
    polling, fresh = await claimed(engine, 2)
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, polling.job_id, polling.lease_epoch, T0)
    await fenced_write(
        engine, FencedWrite.RECORD_REQUEST, polling.job_id, polling.lease_epoch, T0, "req-1"
    )
    delay = timedelta(seconds=3)
    kept = await leases.hand_back(engine, polling.job_id, polling.lease_epoch, delay, T0)
    assert kept is not None
    assert (kept.status, kept.provider_request_id, kept.attempt, kept.next_attempt_at) == (
        Status.QUEUED,
        "req-1",
        1,
        T0 + delay,
    )
    back = await leases.hand_back(engine, fresh.job_id, fresh.lease_epoch, timedelta(0), T0)
    assert back is not None
    assert (back.status, back.step, back.attempt) == (Status.QUEUED, None, 0)
    # The next claim resumes the request in the same attempt; the fresh one starts its first.
    again = {j.job_id: j for j in await leases.claim(engine, "w2", 5, TTL, T0 + delay)}
    assert (again[polling.job_id].attempt, again[polling.job_id].provider_request_id) == (
        1,
        "req-1",
    )
    assert again[fresh.job_id].attempt == 1
    # A stale epoch hands back nothing.
    stale = await leases.hand_back(engine, fresh.job_id, fresh.lease_epoch, timedelta(0), T0)
    assert stale is None


async def test_hand_back_of_a_cancelled_job_changes_nothing(engine: AsyncEngine) -> None:
    (job,) = await claimed(engine, 1)
    await store.cancel(engine, job.user_id, job.job_id, T0)
    got = await leases.hand_back(engine, job.job_id, job.lease_epoch, timedelta(0), T0)
    assert got is not None
    assert (got.status, got.cancel_requested) == (Status.RUNNING, True)


async def test_outcome_unknown_needs_attention_and_holds_the_points(engine: AsyncEngine) -> None:
    (job,) = await claimed(engine, 1)
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
    got = await fenced_write(
        engine, FencedWrite.OUTCOME_UNKNOWN, job.job_id, job.lease_epoch, T0, "timed out"
    )
    assert got is not None
    assert (got.status, got.error_code, got.error_message) == (
        Status.NEEDS_ATTENTION,
        "OUTCOME_UNKNOWN",
        "timed out",
    )
    # Its owner is told not to submit again: it could be made (and paid for) twice.
    assert (got.error_reason, got.error_retryable) == ("OUTCOME_UNKNOWN", False)
    assert (await side_rows(engine, job.job_id))["ledger"] == [("reserve", 5)]


async def test_complete_after_a_cancel_request_is_refused(engine: AsyncEngine) -> None:
    (job,) = await claimed(engine, 1)
    await store.cancel(engine, job.user_id, job.job_id, T0)
    assert (
        await fenced_write(
            engine, FencedWrite.COMPLETE, job.job_id, job.lease_epoch, T0, outputs_value([ASSET])
        )
        is None
    )
    done = await fenced_write(
        engine, FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch, T0
    )
    assert done is not None
    assert done.status is Status.CANCELLED


async def test_the_reaper_tells_the_provider_before_it_cancels(engine: AsyncEngine) -> None:
    asked, plain = await claimed(engine, 2)
    for job in (asked, plain):
        await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
        await store.cancel(engine, job.user_id, job.job_id, T0)
    await fenced_write(
        engine, FencedWrite.RECORD_REQUEST, asked.job_id, asked.lease_epoch, T0, "req-9"
    )
    told: list[tuple[str, str | None, Status]] = []

    async def before_cancel(job: Job) -> None:
        told.append((job.job_id, job.provider_request_id, (await row(engine, job.job_id)).status))

    # `plain` died mid-submit: its outcome is unknown, so it is not cancelled.
    reaped = [
        r.job
        for r in await leases.reap_decided(engine, T0 + TTL * 2, 10, before_cancel=before_cancel)
    ]
    assert told == [(asked.job_id, "req-9", Status.RUNNING)]
    assert {j.job_id: j.status for j in reaped} == {
        asked.job_id: Status.CANCELLED,
        plain.job_id: Status.NEEDS_ATTENTION,
    }


async def test_the_beat_rides_the_primary_key(engine: AsyncEngine) -> None:
    jobs_held = await claimed(engine, 2)
    statement = leases.BEAT_SQL
    async with engine.connect() as connection:
        await connection.execute(text("SET enable_seqscan = off"))
        plan = (
            await connection.execute(
                text(f"EXPLAIN {statement}"),
                {
                    "job_ids": [j.job_id for j in jobs_held],
                    "epochs": [j.lease_epoch for j in jobs_held],
                    "progress": [None, 10],
                    "expires_at": T0 + TTL,
                    "now": T0,
                    "worker_id": "w1",
                },
            )
        ).scalars()
        text_plan = "\n".join(plan)
        await connection.rollback()
    assert "pk_jobs" in text_plan, text_plan
