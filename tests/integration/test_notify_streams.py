"""The client streams against real PostgreSQL and a real Redis the test controls: notify
replicas run in the test's loop; a stand-in for Deliver applies rows to the projection
and calls the replica's publisher, as Deliver does after its commit."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.db import asyncpg_url
from services.notify.store import StreamReads
from services.notify.streams.change import Snapshot
from tests.support.databases import migrated_database
from tests.support.notify_streams import (
    OwnRedis,
    Replica,
    replica,
    settings,
    watch_job,
    watch_jobs,
)
from tests.support.projection import Applied, apply, ensure_table, job_state
from tests.support.rpc import error_info

QUEUED = job_pb2.JOB_STATUS_QUEUED
RUNNING = job_pb2.JOB_STATUS_RUNNING
SUCCEEDED = job_pb2.JOB_STATUS_SUCCEEDED


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture
async def db(notify_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(notify_url))
    await ensure_table(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


async def deliver(
    db: AsyncEngine,
    rep: Replica,
    job_id: str,
    user: str,
    version: int,
    status: int,
    progress: int = 0,
) -> None:
    """What Deliver does: apply (version-gated), commit, then publish what was applied."""
    applied = await apply(db, [job_state(job_id, user, version, status, progress)])
    await rep.streams.publisher.publish(applied)


async def test_watch_job_sends_the_current_state_then_newer_ones_and_ends_after_the_terminal(
    db: AsyncEngine, notify_url: str
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, job, user, 1, QUEUED)
        reader = watch_job(rep, user, job)
        assert (await reader.next()).job.version == 1
        await deliver(db, rep, job, user, 2, RUNNING, 10)
        await deliver(db, rep, job, user, 3, RUNNING, 60)
        await deliver(db, rep, job, user, 4, SUCCEEDED, 100)
        versions = []
        while len(versions) == 0 or versions[-1] != 4:
            versions.append((await reader.next()).job.version)
        assert versions == sorted(set(versions))
        assert versions[-1] == 4
        await asyncio.wait_for(reader.done.wait(), 5)
        assert reader.error is None  # closed with OK after the terminal state


async def test_watch_job_resumes_after_a_version_and_ends_at_once_when_it_had_the_end(
    db: AsyncEngine, notify_url: str
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, job, user, 1, QUEUED)
        await deliver(db, rep, job, user, 2, RUNNING, 30)
        reader = watch_job(rep, user, job, after_version=2)
        await deliver(db, rep, job, user, 3, SUCCEEDED, 100)
        assert (await reader.next()).job.version == 3
        await asyncio.wait_for(reader.done.wait(), 5)
        finished = watch_job(rep, user, job, after_version=3)
        await asyncio.wait_for(finished.done.wait(), 5)
        assert finished.error is None
        assert finished.pending() == []


async def test_another_users_job_is_not_found_and_bad_requests_are_refused(
    db: AsyncEngine, notify_url: str
) -> None:
    owner, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url, first_state_wait_seconds=0.2)) as rep:
        await deliver(db, rep, job, owner, 1, QUEUED)
        cases = [
            (watch_job(rep, new_user(), job), grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND"),
            (watch_job(rep, owner, str(uuid.uuid4())), grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND"),
            (watch_job(rep, owner, "nope"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JOB_ID"),
            # The owner's own job, spelled as creation would refuse it (the kit's one rule).
            *[
                (watch_job(rep, owner, spelled), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JOB_ID")
                for spelled in (f"{{{job}}}", job.replace("-", ""), f"urn:uuid:{job}")
            ],
            (
                watch_job(rep, owner, job, after_version=-1),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_AFTER_VERSION",
            ),
            (watch_jobs(rep, owner, "garbage"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CURSOR"),
        ]
        for reader, code, reason in cases:
            await asyncio.wait_for(reader.done.wait(), 5)
            assert reader.error is not None
            assert reader.error.code() == code
            assert error_info(reader.error).reason == reason
            assert reader.pending() == []  # refused before any message


async def test_watch_job_waits_for_a_job_the_projection_does_not_hold_yet(
    db: AsyncEngine, notify_url: str
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url, first_state_wait_seconds=5)) as rep:
        reader = watch_job(rep, user, job)
        # The stream must be open and waiting before the job appears.
        while rep.streams.registry.stream_count == 0:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await deliver(db, rep, job, user, 1, QUEUED)
        assert (await reader.next()).job.version == 1


async def test_duplicated_and_reordered_deliveries_reach_a_stream_once_and_in_order(
    db: AsyncEngine, notify_url: str
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, job, user, 1, QUEUED)
        reader = watch_job(rep, user, job)
        jobs_reader = watch_jobs(rep, user)
        assert (await reader.next()).job.version == 1
        # A relay that delivers every batch twice and out of order; the publisher is
        # also handed states the projection refused (as a faulty caller might).
        order = [3, 2, 3, 5, 4, 2, 5, 6, 6]
        for version in order:
            status = SUCCEEDED if version == 6 else RUNNING
            state = job_state(job, user, version, status, version * 10)
            applied = await apply(db, [state])
            await rep.streams.publisher.publish(applied)
            await rep.streams.publisher.publish([Applied(state, 10**9 + version)])
        seen = [1]
        while seen[-1] != 6:
            seen.append((await reader.next()).job.version)
        assert seen == sorted(set(seen))
        await asyncio.wait_for(reader.done.wait(), 5)
        many = []
        while not many or many[-1] != 6:
            message = await jobs_reader.next()
            if message.WhichOneof("event") == "job":
                many.append(message.job.version)
        assert many == sorted(set(many))


async def test_watch_jobs_snapshot_marker_live_changes_and_a_resume_gets_only_what_it_missed(
    db: AsyncEngine, notify_url: str
) -> None:
    user = new_user()
    done_before, running, later = (str(uuid.uuid4()) for _ in range(3))
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, done_before, user, 1, SUCCEEDED)
        await deliver(db, rep, running, user, 1, RUNNING, 20)
        first = watch_jobs(rep, user)
        # Afresh: the unfinished jobs only, then the marker with a cursor.
        snap = await first.next()
        assert (snap.job.job_id, snap.job.version) == (running, 1)
        marker = await first.next()
        assert marker.WhichOneof("event") == "snapshot_end"
        assert marker.cursor
        await deliver(db, rep, running, user, 2, RUNNING, 50)
        live = await first.next()
        assert (live.job.job_id, live.job.version) == (running, 2)
        cursor = live.cursor
        first.cancel()
        await first.done.wait()

        # Missed while disconnected: the running job finished, another job started.
        await deliver(db, rep, running, user, 3, SUCCEEDED, 100)
        await deliver(db, rep, later, user, 1, QUEUED)
        again = watch_jobs(rep, user, cursor)
        got = []
        while True:
            message = await again.next()
            if message.WhichOneof("event") == "snapshot_end":
                break
            got.append((message.job.job_id, message.job.version))
        assert sorted(got) == sorted([(running, 3), (later, 1)])
        assert done_before not in {job for job, _ in got}
        again.cancel()


async def test_a_backstop_pass_during_a_resumed_streams_snapshot_sends_nothing_it_had(
    db: AsyncEngine, notify_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop runs while the stream reads its snapshot (registered, no cursor of its
    own yet): the client gets only what moved after its cursor, never again a job it
    finished before (the backstop once asked for the user's whole history then)."""
    user = new_user()
    done_before, running = str(uuid.uuid4()), str(uuid.uuid4())
    async with replica(settings(notify_url, poll_period=60)) as rep:
        await deliver(db, rep, done_before, user, 1, SUCCEEDED)
        await deliver(db, rep, running, user, 1, RUNNING, 20)
        first = watch_jobs(rep, user)
        marker = await first.next("snapshot_end")
        first.cancel()
        await first.done.wait()
        await deliver(db, rep, running, user, 2, RUNNING, 50)

        read_snapshot = StreamReads.user_snapshot
        backstop_deliveries = []

        async def snapshot_after_a_backstop_pass(*args: Any) -> Snapshot:
            backstop_deliveries.append(await rep.streams.backstop.tick())
            return await read_snapshot(*args)

        monkeypatch.setattr(StreamReads, "user_snapshot", snapshot_after_a_backstop_pass)
        again = watch_jobs(rep, user, marker.cursor)
        got = []
        while (message := await again.next()).WhichOneof("event") != "snapshot_end":
            got.append((message.job.job_id, message.job.version))
        assert got == [(running, 2)]
        assert backstop_deliveries == [0]
        await deliver(db, rep, running, user, 3, SUCCEEDED, 100)
        live = await again.next()
        assert (live.job.job_id, live.job.version) == (running, 3)
        again.cancel()


async def test_watch_jobs_refuses_a_cursor_too_old_for_one_snapshot(
    db: AsyncEngine, notify_url: str
) -> None:
    user = new_user()
    async with replica(settings(notify_url, snapshot_limit=2)) as rep:
        first = watch_jobs(rep, user)
        marker = await first.next("snapshot_end")
        first.cancel()
        for _ in range(3):
            await deliver(db, rep, str(uuid.uuid4()), user, 1, SUCCEEDED)
        stale = watch_jobs(rep, user, marker.cursor)
        await asyncio.wait_for(stale.done.wait(), 5)
        assert stale.error is not None
        assert stale.error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(stale.error).reason == "CURSOR_EXPIRED"


async def test_watch_jobs_refuses_a_cursor_ahead_of_the_server_before_any_message(
    db: AsyncEngine, notify_url: str
) -> None:
    """A cursor the server never handed this user (its data was reset, a made-up or
    another user's cursor) would skip every change until the server caught up with it:
    it is refused like a cursor too old, so the client resyncs instead of hearing
    nothing."""
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, job, user, 1, RUNNING, 10)
        first = watch_jobs(rep, user)
        assert (await first.next("job")).job.job_id == job
        handed_out = (await first.next("snapshot_end")).cursor
        first.cancel()
        ahead = f"s{int(handed_out.removeprefix('s')) + 1000}"
        fresh_user = new_user()  # no change at all: the README's "s42" on a fresh stack
        for who, cursor in ((user, ahead), (user, "s99999999"), (fresh_user, "s42")):
            reader = watch_jobs(rep, who, cursor)
            await asyncio.wait_for(reader.done.wait(), 5)
            assert reader.error is not None, cursor
            assert reader.error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_info(reader.error).reason == "CURSOR_EXPIRED"
            assert reader.pending() == []  # refused before the first message
        # The cursor it was handed still resumes, and live changes reach it.
        resumed = watch_jobs(rep, user, handed_out)
        await resumed.next("snapshot_end")
        await deliver(db, rep, job, user, 2, RUNNING, 50)
        assert (await resumed.next("job")).job.version == 2
        resumed.cancel()


async def test_keep_alives_and_the_maximum_duration_end(db: AsyncEngine, notify_url: str) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(
        settings(notify_url, keep_alive_seconds=0.1, max_duration_seconds=1.0)
    ) as rep:
        await deliver(db, rep, job, user, 1, RUNNING)
        reader = watch_job(rep, user, job)
        await reader.next("job")
        assert (await reader.next("keep_alive")).keep_alive.send_time.seconds > 0
        end = await reader.next("end", within=3)
        assert end.end.reason == pb.STREAM_END_REASON_MAX_DURATION
        await asyncio.wait_for(reader.done.wait(), 5)
        assert reader.error is None


async def test_a_draining_replica_ends_its_streams_with_a_retry_delay(
    db: AsyncEngine, notify_url: str
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    async with replica(settings(notify_url)) as rep:
        await deliver(db, rep, job, user, 1, RUNNING)
        reader = watch_job(rep, user, job)
        many = watch_jobs(rep, user)
        await reader.next("job")
        await many.next("snapshot_end")
        stopping = asyncio.create_task(rep.running.stop())
        for stream in (reader, many):
            end = await stream.next("end")
            assert end.end.reason == pb.STREAM_END_REASON_DRAINING
            assert end.end.retry_delay.ToMilliseconds() > 0
            await asyncio.wait_for(stream.done.wait(), 5)
            assert stream.error is None
        await stopping


async def test_two_replicas_behind_one_redis(
    db: AsyncEngine, notify_url: str, own_redis: OwnRedis
) -> None:
    """A stream on B sees what is delivered to A, by Redis (the backstop is set far off)."""
    user, job = new_user(), str(uuid.uuid4())
    slow_backstop = {"redis_url": own_redis.url, "poll_period": 60}
    async with (
        replica(settings(notify_url, **slow_backstop)) as a,
        replica(settings(notify_url, **slow_backstop)) as b,
    ):
        await deliver(db, a, job, user, 1, QUEUED)
        on_b = watch_job(b, user, job)
        many_on_b = watch_jobs(b, user)
        assert (await on_b.next()).job.version == 1
        await many_on_b.next("snapshot_end")
        await _subscribed(own_redis, f"job:{job}", f"user:{user}")
        # B's backstop sweeps once a minute: only Redis can bring these within seconds
        # (and the counter says the backstop sent nothing). Latency itself is the bench's
        # figure (bench/notify_streams.py), not a wall-clock bound on a shared machine.
        for version, progress in ((2, 10), (3, 70)):
            await deliver(db, a, job, user, version, RUNNING, progress)
            assert (await on_b.next(within=5)).job.version == version
            assert (await many_on_b.next(within=5)).job.version == version
        assert b.streams.backstop.delivered == 0


async def _subscribed(own_redis: OwnRedis, *channels: str) -> None:
    """Waits until some replica listens on each channel (subscriptions are asynchronous)."""
    async with asyncio.timeout(5):
        # Redis's own state: nothing to await but asking it.
        while not all(own_redis.subscribers(c) for c in channels):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_redis_stopped_mid_stream_the_backstop_delivers_and_redis_back_is_fast_again(
    db: AsyncEngine, notify_url: str, own_redis: OwnRedis
) -> None:
    user, job = new_user(), str(uuid.uuid4())
    two_seconds = {"redis_url": own_redis.url, "poll_period": 2.0}
    async with (
        replica(settings(notify_url, **two_seconds)) as a,
        replica(settings(notify_url, **two_seconds)) as b,
    ):
        await deliver(db, a, job, user, 1, QUEUED)
        on_b = watch_job(b, user, job)
        assert (await on_b.next()).job.version == 1
        await _subscribed(own_redis, f"job:{job}")

        own_redis.stop()
        for version in (2, 3):
            started = time.monotonic()
            await deliver(db, a, job, user, version, RUNNING, version * 10)
            assert (await on_b.next(within=3)).job.version == version
            assert time.monotonic() - started < 2.6  # within one backstop period
        by_backstop = b.streams.backstop.delivered
        assert by_backstop >= 2

        own_redis.start()
        assert b.streams.redis is not None
        await asyncio.wait_for(b.streams.redis.connected.wait(), 10)
        await _subscribed(own_redis, f"job:{job}")
        # The publisher pauses after a failure; give A's pause time to lapse.
        await asyncio.sleep(1.1)
        for version in (4, 5):
            await deliver(db, a, job, user, version, RUNNING, version * 10)
            assert (await on_b.next(within=3)).job.version == version
        # Redis brought them, not a backstop sweep: no restart needed for the fast path.
        assert b.streams.backstop.delivered == by_backstop
