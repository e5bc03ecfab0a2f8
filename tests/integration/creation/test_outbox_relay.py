"""The outbox relay against real PostgreSQL and a real notify server: it delivers every
row and marks it delivered, a job's versions taken in one batch as one message of its
newest state; a NOTIFY wakes it long before its poll; delivered twice and out of order
(its fault injection) no version moves back; two replicas share the queue (SKIP LOCKED)
and deliver each row once; while notify is down it retries, says so in one throttled
line, and catches up by itself when notify returns; old delivered rows are pruned, and
so are the remote workers' ended claims and answers (a replay first sent before the
retention refused with a stable reason)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.domain import Job
from services.creation.media_client import MediaClient
from services.creation.relay.notify_client import NotifyClient
from services.creation.relay.pruning import Pruning, remote_prunings
from services.creation.relay.relay import OutboxRelay
from services.creation.remote.errors import CallReplayExpired, ClaimReplayExpired
from services.creation.remote.service import CallKey, LeaseClaim, RemoteJobs
from services.creation.remote.settings import RemoteSettings
from services.creation.settings import RelaySettings
from services.creation.store import jobs as store
from services.creation.tables import jobs as job_rows
from services.creation.tables import outbox, remote_calls, remote_claims
from services.dev.processes import free_port
from services.kit.client_times import CLIENT_CLOCK_SKEW
from services.kit.clock import Clock, SettableClock, system_clock
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_SERVICE_TOKEN
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.support.databases import migrated_database
from tests.support.notify import NotifyHarness, RecordingPublisher, running_notify

FAST = RelaySettings(
    batch=7,
    poll_seconds=0.2,
    backoff_base_seconds=0.01,
    backoff_max_seconds=0.05,
    deliver_timeout_seconds=2,
    retention_seconds=86400,
    prune_period_seconds=3600,
)


@pytest.fixture(scope="module")
def notify_url(postgres_admin_url: str) -> Iterator[str]:
    with migrated_database(postgres_admin_url, "notify") as url:
        yield url


@pytest.fixture
async def notify_db(notify_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(notify_url))
    async with engine.begin() as connection:
        await connection.execute(text("TRUNCATE notify.job_states"))
    yield engine
    await engine.dispose()


@pytest.fixture
async def notify(notify_url: str, notify_db: AsyncEngine) -> AsyncIterator[NotifyHarness]:
    async with running_notify(notify_url) as harness:
        yield harness


@asynccontextmanager
async def relaying(
    engine: AsyncEngine,
    url: str,
    address: str,
    settings: RelaySettings = FAST,
    *,
    clock: Clock = system_clock,
    prunings: Sequence[Pruning] = (),
) -> AsyncIterator[OutboxRelay]:
    client = NotifyClient(address, DEV_SERVICE_TOKEN, settings.deliver_timeout_seconds)
    relay = OutboxRelay(engine, client, settings, url, clock=clock, prunings=prunings)
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        await relay.stop(asyncio.get_running_loop().time() + 5)
        await asyncio.wait_for(task, 10)
        await client.close()


async def jobs_with_versions(engine: AsyncEngine, jobs: int, versions: int) -> dict[str, int]:
    """``jobs`` submitted jobs, each moved on to version ``versions`` by one change per
    version (a new version by hand, as a worker's progress writes one: its own outbox
    row); job id -> last version."""
    made = [
        (await store.submit(engine, new_user(), command(), LIMITS, T0)).job.job_id
        for _ in range(jobs)
    ]
    for _ in range(2, versions + 1):
        async with engine.begin() as connection:
            await connection.execute(
                update(job_rows)
                .where(job_rows.c.job_id.in_(made))
                .values(version=job_rows.c.version + 1)
            )
    return dict.fromkeys(made, versions)


async def undelivered(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        query = select(func.count()).select_from(outbox).where(outbox.c.delivered_at.is_(None))
        return int((await connection.execute(query)).scalar_one())


async def projected(notify_db: AsyncEngine) -> dict[str, int]:
    async with notify_db.connect() as connection:
        rows = await connection.execute(text("SELECT job_id, version FROM notify.job_states"))
        return {str(r.job_id): int(r.version) for r in rows}


async def eventually(check: Callable[[], Any], within: float = 15.0) -> None:
    """Awaits ``check()`` (sync or async) until it is true; fails after ``within``."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


async def test_the_relay_delivers_every_row_and_marks_it_delivered(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness, notify_db: AsyncEngine
) -> None:
    expected = await jobs_with_versions(engine, jobs=12, versions=6)
    async with relaying(engine, creation_url, notify.internal_address) as relay:

        async def done() -> bool:
            return await undelivered(engine) == 0

        await eventually(done)
        # A relay counts a batch once its commit has returned and its connection is back
        # in the pool: a batch this test sees committed may be counted a moment later.
        await eventually(lambda: relay.delivered >= 12 * 6)
        assert relay.delivered == 12 * 6
    assert await projected(notify_db) == expected
    # In order and once each, every job's announcements rise.
    for versions in notify.publisher.versions().values():
        assert versions == sorted(set(versions))


async def test_a_new_row_wakes_the_relay_long_before_its_poll(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness, notify_db: AsyncEngine
) -> None:
    slow_poll = dataclasses.replace(FAST, poll_seconds=60)
    async with relaying(engine, creation_url, notify.internal_address, slow_poll) as relay:
        await relay.listener.connected.wait()
        await eventually(lambda: relay.calls == 0 and relay.delivered == 0)
        started = time.monotonic()
        made = await jobs_with_versions(engine, jobs=1, versions=1)
        await eventually(lambda: relay.delivered == 1, within=5)
        assert time.monotonic() - started < 5  # the NOTIFY, not the 60 s poll
    assert await projected(notify_db) == made


async def test_every_batch_twice_reversed_and_late_moves_no_version_back(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness, notify_db: AsyncEngine
) -> None:
    expected = await jobs_with_versions(engine, jobs=9, versions=8)
    faulty = dataclasses.replace(FAST, batch=5, fault="duplicate_reversed")
    async with relaying(engine, creation_url, notify.internal_address, faulty) as relay:

        async def done() -> bool:
            return await undelivered(engine) == 0 and await projected(notify_db) == expected

        await eventually(done)
        batches = -(-len(expected) * 8 // faulty.batch)
        assert relay.calls >= 2 * batches  # each batch went out twice
    announced = notify.publisher.versions()
    assert set(announced) == set(expected)
    for job_id, versions in announced.items():
        # Each version at most once, each later than the one before; the last one last.
        assert versions == sorted(set(versions)), versions
        assert versions[-1] == expected[job_id]


async def test_two_replicas_share_the_queue_and_deliver_each_row_once(
    engine: AsyncEngine, creation_url: str, notify_url: str, notify_db: AsyncEngine
) -> None:
    # A fan-out that takes a little while keeps each Deliver open, so while one replica
    # holds its batch the other must take the next rows, not the same ones.
    publisher = RecordingPublisher(pause=0.03)
    expected = await jobs_with_versions(engine, jobs=20, versions=10)
    async with (
        running_notify(notify_url, publisher) as notify,
        relaying(engine, creation_url, notify.internal_address) as first,
        relaying(engine, creation_url, notify.internal_address) as second,
    ):

        async def done() -> bool:
            return await undelivered(engine) == 0

        await eventually(done, within=30)
        # Counted once each commit has returned (see above): wait for the counts, then
        # judge them (a row taken twice would make more than 200).
        await eventually(lambda: first.delivered + second.delivered >= 200)
        assert first.delivered > 0 and second.delivered > 0
        assert first.delivered + second.delivered == 200  # no row taken twice
    assert await projected(notify_db) == expected


async def test_notify_down_then_back_costs_one_log_line_and_no_restart(
    engine: AsyncEngine,
    creation_url: str,
    notify_url: str,
    notify_db: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()  # where notify will be; nothing listens there yet
    expected = await jobs_with_versions(engine, jobs=5, versions=4)
    async with relaying(engine, creation_url, f"127.0.0.1:{port}") as relay:
        await eventually(lambda: relay.failed_rounds >= 30)
        assert await undelivered(engine) == 20  # nothing marked while notify is away
        outage_lines = [
            r
            for r in caplog.records
            if r.getMessage() == "dependency_unavailable" and r.fields["dependency"] == "notify"  # type: ignore[attr-defined]
        ]
        assert len(outage_lines) == 1  # one line per window, not one per retry
        assert not [r for r in caplog.records if r.exc_info]

        async with running_notify(notify_url, internal_port=port):

            async def caught_up() -> bool:
                return await undelivered(engine) == 0

            await eventually(caught_up)
        again = [r for r in caplog.records if r.getMessage() == "relay_delivering_again"]
        assert len(again) == 1
        assert again[0].fields["failed_rounds"] >= 30  # type: ignore[attr-defined]
    assert await projected(notify_db) == expected


async def test_delivered_rows_are_pruned_after_the_retention(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness
) -> None:
    await jobs_with_versions(engine, jobs=3, versions=1)
    now = datetime.now(UTC)
    async with engine.begin() as connection:
        ids = (
            (await connection.execute(select(outbox.c.outbox_id).order_by(outbox.c.outbox_id)))
            .scalars()
            .all()
        )
        old, recent, waiting = ids
        for outbox_id, delivered in ((old, now - timedelta(hours=2)), (recent, now)):
            await connection.execute(
                outbox.update()
                .where(outbox.c.outbox_id == outbox_id)
                .values(delivered_at=delivered)
            )
    keep_an_hour = dataclasses.replace(FAST, retention_seconds=3600)
    async with relaying(engine, creation_url, notify.internal_address, keep_an_hour) as relay:

        async def pruned() -> bool:
            async with engine.connect() as connection:
                left = await connection.execute(select(outbox.c.outbox_id))
                return set(left.scalars()) == {recent, waiting}

        await eventually(pruned)
        assert relay.delivered == 1  # the waiting row went out; the other two were done


REMOTE = RemoteSettings(retention_seconds=7 * 86400)


async def remote_rows(engine: AsyncEngine) -> tuple[set[str], set[str]]:
    """The request ids of the stored claims and of the stored calls."""
    async with engine.connect() as connection:
        claims = await connection.execute(select(remote_claims.c.request_id))
        calls = await connection.execute(select(remote_calls.c.request_id))
        return set(claims.scalars()), set(calls.scalars())


async def test_remote_claims_and_answers_are_pruned_after_the_retention_unless_held(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness
) -> None:
    """A claim whose lease ended, an empty claim and a released job's answer go once
    older than the retention; a held lease keeps its claim and its answers, so it still
    replays. A request first sent before the retention is refused, pruned or not."""
    await jobs_with_versions(engine, jobs=2, versions=1)
    clock = SettableClock(T0 + timedelta(minutes=1))
    media = MediaClient("127.0.0.1:9", DEV_SERVICE_TOKEN)  # never called by these calls
    jobs = RemoteJobs(engine, media, REMOTE, clock, backoff_base_seconds=1, backoff_max_seconds=2)
    ended = await jobs.claim("gpu", "claim-ended", "a" * 64, "w", 60)
    held = await jobs.claim("gpu", "claim-held", "b" * 64, "w", 60)
    assert ended is not None and held is not None
    assert await jobs.claim("gpu", "claim-empty", "c" * 64, "w", 60) is None

    def lease(job: Job, token: str) -> LeaseClaim:
        return LeaseClaim("gpu", "w", job.job_id, token, job.lease_epoch)

    release = CallKey("call-release", "ReleaseJob", "r")
    await jobs.release(lease(ended, "a" * 64), release, ended.version, timedelta(0), lambda _: b"r")
    start = CallKey("call-start", "StartJob", "s")
    started = await jobs.start(lease(held, "b" * 64), start, held.version, None, lambda _: b"s")
    assert await remote_rows(engine) == (
        {"claim-ended", "claim-held", "claim-empty"},
        {"call-release", "call-start"},
    )

    # Past the retention and the clients' clock skew (a request_time may be that far
    # ahead of the server's clock when the row was written).
    clock.advance(REMOTE.retention_seconds + CLIENT_CLOCK_SKEW.total_seconds() + 60)
    prunings = remote_prunings(REMOTE.retention_seconds)
    async with relaying(
        engine, creation_url, notify.internal_address, clock=clock, prunings=prunings
    ):

        async def pruned() -> bool:
            return await remote_rows(engine) == ({"claim-held"}, {"call-start"})

        await eventually(pruned)

    # The held lease's answer still replays (the job still runs under it).
    assert (
        await jobs.start(lease(held, "b" * 64), start, held.version, None, lambda _: b"x")
        == started
    )
    # Sent before the retention: refused with a stable reason, whatever is stored.
    sent = T0 + timedelta(seconds=30)
    with pytest.raises(ClaimReplayExpired):
        await jobs.claim("gpu", "claim-ended", "a" * 64, "w", 60, sent)
    with pytest.raises(CallReplayExpired):
        stale = dataclasses.replace(start, sent_at=sent)
        await jobs.start(lease(held, "b" * 64), stale, held.version, None, lambda _: b"x")
    await media.close()


async def test_a_job_whose_message_is_no_job_is_logged_and_does_not_block_the_queue(
    engine: AsyncEngine,
    creation_url: str,
    notify: NotifyHarness,
    notify_db: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = await jobs_with_versions(engine, jobs=3, versions=2)
    broken, *fine = expected
    async with engine.begin() as connection:
        # Written by hand: a parameter value no ParameterValue reads (no version moves)...
        await connection.execute(
            update(job_rows)
            .where(job_rows.c.job_id == broken)
            .values(parameters={"seed": {"intValue": "forty-two"}})
        )
        # ...then a new version, whose row the relay takes with the job's other two.
        await connection.execute(
            update(job_rows)
            .where(job_rows.c.job_id == broken)
            .values(version=job_rows.c.version + 1)
        )
    async with relaying(engine, creation_url, notify.internal_address):

        async def done() -> bool:
            return await undelivered(engine) == 0

        await eventually(done)
    assert await projected(notify_db) == {job_id: expected[job_id] for job_id in fine}
    unreadable = [r for r in caplog.records if r.getMessage() == "outbox_row_unreadable"]
    assert len(unreadable) == 1 and unreadable[0].levelno == logging.ERROR


async def test_a_jobs_versions_in_one_batch_go_as_one_message_of_its_newest_state(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness, notify_db: AsyncEngine
) -> None:
    expected = await jobs_with_versions(engine, jobs=4, versions=5)
    one_batch = dataclasses.replace(FAST, batch=100)
    async with relaying(engine, creation_url, notify.internal_address, one_batch) as relay:

        async def done() -> bool:
            return await undelivered(engine) == 0

        await eventually(done)
        await eventually(lambda: relay.delivered == 4 * 5)  # every row marked delivered...
        assert relay.messages == 4  # ...as one message per job
        assert relay.calls == 1
    assert await projected(notify_db) == expected
    assert notify.publisher.versions() == {job_id: [5] for job_id in expected}


async def test_rows_written_soon_after_a_round_began_wait_and_go_together(
    engine: AsyncEngine, creation_url: str, notify: NotifyHarness, notify_db: AsyncEngine
) -> None:
    # A spacing far above what five commits take even on a loaded machine.
    spaced = dataclasses.replace(FAST, poll_seconds=60, round_spacing_seconds=8)
    async with relaying(engine, creation_url, notify.internal_address, spaced) as relay:
        await relay.listener.connected.wait()
        first = await jobs_with_versions(engine, jobs=1, versions=1)
        await eventually(lambda: relay.delivered == 1)  # at once: after a quiet spell
        assert relay.calls == 1
        # Five commits (five NOTIFYs) within the spacing of the round that began.
        started = time.monotonic()
        later = {}
        for _ in range(5):
            later.update(await jobs_with_versions(engine, jobs=1, versions=1))
        assert time.monotonic() - started < spaced.round_spacing_seconds
        await eventually(lambda: relay.delivered == 6, within=30)
        assert relay.calls == 2  # one Deliver for the five
    assert await projected(notify_db) == {**first, **later}
