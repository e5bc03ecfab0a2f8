"""The worker's fenced writes as one statement for many jobs, on real PostgreSQL: each
job of a batch keeps its own fence (a stale epoch or a cancel request refuses that job
alone while the others apply), a cancel that commits while the batch waits for its row
still wins, the side rows are those of single writes (events, capture once, one outbox
row per version whose payload is the Python one), and the coalescing writer sends the
writes concurrent attempts ask for together as one statement."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
from google.protobuf import json_format
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.convert import outbox_job
from services.creation.domain import Job, Status, Step
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.fenced import (
    FencedItem,
    FencedWrite,
    Written,
    brief,
    outputs_value,
)
from services.creation.store.leases import Beat
from services.creation.tables import jobs, outbox
from services.creation.worker.fenced_writer import FencedWriter
from services.kit.db import Database, driver_connection
from services.kit.outages import classify
from services.kit.settings import DatabaseSettings
from tests.integration.creation.helpers import (
    LIMITS,
    T0,
    command,
    new_user,
    payloads_kept,
    side_rows,
)
from tests.integration.creation.test_leases import ASSET, TTL, claimed, row
from tests.support.fenced import fenced_write

# Added to times that have none, milliseconds and microseconds: each kind once.
FRACTIONS = [timedelta(0), timedelta(milliseconds=7), timedelta(microseconds=3)]


def at(job: Job, written: dict[str, Job]) -> Job | None:
    return written.get(job.job_id)


async def test_each_job_of_a_batch_keeps_its_own_fence(engine: AsyncEngine) -> None:
    fresh, stale, cancelled = await claimed(engine, 3)
    async with engine.begin() as connection:
        # Another worker took `stale` over.
        await connection.execute(
            update(jobs)
            .where(jobs.c.job_id == stale.job_id)
            .values(lease_epoch=jobs.c.lease_epoch + 1, lease_owner="w2")
        )
    await store.cancel(engine, cancelled.user_id, cancelled.job_id, T0)
    before = {j.job_id: await row(engine, j.job_id) for j in (stale, cancelled)}
    outputs = outputs_value([ASSET])
    items = [FencedItem(j.job_id, j.lease_epoch, outputs) for j in (fresh, stale, cancelled)]
    done = T0 + timedelta(seconds=3)
    written = await leases.apply(engine, FencedWrite.COMPLETE, items, done)
    assert set(written) == {fresh.job_id}
    after = written[fresh.job_id]
    assert (after.status, after.outputs, after.progress) == (Status.SUCCEEDED, (ASSET,), 100)
    assert (after.lease_owner, after.completed_at, after.version) == (None, done, fresh.version + 1)
    fresh_rows = await side_rows(engine, fresh.job_id)
    assert fresh_rows["events"][-1] == (fresh.version + 1, "running", "succeeded")
    assert fresh_rows["ledger"] == [("reserve", 5), ("capture", 5)]
    assert fresh_rows["outbox_versions"] == [1, 2, 3]
    # The refused jobs are exactly as they were, with no side rows.
    for job in (stale, cancelled):
        assert await row(engine, job.job_id) == before[job.job_id]
        assert (await side_rows(engine, job.job_id))["ledger"] == [("reserve", 5)]
    # A capture happens once: the same completion again matches nothing.
    assert await leases.apply(engine, FencedWrite.COMPLETE, items[:1], done) == {}


async def test_a_cancel_that_commits_while_the_batch_waits_for_the_row_wins(
    engine: AsyncEngine,
) -> None:
    first, second = await claimed(engine, 2)
    async with engine.connect() as owner:
        transaction = await owner.begin()
        # The owner's cancel holds the row while the worker's batch arrives.
        await owner.execute(
            update(jobs).where(jobs.c.job_id == second.job_id).values(cancel_requested=True)
        )
        outputs = outputs_value([ASSET])
        items = [FencedItem(j.job_id, j.lease_epoch, outputs) for j in (first, second)]
        batch = asyncio.create_task(leases.apply(engine, FencedWrite.COMPLETE, items, T0))
        await wait_for_a_lock_wait(engine)
        assert not batch.done()
        await transaction.commit()
    written = await batch
    assert set(written) == {first.job_id}
    assert (await row(engine, second.job_id)).status is Status.RUNNING
    cancelled = await leases.apply(
        engine, FencedWrite.ACKNOWLEDGE_CANCEL, [FencedItem(second.job_id, second.lease_epoch)], T0
    )
    assert cancelled[second.job_id].status is Status.CANCELLED
    assert (await side_rows(engine, second.job_id))["ledger"] == [("reserve", 5), ("release", 5)]


async def wait_for_a_lock_wait(engine: AsyncEngine) -> None:
    """Until some backend of this database waits for a row lock (the batch behind the
    owner's transaction)."""
    for _ in range(500):
        async with engine.connect() as connection:
            waiting = (
                await connection.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                )
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the batch never waited for the row")


async def test_every_outbox_payload_is_the_written_jobs_state_in_protobufs_json(
    engine: AsyncEngine,
) -> None:
    # The payloads kept for the webhooks: what the relay builds at delivery from the
    # job's row, built here at every version (one builder, creation.job_message).
    async with payloads_kept(engine):
        await _write_every_kind_of_version(engine)


async def _write_every_kind_of_version(engine: AsyncEngine) -> None:
    a, b, c = await claimed(engine, 3)
    written: list[Job | None] = [a, b, c]
    # Whole seconds, milliseconds and microseconds: protobuf writes 0, 3 or 6 digits.
    times = [T0, T0 + timedelta(milliseconds=120), T0 + timedelta(microseconds=120_005)]
    items = [FencedItem(j.job_id, j.lease_epoch) for j in (a, b, c)]
    written += (await leases.apply(engine, FencedWrite.MARK_SUBMITTING, items, times[0])).values()
    written.append(
        await fenced_write(
            engine, FencedWrite.RECORD_REQUEST, a.job_id, a.lease_epoch, times[1], "r"
        )
    )
    await leases.beat(engine, "w1", [Beat(a.job_id, a.lease_epoch, 37)], TTL, times[1])
    written.append(
        await fenced_write(
            engine, FencedWrite.COMPLETE, a.job_id, a.lease_epoch, times[2], outputs_value([ASSET])
        )
    )
    written.append(
        await fenced_write(
            engine, FencedWrite.OUTCOME_UNKNOWN, b.job_id, b.lease_epoch, times[1], "lost"
        )
    )
    await store.cancel(engine, c.user_id, c.job_id, times[0])
    written.append(
        await fenced_write(
            engine, FencedWrite.ACKNOWLEDGE_CANCEL, c.job_id, c.lease_epoch, times[2]
        )
    )
    retried, failed, handed = await claimed(engine, 3)
    written += [retried, failed, handed]
    retry = {"retryable": True, "retry_delay": timedelta(seconds=4), "now": times[1]}
    written.append(
        await leases.fail(engine, retried.job_id, retried.lease_epoch, "E", "m", **retry)
    )
    final = {**retry, "retryable": False, "now": times[2]}
    written.append(await leases.fail(engine, failed.job_id, failed.lease_epoch, "F", "", **final))
    back = timedelta(seconds=1)
    written.append(
        await leases.hand_back(engine, handed.job_id, handed.lease_epoch, back, times[0])
    )
    # Several outputs, in order; a queued job's next attempt at each kind of fraction.
    for offset, when in enumerate(times):
        await store.submit(engine, new_user(), command(num_outputs=3), LIMITS, T0)
        (several,) = await leases.claim(engine, "w1", 1, TTL, T0)
        written.append(several)
        landed = [str(uuid.UUID(int=offset * 10 + n)) for n in (3, 1, 2)]
        written.append(
            await fenced_write(
                engine,
                FencedWrite.COMPLETE,
                several.job_id,
                several.lease_epoch,
                when,
                outputs_value(landed),
            )
        )
        assert written[-1] is not None
        assert written[-1].outputs == tuple(landed)
        # Never due at T0 (the next claim takes a fresh job): whole, ms, µs fractions.
        later = timedelta(seconds=1) + FRACTIONS[offset]
        (again, *_) = await claimed(engine, 1)
        written.append(again)
        written.append(await leases.hand_back(engine, again.job_id, again.lease_epoch, later, when))
    async with engine.connect() as connection:
        stored = {
            (str(r.job_id), r.version): r.payload
            for r in await connection.execute(
                select(outbox.c.job_id, outbox.c.version, outbox.c.payload)
            )
        }
    assert len(written) == 16 + 4 * len(times)
    assert [j.status for j in written[13:16] if j is not None] == [
        Status.QUEUED,
        Status.FAILED,
        Status.QUEUED,
    ]
    payloads = [json_format.MessageToDict(outbox_job(job)) for job in written if job is not None]
    assert len(payloads) == len(written)
    # Every field the payload may carry is met at least once.
    assert {"outputs", "done", "attempt", "nextAttemptTime", "error", "step"} <= {
        name for payload in payloads for name in payload
    }
    for job, payload in zip(written, payloads, strict=True):
        assert job is not None
        assert stored[(job.job_id, job.version)] == payload
    # The error goes out typed (a code no table knows: PROVIDER_ERROR, as declared), with
    # its flag and message only when set, and never the internal code.
    errors = [payload["error"] for payload in payloads if "error" in payload]
    assert {
        "reason": "JOB_ERROR_REASON_PROVIDER_ERROR",
        "retryable": True,
        "message": "m",
    } in errors
    assert {"reason": "JOB_ERROR_REASON_PROVIDER_ERROR"} in errors


async def test_concurrent_writes_go_out_as_one_statement(engine: AsyncEngine) -> None:
    many = await claimed(engine, 20)
    writer = FencedWriter(engine, lambda: T0)
    marked = await asyncio.gather(
        *(writer.write(FencedWrite.MARK_SUBMITTING, j.job_id, j.lease_epoch) for j in many)
    )
    assert writer.statements == 1
    assert [(m.job_id, m.status, m.version) for m in marked if m is not None] == [
        (j.job_id, Status.RUNNING, j.version + 1) for j in many
    ]
    for job in many:
        assert (await row(engine, job.job_id)).step is Step.SUBMITTING
    # A stale one among them is refused alone.
    stale = many[0]
    results = await asyncio.gather(
        writer.write(FencedWrite.RECORD_REQUEST, stale.job_id, stale.lease_epoch - 1, "x"),
        *(
            writer.write(FencedWrite.RECORD_REQUEST, j.job_id, j.lease_epoch, f"r-{j.job_id}")
            for j in many[1:]
        ),
    )
    assert writer.statements == 2
    assert results[0] is None
    assert all(r is not None for r in results[1:])
    assert (await row(engine, stale.job_id)).provider_request_id is None
    for job in many[1:]:
        assert (await row(engine, job.job_id)).provider_request_id == f"r-{job.job_id}"


async def test_writes_asked_while_a_statement_is_out_go_in_the_next_one(
    engine: AsyncEngine,
) -> None:
    many = await claimed(engine, 6)
    writer = FencedWriter(engine, lambda: T0)
    first = asyncio.create_task(
        writer.write(FencedWrite.MARK_SUBMITTING, many[0].job_id, many[0].lease_epoch)
    )
    await asyncio.sleep(0)  # the statement of the first is on its way
    await asyncio.sleep(0)
    rest = [writer.write(FencedWrite.MARK_SUBMITTING, j.job_id, j.lease_epoch) for j in many[1:]]
    assert all(w is not None for w in await asyncio.gather(first, *rest))
    assert writer.statements == 2


async def test_a_beat_and_a_batch_over_the_same_jobs_never_deadlock(engine: AsyncEngine) -> None:
    many = await claimed(engine, 40)
    for round_ in range(10):
        # The beat lists the jobs backwards, the batch forwards: both lock in id order.
        beats = [Beat(j.job_id, j.lease_epoch, round_ + 1) for j in reversed(many)]
        items = [FencedItem(j.job_id, j.lease_epoch) for j in many]
        await asyncio.gather(
            leases.beat(engine, "w1", beats, TTL, T0),
            leases.apply(engine, FencedWrite.MARK_SUBMITTING, items, T0),
        )
    for job in many:
        assert (await row(engine, job.job_id)).progress == 10


async def test_a_lone_submit_is_claimed_with_its_side_rows(engine: AsyncEngine) -> None:
    await store.submit(engine, new_user(), command(), LIMITS, T0)
    (job,) = await leases.claim(engine, "w9", 5, TTL, T0)
    assert (job.status, job.lease_owner, job.attempt, job.lease_epoch) == (
        Status.RUNNING,
        "w9",
        1,
        1,
    )
    rows = await side_rows(engine, job.job_id)
    assert rows["events"] == [(1, None, "queued"), (2, "queued", "running")]
    assert rows["outbox_versions"] == [1, 2]


async def test_a_row_held_past_the_lock_timeout_fails_its_own_write_only(
    engine: AsyncEngine, creation_url: str
) -> None:
    held, free_a, free_b = await claimed(engine, 3)
    database = Database(
        creation_url, "fenced-lock-test", limits=DatabaseSettings(lock_timeout_seconds=0.2)
    )
    writer = FencedWriter(database.engine, lambda: T0)
    try:
        async with engine.connect() as other:
            transaction = await other.begin()
            # Someone holds one row (say, a reaper talking to the provider).
            await other.execute(
                select(jobs.c.job_id).where(jobs.c.job_id == held.job_id).with_for_update()
            )
            results = await asyncio.gather(
                *(
                    writer.write(FencedWrite.MARK_SUBMITTING, j.job_id, j.lease_epoch)
                    for j in (held, free_a, free_b)
                ),
                return_exceptions=True,
            )
            await transaction.rollback()
    finally:
        await database.close()
    refused, *written = results
    assert isinstance(refused, Exception)
    outage = classify(refused)
    assert outage is not None
    assert outage.kind == "lock_timeout"
    assert all(isinstance(w, Written) for w in written)
    assert (await row(engine, held.job_id)).step is Step.PREPARING
    assert (await row(engine, free_a.job_id)).step is Step.SUBMITTING


async def test_a_request_id_another_job_holds_fails_that_job_alone(engine: AsyncEngine) -> None:
    """A provider answering a request id it gave another job (uq_jobs_provider_request)
    must not fail the other jobs of the batch: they are written one by one, and only the
    job whose row the database refuses gets the error."""
    holder, *batch = await claimed(engine, 4)
    assert await fenced_write(
        engine, FencedWrite.RECORD_REQUEST, holder.job_id, holder.lease_epoch, T0, "gen-1"
    )
    writer = FencedWriter(engine, lambda: T0)
    requests = ["gen-1", "gen-2", "gen-3"]
    results = await asyncio.gather(
        *(
            writer.write(FencedWrite.RECORD_REQUEST, job.job_id, job.lease_epoch, request)
            for job, request in zip(batch, requests, strict=True)
        ),
        return_exceptions=True,
    )
    # One statement for the batch, refused; then one per job.
    assert writer.statements == 1 + len(batch)
    assert isinstance(results[0], asyncpg.UniqueViolationError)
    assert results[0].constraint_name == "uq_jobs_provider_request"
    assert [type(r).__name__ for r in results[1:]] == ["Written", "Written"]
    assert [(await row(engine, job.job_id)).provider_request_id for job in batch] == [
        None,
        "gen-2",
        "gen-3",
    ]


HOT_COUNTS = """
    SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
    WHERE relid = 'creation.jobs'::regclass"""


async def test_the_submitting_marker_updates_a_job_in_place_without_touching_an_index(
    engine: AsyncEngine,
) -> None:
    """SUBMITTING changes no indexed column of jobs, so PostgreSQL writes it as a
    heap-only (HOT) update: no entry in any of the table's indexes (migration 0014; an
    index keyed on updated_at made every update add one to each). The request id is keyed
    by uq_jobs_provider_request (one job per provider request, migration 0017): recording
    it, once per attempt, is the one step marker that adds index entries."""
    (job,) = await claimed(engine, 1)
    now = T0 + timedelta(seconds=1)
    async with driver_connection(engine) as connection, connection.transaction():
        # The view also holds this session's counts not yet sent to the statistics: the
        # difference is this transaction's.
        before = await connection.fetchrow(HOT_COUNTS)
        for write, value in (
            (FencedWrite.MARK_SUBMITTING, None),
            (FencedWrite.RECORD_REQUEST, "req-hot"),
        ):
            written = await connection.fetch(
                brief(write), now, [job.job_id], [job.lease_epoch], [value]
            )
            assert [r["job_id"] for r in written] == [uuid.UUID(job.job_id)]
        after = await connection.fetchrow(HOT_COUNTS)
    updates, hot = (after[k] - (before[k] if before else 0) for k in ("n_tup_upd", "n_tup_hot_upd"))
    assert (updates, hot) == (2, 1)
