"""creation's operator metrics, read from the real /metrics endpoint of the service as
`atelier serve creation --role worker` assembles it, over HTTP, against real PostgreSQL:
the queue (depth, due, oldest age, by priority), jobs in NEEDS_ATTENTION, the outbox lag,
the reaper's decisions; and a database outage that leaves /metrics answering with the
last values and says the reading failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.creation.app import build
from services.creation.domain import Job, Status
from services.creation.providers.base import Provider
from services.creation.settings import CreationSettings
from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.store.backlog import BACKLOG_SQL
from services.creation.store.fenced import FencedWrite
from services.creation.worker.lease_keeper import LeaseKeeper
from services.dev.processes import free_port
from services.kit.clock import system_clock
from services.kit.db import asyncpg_url
from services.kit.metrics import serve_metrics
from services.kit.readings import PeriodicReading
from services.kit.server import RunningService
from services.kit.settings import ListenSettings
from tests.integration.creation.helpers import LIMITS, command, new_user
from tests.integration.creation.worker_kit import FakeProvider, engine_settings
from tests.support.fenced import fenced_write
from tests.support.pg_outage import OwnPostgres
from tests.support.scrape import Scrape, scrape, scrape_until

READING = "backlog-gauges"


@dataclass
class Served:
    running: RunningService
    metrics_port: int

    @property
    def gauges(self) -> PeriodicReading:
        [reading] = [c for c in self.running.app.components if c.name == READING]
        assert isinstance(reading, PeriodicReading)
        return reading

    async def fresh(self) -> Scrape:
        """A scrape after two more readings (so one began after the test's last change)."""
        await self.gauges.wait_rounds(2)
        return await scrape(self.metrics_port)


@asynccontextmanager
async def serving(
    settings: CreationSettings, providers: dict[str, Provider] | None = None
) -> AsyncIterator[Served]:
    app = build(settings, "worker", providers=providers)
    port = free_port()
    running = RunningService(app, settings.common, ListenSettings(0, 0, port))
    await running.start()
    try:
        yield Served(running, port)
    finally:
        await running.stop()


def settings_for(url: str, **extra: str) -> CreationSettings:
    # Nothing listens for media or notify: the relay keeps failing, so undelivered outbox
    # rows stay undelivered.
    return engine_settings(url, f"127.0.0.1:{free_port()}", GAUGES_PERIOD="0.05", **extra)


async def submit(engine: AsyncEngine, max_attempts: int = 3) -> Job:
    limits = replace(LIMITS, max_attempts=max_attempts)
    return (await store.submit(engine, new_user(), command(), limits, system_clock())).job


async def age_job(
    engine: AsyncEngine, job_id: str, seconds: float, *, priority: int = 0, due: bool = True
) -> None:
    """Makes a queued job ``seconds`` old on the database's clock."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE creation.jobs SET created_at = now() - make_interval(secs => :age),"
                " priority = :priority, next_attempt_at = CASE WHEN :due"
                " THEN now() - make_interval(secs => :age) ELSE now() + interval '1 hour' END"
                " WHERE job_id = :job_id"
            ),
            {"age": seconds, "priority": priority, "due": due, "job_id": job_id},
        )


async def leave_undelivered(engine: AsyncEngine, count: int, oldest_age: float) -> None:
    """Every outbox row delivered but the newest ``count``; the first of those is
    ``oldest_age`` seconds old."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE creation.outbox SET delivered_at = now() WHERE outbox_id NOT IN"
                " (SELECT outbox_id FROM creation.outbox ORDER BY outbox_id DESC LIMIT :n)"
            ),
            {"n": count},
        )
        await connection.execute(
            text(
                "UPDATE creation.outbox SET created_at = now() - make_interval(secs => :age)"
                " WHERE outbox_id = (SELECT min(outbox_id) FROM creation.outbox"
                " WHERE delivered_at IS NULL)"
            ),
            {"age": oldest_age},
        )


async def make_needs_attention(engine: AsyncEngine) -> Job:
    """A job whose worker died while submitting: the reaper cannot know whether the
    provider has it."""
    job = await submit(engine)
    now = system_clock()
    [claimed] = await leases.claim(engine, "worker-gone", 1, timedelta(seconds=5), now)
    assert claimed.job_id == job.job_id
    assert (
        await fenced_write(
            engine, FencedWrite.MARK_SUBMITTING, job.job_id, claimed.lease_epoch, now
        )
        is not None
    )
    [reaped] = [r.job for r in await leases.reap_decided(engine, now + timedelta(minutes=1), 10)]
    assert reaped.status is Status.NEEDS_ATTENTION
    return reaped


def within(value: float, low: float, slack: float = 30.0) -> bool:
    return low <= value < low + slack


async def test_the_queue_attention_and_outbox_figures_match_the_database(
    engine: AsyncEngine, creation_url: str
) -> None:
    await make_needs_attention(engine)
    old, recent, waiting, urgent = [await submit(engine) for _ in range(4)]
    await age_job(engine, old.job_id, 300)
    await age_job(engine, recent.job_id, 10)
    await age_job(engine, waiting.job_id, 60, due=False)  # backing off before a retry
    await age_job(engine, urgent.job_id, 30, priority=5)
    await leave_undelivered(engine, 3, oldest_age=600)

    async with serving(settings_for(creation_url)) as served:
        got = await served.fresh()
        assert got.get("atelier_jobs_queued", priority="0") == 3
        assert got.get("atelier_jobs_queued_due", priority="0") == 2
        assert within(got.get("atelier_jobs_oldest_queued_age_seconds", priority="0"), 300)
        assert got.get("atelier_jobs_queued", priority="5") == 1
        assert within(got.get("atelier_jobs_oldest_queued_age_seconds", priority="5"), 30)
        assert got.get("atelier_jobs_needs_attention") == 1
        assert got.get("atelier_outbox_undelivered") == 3
        assert within(got.get("atelier_outbox_oldest_undelivered_age_seconds"), 600)
        assert got.get("atelier_reading_ok", reading=READING) == 1
        read_at = got.get("atelier_reading_last_success_timestamp_seconds", reading=READING)
        assert within(read_at, time.time() - 30)

        # The urgent job is cancelled and every change delivered: the priority's series
        # reads 0 rather than freezing at its last depth, and the outbox lag is gone.
        await store.cancel(engine, urgent.user_id, urgent.job_id, system_clock())
        await leave_undelivered(engine, 0, oldest_age=0)
        got = await served.fresh()
        assert got.get("atelier_jobs_queued", priority="5") == 0
        assert got.get("atelier_jobs_oldest_queued_age_seconds", priority="5") == 0
        assert got.get("atelier_jobs_queued", priority="0") == 3
        assert got.get("atelier_outbox_undelivered") == 0
        assert got.get("atelier_outbox_oldest_undelivered_age_seconds") == 0


async def test_the_api_role_reads_no_backlog(creation_url: str) -> None:
    """One role owns the queue's gauges; the api role never runs their statement."""
    app = build(settings_for(creation_url), "api")
    assert READING not in [c.name for c in app.components]


async def test_reaper_decisions_are_counted_by_decision(
    engine: AsyncEngine, creation_url: str
) -> None:
    """Leases that expired under a dead worker: one while submitting (NEEDS_ATTENTION),
    one with no attempts left (FAILED). The service's own reaper resolves them."""
    submitting = await submit(engine)
    exhausted = await submit(engine, max_attempts=1)
    now = system_clock()
    # Leases that are over as soon as they are taken.
    claimed = await leases.claim(engine, "worker-gone", 2, timedelta(milliseconds=1), now)
    assert {j.job_id for j in claimed} == {submitting.job_id, exhausted.job_id}
    epoch = {j.job_id: j.lease_epoch for j in claimed}
    await fenced_write(
        engine, FencedWrite.MARK_SUBMITTING, submitting.job_id, epoch[submitting.job_id], now
    )

    settings = settings_for(creation_url, REAPER_PERIOD="0.5")
    async with serving(settings, providers={"stub": FakeProvider()}) as served:
        before = await scrape(served.metrics_port)

        def decided(got: Scrape, decision: str) -> float:
            name = "atelier_reaper_decisions_total"
            return got.get(name, decision=decision) - before.get(name, decision=decision)

        # A sweep counts each batch's decisions as it commits and stamps the sweep once it
        # has ended (the outputs purge comes between): wait for both.
        got = await scrape_until(
            served.metrics_port,
            lambda s: (
                decided(s, "attention") == 1
                and decided(s, "fail") == 1
                and within(s.get("atelier_reaper_last_sweep_timestamp_seconds"), time.time() - 30)
            ),
        )
        assert decided(got, "retry") == decided(got, "resume") == decided(got, "cancel") == 0
        got = await served.fresh()
        assert got.get("atelier_jobs_needs_attention") == 1


async def test_a_lease_a_worker_finds_taken_over_is_counted(engine: AsyncEngine) -> None:
    job = await submit(engine)
    now = system_clock()
    [claimed] = await leases.claim(engine, "worker-slow", 1, timedelta(milliseconds=1), now)
    keeper = LeaseKeeper(engine, "worker-slow", timedelta(seconds=30), 600, system_clock)
    lease = keeper.hold(claimed)
    lease.task = asyncio.create_task(asyncio.Event().wait())  # an attempt at work
    # The worker stalled past its lease; the reaper queued the job again.
    [reaped] = [r.job for r in await leases.reap_decided(engine, now + timedelta(minutes=1), 10)]
    assert reaped.job_id == job.job_id and reaped.status is Status.QUEUED
    endpoint = serve_metrics("127.0.0.1", port := free_port(), "TEST_METRICS_PORT")
    try:
        name = "atelier_worker_leases_lost_total"
        before = await scrape(port)
        await keeper.beat()
        assert lease.lost
        got = await scrape(port)
        assert got.get(name, why="taken_over") - before.get(name, why="taken_over") == 1
        assert got.get(name, why="abandoned") == before.get(name, why="abandoned")
    finally:
        await asyncio.to_thread(endpoint.close)
    with pytest.raises(asyncio.CancelledError):
        await lease.task


async def test_the_backlog_statement_rides_its_indexes(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        await connection.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(row[0] for row in await connection.execute(text(f"EXPLAIN {BACKLOG_SQL}")))
    assert "Seq Scan" not in plan, plan
    for index in ("ix_jobs_claim_queue", "ix_jobs_needs_attention", "ix_outbox_undelivered"):
        assert index in plan, plan


# -- a database outage ------------------------------------------------------------------


async def test_a_database_outage_keeps_the_last_values_and_says_the_reading_failed(
    own_pg: tuple[OwnPostgres, str],
) -> None:
    pg, url = own_pg
    engine = create_async_engine(asyncpg_url(url))
    try:
        await make_needs_attention(engine)
    finally:
        await engine.dispose()
    fast = {
        "DB_STATEMENT_TIMEOUT": "0.5",
        "DB_LOCK_TIMEOUT": "0.2",
        "DB_POOL_TIMEOUT": "0.3",
        "DB_CONNECT_TIMEOUT": "0.5",
    }
    async with serving(settings_for(url, **fast)) as served:
        got = await served.fresh()
        assert got.get("atelier_jobs_needs_attention") == 1
        assert got.get("atelier_reading_ok", reading=READING) == 1

        pg.stop()
        try:
            # /metrics still answers, and says the reading failed.
            got = await scrape_until(
                served.metrics_port, lambda s: s.get("atelier_reading_ok", reading=READING) == 0
            )
            read_at = got.get("atelier_reading_last_success_timestamp_seconds", reading=READING)
            got = await served.fresh()
            assert got.get("atelier_reading_ok", reading=READING) == 0
            assert got.get("atelier_jobs_needs_attention") == 1  # the last value, kept
            stamp = got.get("atelier_reading_last_success_timestamp_seconds", reading=READING)
            assert stamp == read_at
            failures = sum(
                value
                for (name, labels), value in got.samples.items()
                if name == "atelier_reading_failures_total" and ("reading", READING) in labels
            )
            assert failures >= 2
        finally:
            pg.start()
        got = await scrape_until(
            served.metrics_port, lambda s: s.get("atelier_reading_ok", reading=READING) == 1
        )
        assert got.get("atelier_reading_last_success_timestamp_seconds", reading=READING) > read_at

        # A frozen server answers nothing: the reading's deadline ends the round, and
        # /metrics answers all along.
        pg.freeze()
        try:
            got = await scrape_until(
                served.metrics_port, lambda s: s.get("atelier_reading_ok", reading=READING) == 0
            )
            assert got.get("atelier_jobs_needs_attention") == 1
        finally:
            pg.thaw()
        await scrape_until(
            served.metrics_port, lambda s: s.get("atelier_reading_ok", reading=READING) == 1
        )
