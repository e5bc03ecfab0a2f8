"""WatchAllJobs, the job feed for internal services, against two real notify processes over
one PostgreSQL and one Redis: job changes of several users reach a feed on each replica;
one replica is killed in the middle of a run of changes and started again, and its feed,
resumed from its last cursor, gets every job that changed meanwhile, at its latest
version, and no version twice. Then the filters, and the refusals (each before any
message)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_feed_service_pb2 as pb
from atelier.notify.v1 import notify_feed_service_pb2_grpc, notify_service_pb2
from tests.support.job_feed import (
    OTHER,
    READER,
    FeedReader,
    NotifyProcess,
    bearer,
    deliver,
    job,
    notify_env,
)
from tests.support.notify_streams import OwnRedis
from tests.support.rpc import bad_request, error_info, retry_delay

ROOT = Path(__file__).resolve().parents[3]
QUEUED = job_pb2.JOB_STATUS_QUEUED
RUNNING = job_pb2.JOB_STATUS_RUNNING
SUCCEEDED = job_pb2.JOB_STATUS_SUCCEEDED
# A small replay bound, so that a test can pass it.
REPLAY_LIMIT = 50


@dataclass
class Fleet:
    a: NotifyProcess
    b: NotifyProcess


@pytest.fixture(scope="module")
def fleet(notify_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("job-feed")
    redis = OwnRedis(work)
    redis.start()
    # The backstop and the keep-alives (which wake a feed too) far off: what reaches a
    # feed on the other replica within a test's wait came through Redis
    # (test_without_redis_the_backstop_feeds_the_other_replica covers the backstop).
    env = notify_env(
        notify_url,
        redis.url,
        FEED_REPLAY_LIMIT=str(REPLAY_LIMIT),
        # Small pages: a resume and a filtered read take several.
        FEED_PAGE_SIZE="4",
        POLL_PERIOD="60",
        STREAM_KEEP_ALIVE="120",
    )
    replicas = [NotifyProcess(name, env, work / "logs") for name in ("notify-a", "notify-b")]
    try:
        for replica in replicas:
            replica.start()
        yield Fleet(*replicas)
    finally:
        for replica in replicas:
            replica.stop()
        redis.stop()


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


def new_job() -> str:
    return str(uuid.uuid4())


def strictly_increasing(reader: FeedReader, job_ids: set[str]) -> None:
    for job_id, versions in reader.versions_per_job().items():
        if job_id in job_ids:
            assert versions == sorted(set(versions)), (job_id, versions)


async def test_two_replicas_each_feed_every_users_changes_and_a_restart_loses_nothing(
    fleet: Fleet,
) -> None:
    a, b = fleet.a, fleet.b
    jobs = {new_job(): new_user() for _ in range(6)}
    on_a, on_b = FeedReader(a.internal_address), FeedReader(b.internal_address)
    try:
        await on_a.caught_up()
        await on_b.caught_up()
        final: dict[str, int] = {}

        async def round_of(version: int, via: NotifyProcess, only: dict[str, str]) -> None:
            status = QUEUED if version == 1 else RUNNING if version < 8 else SUCCEEDED
            await deliver(
                via.internal_address, [job(j, u, version, status) for j, u in only.items()]
            )
            final.update(dict.fromkeys(only, version))

        # Deliveries to either replica reach the feeds on both (Redis pokes the other).
        for version, via in ((1, a), (2, b), (3, a)):
            await round_of(version, via, jobs)
        await on_a.wait_for(lambda r: r.has(final))
        await on_b.wait_for(lambda r: r.has(final))

        # B dies in the middle of a run of changes; jobs keep changing through A, and new
        # jobs of a new user appear, while B is away.
        async def run_of_changes() -> None:
            for version in range(4, 9):
                await round_of(version, a, jobs)
                if version == 5:
                    b.kill()
                    late = {new_job(): new_user() for _ in range(2)}
                    jobs.update(late)
                    for early in range(1, 6):
                        await round_of(early, a, late)

        await run_of_changes()
        await asyncio.wait_for(on_b.ended.wait(), 30)
        assert on_b.error is not None and on_b.error.code() == grpc.StatusCode.UNAVAILABLE
        had, before = on_b.latest(), len(on_b.states)
        assert not on_b.has(final)  # it missed something: the resume has work to do

        b.start()
        await on_b.reconnect(b.internal_address)
        await on_b.wait_for(lambda r: r.has(final) and r.snapshot_ends >= 2)
        await on_a.wait_for(lambda r: r.has(final))
        assert on_b.error is None and on_a.error is None
        # What the resumed stream sent is exactly what changed since its cursor: each job
        # it had not seen at its final version, once, and nothing it already had.
        resumed = [s.job_id for s in on_b.states[before:] if s.job_id in jobs]
        assert sorted(resumed) == sorted(j for j in jobs if had.get(j, 0) < final[j])

        # Live again on the restarted replica, both ways: a deletion delivered to B.
        gone = next(iter(jobs))
        await deliver(b.internal_address, [job(gone, jobs[gone], 9, SUCCEEDED, deleted=True)])
        final[gone] = 9
        await on_a.wait_for(lambda r: r.has(final))
        await on_b.wait_for(lambda r: r.has(final))
        assert [s.deleted for s in on_a.states if s.job_id == gone][-1]

        for reader in (on_a, on_b):
            strictly_increasing(reader, set(jobs))
            assert {j: v for j, v in reader.latest().items() if j in jobs} == final
    finally:
        await on_a.close()
        await on_b.close()


async def test_a_draining_replica_ends_its_feed_with_a_retry_delay_and_another_resumes_it(
    fleet: Fleet,
) -> None:
    job_id, user = new_job(), new_user()
    feed = FeedReader(fleet.b.internal_address)
    try:
        await feed.caught_up()
        await deliver(fleet.a.internal_address, [job(job_id, user, 1, QUEUED)])
        await feed.wait_for(lambda r: r.has({job_id: 1}))
        fleet.b.terminate()
        await asyncio.wait_for(feed.ended.wait(), 30)
        assert feed.error is None  # ended on purpose, status OK
        assert [e.reason for e in feed.ends] == [notify_service_pb2.STREAM_END_REASON_DRAINING]
        assert feed.ends[0].retry_delay.ToMilliseconds() > 0
        await deliver(fleet.a.internal_address, [job(job_id, user, 2, RUNNING)])
        await feed.reconnect(fleet.a.internal_address)
        await feed.wait_for(lambda r: r.has({job_id: 2}))
        assert feed.versions_per_job()[job_id] == [1, 2]
    finally:
        await feed.close()
        fleet.b.start()


async def test_filters_by_user_and_by_model_on_either_replica(fleet: Fleet) -> None:
    u1, u2 = new_user(), new_user()
    jobs = {(u, m): new_job() for u in (u1, u2) for m in ("model-one", "model-two")}
    feeds = {
        "u1": FeedReader(fleet.a.internal_address, user_ids=[u1]),
        "model-two": FeedReader(fleet.a.internal_address, model_ids=["model-two"]),
        "u1 and model-two": FeedReader(
            fleet.b.internal_address, user_ids=[u1], model_ids=["model-two"]
        ),
        "u2 or nobody": FeedReader(fleet.b.internal_address, user_ids=[u2, new_user()]),
    }
    wanted = {
        "u1": {jobs[u1, "model-one"], jobs[u1, "model-two"]},
        "model-two": {jobs[u1, "model-two"], jobs[u2, "model-two"]},
        "u1 and model-two": {jobs[u1, "model-two"]},
        "u2 or nobody": {jobs[u2, "model-one"], jobs[u2, "model-two"]},
    }
    try:
        for feed in feeds.values():
            await feed.caught_up()
        for version, via in ((1, fleet.a), (2, fleet.b), (3, fleet.a)):
            status = QUEUED if version == 1 else RUNNING
            await deliver(
                via.internal_address,
                [job(j, u, version, status, model_id=m) for (u, m), j in jobs.items()],
            )
        # The last round's states come after every earlier row: once a feed has them, it
        # would have had any state its filter should have left out.
        for name, feed in feeds.items():
            await feed.wait_for(lambda r, name=name: r.has(dict.fromkeys(wanted[name], 3)))
            assert {s.job_id for s in feed.states} == wanted[name], name
            strictly_increasing(feed, wanted[name])
    finally:
        for feed in feeds.values():
            await feed.close()


async def test_a_resumed_filtered_feed_starts_past_the_changes_its_filter_left_out(
    fleet: Fleet,
) -> None:
    user, other = new_user(), new_user()
    feed = FeedReader(fleet.a.internal_address, user_ids=[user], model_ids=["model-one"])
    try:
        await feed.caught_up()
        mine, theirs = new_job(), new_job()
        await deliver(fleet.a.internal_address, [job(mine, user, 1, QUEUED, model_id="model-one")])
        await feed.wait_for(lambda r: r.has({mine: 1}))
        await deliver(fleet.a.internal_address, [job(theirs, other, 1, QUEUED)])
        await feed.reconnect(fleet.b.internal_address)
        await feed.caught_up(2)
        await deliver(fleet.b.internal_address, [job(mine, user, 2, RUNNING, model_id="model-one")])
        await feed.wait_for(lambda r: r.has({mine: 2}))
        assert [(s.job_id, s.version) for s in feed.states] == [(mine, 1), (mine, 2)]
    finally:
        await feed.close()


async def _refusal(
    address: str, request: pb.WatchAllJobsRequest, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError:
    """The error a WatchAllJobs stream ends with; it must come before any message."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = notify_feed_service_pb2_grpc.NotifyFeedServiceStub(channel).WatchAllJobs(
            request, metadata=metadata, timeout=20
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for message in call:
                pytest.fail(f"a message came before the refusal: {message}")
    return caught.value


async def test_refusals_come_before_any_message_with_a_stable_reason(fleet: Fleet) -> None:
    address = fleet.a.internal_address
    anything = pb.WatchAllJobsRequest()

    missing = await _refusal(address, anything)
    assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(missing).reason == "SERVICE_CREDENTIAL_MISSING"

    # A valid identity that is not granted the feed (it may call Deliver).
    denied = await _refusal(address, anything, bearer(OTHER))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    info = error_info(denied)
    assert info.reason == "RPC_NOT_PERMITTED"
    assert info.metadata["identity"] == "other"
    assert info.metadata["method"] == "/atelier.notify.v1.NotifyFeedService/WatchAllJobs"

    for request, reason, field in [
        (pb.WatchAllJobsRequest(cursor="yesterday"), "INVALID_CURSOR", "cursor"),
        (pb.WatchAllJobsRequest(user_ids=["a user"]), "INVALID_FEED_FILTER", "user_ids[0]"),
        (pb.WatchAllJobsRequest(model_ids=["ok", ""]), "INVALID_FEED_FILTER", "model_ids[1]"),
        (pb.WatchAllJobsRequest(user_ids=["u"] * 101), "INVALID_FEED_FILTER", "user_ids"),
    ]:
        bad = await _refusal(address, request, bearer(READER))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        assert error_info(bad).reason == reason
        found = bad_request(bad)
        assert found is not None and [v.field for v in found.field_violations] == [field]

    ahead = await _refusal(address, pb.WatchAllJobsRequest(cursor="s999999999999"), bearer(READER))
    assert ahead.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(ahead).reason == "CURSOR_EXPIRED"

    # A cursor with more jobs changed since than a replay holds.
    feed = FeedReader(address)
    await feed.caught_up()
    await feed.close()
    user = new_user()
    await deliver(address, [job(new_job(), user, 1, QUEUED) for _ in range(REPLAY_LIMIT + 1)])
    old = await _refusal(address, pb.WatchAllJobsRequest(cursor=feed.cursor), bearer(READER))
    assert old.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(old).reason == "CURSOR_EXPIRED"
    assert str(REPLAY_LIMIT) in (old.details() or "")


async def test_the_feed_is_not_served_on_the_public_listener(fleet: Fleet) -> None:
    refused = await _refusal(
        f"127.0.0.1:{fleet.a.public}", pb.WatchAllJobsRequest(), bearer(READER)
    )
    assert refused.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_without_redis_the_backstop_feeds_the_other_replica(
    notify_url: str, tmp_path: Path
) -> None:
    env = notify_env(notify_url, "", POLL_PERIOD="0.5")
    a, b = (NotifyProcess(name, env, tmp_path / "logs") for name in ("solo-a", "solo-b"))
    try:
        a.start()
        b.start()
        on_b = FeedReader(b.internal_address)
        await on_b.caught_up()
        job_id, user = new_job(), new_user()
        for version in (1, 2):
            await deliver(a.internal_address, [job(job_id, user, version, RUNNING)])
            await on_b.wait_for(lambda r, v=version: r.has({job_id: v}), within=20)
        await on_b.close()
    finally:
        a.stop()
        b.stop()


def test_the_grpcurl_examples_of_docs_feed_md_work(fleet: Fleet) -> None:
    """docs/feed.md's commands, pointed at replica A, each bounded to a few seconds (a feed
    never ends by itself): the first prints the caught-up marker, the second (with a real
    cursor in place of the page's `s42`) the filtered job changed after it."""
    block = re.search(r"^```sh\n(.*?)^```", (ROOT / "docs" / "feed.md").read_text(), re.M | re.S)
    assert block is not None
    lines = block.group(1).replace("\\\n", " ").splitlines()
    commands = [c for c in lines if c.strip() and not c.startswith("#")]
    assert len(commands) == 2
    cursor = asyncio.run(_a_cursor(fleet))
    job_id = new_job()
    asyncio.run(
        deliver(
            fleet.a.internal_address, [job(job_id, "dev-user", 1, QUEUED, model_id="stub-fast")]
        )
    )
    outputs = []
    for command in commands:
        command = command.replace("127.0.0.1:50063", fleet.a.internal_address)
        command = command.replace("-plaintext", "-plaintext -max-time 5").replace("s42", cursor)
        result = subprocess.run(
            ["bash", "-c", command],
            env={**os.environ, "BACKEND": READER},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "DeadlineExceeded" in result.stderr, result.stderr  # cut by -max-time only
        outputs.append(result.stdout)
    assert '"snapshot_end"' in outputs[0]
    assert job_id in outputs[1] and '"snapshot_end"' in outputs[1]


async def _a_cursor(fleet: Fleet) -> str:
    feed = FeedReader(fleet.a.internal_address)
    await feed.caught_up()
    await feed.close()
    return feed.cursor


async def test_a_database_failure_after_the_first_message_ends_the_feed_with_an_error_message(
    notify_url: str, tmp_path: Path
) -> None:
    """The projection held under an exclusive lock while the feed reads every half second:
    its next read gives up after the lock timeout, and the stream ends with the error as
    its last message (ErrorInfo, RetryInfo), then as its status; a reconnect with the
    cursor resumes once the lock is gone."""
    solo = NotifyProcess("locked", notify_env(notify_url, "", POLL_PERIOD="0.5"), tmp_path / "l")
    solo.start()
    feed = FeedReader(solo.internal_address)
    try:
        await feed.caught_up()
        job_id, user = new_job(), new_user()
        await deliver(solo.internal_address, [job(job_id, user, 1, QUEUED)])
        await feed.wait_for(lambda r: r.has({job_id: 1}))
        locker = await asyncpg.connect(notify_url)
        try:
            async with locker.transaction():
                await locker.execute("LOCK TABLE notify.job_states IN ACCESS EXCLUSIVE MODE")
                await asyncio.wait_for(feed.ended.wait(), 30)
        finally:
            await locker.close()
        assert feed.error is not None
        assert feed.error.code() == grpc.StatusCode.ABORTED
        assert error_info(feed.error).reason == "LOCK_TIMEOUT"
        assert retry_delay(feed.error) is not None
        [last] = feed.error_messages
        assert last.code == grpc.StatusCode.ABORTED.value[0]
        await deliver(solo.internal_address, [job(job_id, user, 2, RUNNING)])
        await feed.reconnect(solo.internal_address)
        await feed.wait_for(lambda r: r.has({job_id: 2}))
        assert feed.versions_per_job()[job_id] == [1, 2]
    finally:
        await feed.close()
        solo.stop()
