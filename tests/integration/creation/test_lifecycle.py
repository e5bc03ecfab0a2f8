"""The job lifecycle through the store on real PostgreSQL: cancel, claim with SKIP LOCKED,
fencing, heartbeats, completion, failure and retry, the reaper's decisions, operators."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Job, Status, Step
from services.creation.errors import JobAlreadyFinished, JobNotAwaitingOperator, JobNotFound
from services.creation.list_filter import JobFilter
from services.creation.store import admin, leases, ledger
from services.creation.store import jobs as store
from services.creation.store.fenced import FencedWrite, outputs_value
from services.creation.store.jobs import SubmitLimits
from services.creation.store.writes import IllegalTransition, write
from tests.integration.creation.helpers import LIMITS, T0, command, new_user, side_rows
from tests.support.fenced import fenced_write

TTL = timedelta(seconds=30)
ASSET = "7b0c4e8e-5d6f-4a51-9d1e-0c7f3e2b1a90"


async def submitted(engine: AsyncEngine, user: str | None = None) -> Job:
    return (await store.submit(engine, user or new_user(), command(), LIMITS, T0)).job


async def claim_one(
    engine: AsyncEngine, job: Job, worker_id: str = "w1", now: datetime = T0
) -> Job:
    """Claims ``job``, which must be the only one due: each test starts with an empty
    queue of its own, so anything else claimed here is a bug."""
    claimed = await leases.claim(engine, worker_id, 10, TTL, now)
    assert [c.job_id for c in claimed] == [job.job_id]
    return claimed[0]


async def balance(engine: AsyncEngine, user: str) -> tuple[int, int]:
    got = await ledger.read_balance(engine, user, 0, T0)
    return got.available, got.reserved


async def test_cancel_queued_job_releases_points(engine: AsyncEngine) -> None:
    job = await submitted(engine)
    cancelled = (await store.cancel(engine, job.user_id, job.job_id, T0)).job
    assert (cancelled.status, cancelled.version, cancelled.completed_at) == (
        Status.CANCELLED,
        2,
        T0,
    )
    assert await balance(engine, job.user_id) == (100, 0)
    # Twice is harmless: nothing changes.
    again = await store.cancel(engine, job.user_id, job.job_id, T0)
    assert not again.changed
    assert again.job.version == 2
    rows = await side_rows(engine, job.job_id)
    assert rows["ledger"] == [("reserve", 5), ("release", 5)]
    assert rows["outbox_versions"] == [1, 2]


async def test_cancel_running_job_asks_the_worker(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    requested = (await store.cancel(engine, job.user_id, job.job_id, T0)).job
    assert (requested.status, requested.cancel_requested, requested.version) == (
        Status.RUNNING,
        True,
        job.version + 1,
    )
    again = await store.cancel(engine, job.user_id, job.job_id, T0)
    assert (again.job.version, again.changed) == (requested.version, False)
    done = await fenced_write(
        engine, FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch, T0
    )
    assert done is not None
    assert done.status is Status.CANCELLED
    assert await balance(engine, job.user_id) == (100, 0)


async def test_cancel_finished_job_is_refused_and_others_jobs_are_not_found(
    engine: AsyncEngine,
) -> None:
    job = await claim_one(engine, await submitted(engine))
    await fenced_write(
        engine, FencedWrite.COMPLETE, job.job_id, job.lease_epoch, T0, outputs_value([ASSET])
    )
    with pytest.raises(JobAlreadyFinished):
        await store.cancel(engine, job.user_id, job.job_id, T0)
    with pytest.raises(JobNotFound):
        await store.cancel(engine, new_user(), job.job_id, T0)
    with pytest.raises(JobNotFound):
        await store.get(engine, new_user(), job.job_id)


async def test_claim_runs_the_job_and_success_captures(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    assert (job.status, job.attempt, job.step, job.lease_owner, job.lease_epoch) == (
        Status.RUNNING,
        1,
        Step.PREPARING,
        "w1",
        1,
    )
    assert job.lease_expires_at == T0 + TTL
    done = await fenced_write(
        engine, FencedWrite.COMPLETE, job.job_id, job.lease_epoch, T0, outputs_value([ASSET])
    )
    assert done is not None
    assert (done.status, done.progress, done.outputs, done.lease_owner) == (
        Status.SUCCEEDED,
        100,
        (ASSET,),
        None,
    )
    assert await balance(engine, job.user_id) == (95, 0)
    assert (await side_rows(engine, job.job_id))["ledger"] == [("reserve", 5), ("capture", 5)]


async def test_concurrent_claims_never_share_a_job(engine: AsyncEngine) -> None:
    user = new_user()
    limits = SubmitLimits(daily_quota=100, in_flight_limit=100, max_attempts=3, welcome_points=1000)
    made = {(await store.submit(engine, user, command(), limits, T0)).job.job_id for _ in range(30)}
    # Ten workers asking for five each: room for 50, so every one of the 30 is claimed,
    # and none twice.
    batches = await asyncio.gather(*(leases.claim(engine, f"w{i}", 5, TTL, T0) for i in range(10)))
    claimed = [job.job_id for batch in batches for job in batch]
    assert len(claimed) == len(set(claimed)) == 30
    assert set(claimed) == made
    # Each claimed job is held by the worker that claimed it.
    for index, batch in enumerate(batches):
        assert all(job.lease_owner == f"w{index}" for job in batch)


async def test_a_stale_worker_is_fenced_off(engine: AsyncEngine) -> None:
    first = await claim_one(engine, await submitted(engine), "old")
    # The lease expires; the reaper queues it; another worker claims it.
    [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 1000)]
    second = await claim_one(engine, first, "new", T0 + TTL * 2)
    assert second.lease_epoch == first.lease_epoch + 1
    assert (
        await fenced_write(
            engine,
            FencedWrite.COMPLETE,
            first.job_id,
            first.lease_epoch,
            T0,
            outputs_value([ASSET]),
        )
        is None
    )
    assert (
        await leases.heartbeat(engine, first.job_id, first.lease_epoch, TTL, T0, progress=50)
        is None
    )
    assert (
        await fenced_write(
            engine,
            FencedWrite.COMPLETE,
            second.job_id,
            second.lease_epoch,
            T0 + TTL * 2,
            outputs_value([ASSET]),
        )
        is not None
    )


async def test_heartbeat_bumps_the_version_only_for_visible_change(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    later = T0 + timedelta(seconds=10)
    quiet = await leases.heartbeat(engine, job.job_id, job.lease_epoch, TTL, later)
    assert quiet is not None
    assert (quiet.version, quiet.lease_expires_at) == (job.version, later + TTL)
    moved = await leases.heartbeat(engine, job.job_id, job.lease_epoch, TTL, later, progress=40)
    assert moved is not None
    assert (moved.version, moved.progress) == (job.version + 1, 40)
    rows = await side_rows(engine, job.job_id)
    assert rows["outbox_versions"] == list(range(1, moved.version + 1))


async def test_retryable_failure_requeues_with_backoff_then_fails(engine: AsyncEngine) -> None:
    job = await submitted(engine)
    for attempt in (1, 2):
        running = await claim_one(engine, job)
        assert running.attempt == attempt
        queued = await leases.fail(
            engine,
            job.job_id,
            running.lease_epoch,
            "PROVIDER_BUSY",
            "busy",
            retryable=True,
            retry_delay=timedelta(0),
            now=T0,
        )
        assert queued is not None
        assert (queued.status, queued.error_code, queued.step) == (
            Status.QUEUED,
            "PROVIDER_BUSY",
            None,
        )
    running = await claim_one(engine, job)
    failed = await leases.fail(
        engine,
        job.job_id,
        running.lease_epoch,
        "PROVIDER_BUSY",
        "busy",
        retryable=True,
        retry_delay=timedelta(0),
        now=T0,
    )
    assert failed is not None
    assert (failed.status, failed.attempt) == (Status.FAILED, 3)
    assert await balance(engine, job.user_id) == (100, 0)


async def test_backoff_delays_the_next_claim(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    await leases.fail(
        engine,
        job.job_id,
        job.lease_epoch,
        "PROVIDER_BUSY",
        "busy",
        retryable=True,
        retry_delay=timedelta(minutes=5),
        now=T0,
    )
    assert await leases.claim(engine, "w", 1000, TTL, T0 + timedelta(minutes=4)) == []
    claimed_late = await leases.claim(engine, "w", 1000, TTL, T0 + timedelta(minutes=6))
    assert [c.job_id for c in claimed_late] == [job.job_id]


async def reaped(engine: AsyncEngine, job: Job) -> Job:
    found = [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 1000)]
    assert [r.job_id for r in found] == [job.job_id]
    return found[0]


async def test_reaper_requeues_a_job_that_never_reached_the_provider(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    after = await reaped(engine, job)
    assert (after.status, after.step, after.lease_owner) == (Status.QUEUED, None, None)


async def test_reaper_resumes_a_job_the_provider_accepted(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
    await fenced_write(engine, FencedWrite.RECORD_REQUEST, job.job_id, job.lease_epoch, T0, "req-1")
    after = await reaped(engine, job)
    assert (after.status, after.step, after.provider_request_id) == (
        Status.QUEUED,
        Step.GENERATING,
        "req-1",
    )
    resumed = await claim_one(engine, after, now=after.next_attempt_at)
    # Same attempt, same request: the next worker polls instead of submitting again.
    assert (resumed.attempt, resumed.step, resumed.provider_request_id) == (
        1,
        Step.GENERATING,
        "req-1",
    )


async def test_reaper_sends_an_unknown_submit_to_an_operator(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
    after = await reaped(engine, job)
    assert (after.status, after.error_code) == (Status.NEEDS_ATTENTION, "OUTCOME_UNKNOWN")
    # Points stay held while an operator decides.
    assert await balance(engine, job.user_id) == (95, 5)
    listed, _ = await admin.list_attention(engine, 1000, None)
    assert [j.job_id for j in listed] == [job.job_id]


async def test_reaper_resubmits_when_the_provider_submit_is_idempotent(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
    found = [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 1000, {"stub"})]
    assert [(r.job_id, r.status) for r in found] == [(job.job_id, Status.QUEUED)]


async def test_operator_decisions(engine: AsyncEngine) -> None:
    outcomes = {}
    # RETRY last: it queues its job again, which the next claim would take.
    for decision in (admin.Decision.FAIL, admin.Decision.CANCEL, admin.Decision.RETRY):
        job = await claim_one(engine, await submitted(engine))
        await fenced_write(engine, FencedWrite.MARK_SUBMITTING, job.job_id, job.lease_epoch, T0)
        await reaped(engine, job)
        resolved = await admin.resolve(
            engine, job.job_id, decision, "ops@atelier", "checked the provider", T0
        )
        outcomes[decision] = (resolved.status, await balance(engine, job.user_id))
        if decision == admin.Decision.FAIL:
            # The operator's words are the message; the reason says an operator decided.
            assert (resolved.error_code, resolved.error_reason, resolved.error_retryable) == (
                "OPERATOR_FAILED",
                "OPERATOR_FAILED",
                False,
            )
            assert resolved.error_message == "checked the provider"
        events, _ = await admin.list_events(engine, job.job_id, 100, None)
        assert events[-1].actor_id == "ops@atelier"
        assert events[-1].reason == "checked the provider"
        with pytest.raises(JobNotAwaitingOperator):
            await admin.resolve(engine, job.job_id, decision, "ops", "again", T0)
    assert outcomes == {
        admin.Decision.RETRY: (Status.QUEUED, (95, 5)),
        admin.Decision.FAIL: (Status.FAILED, (100, 0)),
        admin.Decision.CANCEL: (Status.CANCELLED, (100, 0)),
    }


async def test_events_record_every_status_change_with_its_actor(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    await fenced_write(
        engine, FencedWrite.COMPLETE, job.job_id, job.lease_epoch, T0, outputs_value([ASSET])
    )
    events, cursor = await admin.list_events(engine, job.job_id, 100, None)
    assert cursor is None
    assert [(e.from_status, e.to_status, e.actor.value) for e in events] == [
        (None, Status.QUEUED, "user"),
        (Status.QUEUED, Status.RUNNING, "worker"),
        (Status.RUNNING, Status.SUCCEEDED, "worker"),
    ]


async def test_list_pages_newest_first(engine: AsyncEngine) -> None:
    user = new_user()
    made = []
    for minute in range(5):
        made.append(
            (
                await store.submit(engine, user, command(), LIMITS, T0 + timedelta(minutes=minute))
            ).job.job_id
        )
    for job_id in made[1], made[3]:
        await store.cancel(engine, user, job_id, T0 + timedelta(minutes=9))

    async def listed(chosen: JobFilter) -> list[str]:
        page, cursor = await store.list_for_user(engine, user, chosen, 2, None)
        seen = [j.job_id for j in page]
        while cursor is not None:
            page, cursor = await store.list_for_user(engine, user, chosen, 2, cursor)
            seen.extend(j.job_id for j in page)
        return seen

    assert await listed(JobFilter()) == list(reversed(made))
    # Several statuses page through one merged order.
    both = JobFilter((Status.CANCELLED, Status.QUEUED))
    assert await listed(both) == list(reversed(made))
    assert await listed(JobFilter((Status.CANCELLED,))) == [made[3], made[1]]
    assert await listed(JobFilter((Status.RUNNING, Status.FAILED))) == []
    # [minute 1, minute 3): half open.
    window = JobFilter((), T0 + timedelta(minutes=1), T0 + timedelta(minutes=3))
    assert await listed(window) == [made[2], made[1]]


async def test_the_store_refuses_a_transition_the_state_machine_lacks(engine: AsyncEngine) -> None:
    job = await claim_one(engine, await submitted(engine))
    done = await fenced_write(
        engine, FencedWrite.COMPLETE, job.job_id, job.lease_epoch, T0, outputs_value([ASSET])
    )
    assert done is not None
    async with engine.begin() as connection:
        with pytest.raises(IllegalTransition):
            await write(
                connection,
                done,
                {"status": Status.QUEUED.value},
                actor=Actor.OPERATOR,
                actor_id="bug",
                reason="resurrect",
                now=T0,
            )
    assert (await store.get(engine, job.user_id, job.job_id)).status is Status.SUCCEEDED
