"""The lease keeper fails closed: when its beats cannot reach PostgreSQL for as long as a
lease lasts, the leases may have been reaped and taken, so every attempt is cancelled
rather than left working on a job that may be someone else's. PostgreSQL here is the
test's own, stopped on purpose."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from services.creation.store import jobs as store
from services.creation.store import leases
from services.creation.worker.lease_keeper import LeaseKeeper
from services.kit.clock import SettableClock
from services.kit.db import Database
from services.kit.settings import DatabaseSettings
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.support.pg_outage import OwnPostgres

TTL = timedelta(seconds=5)
FAST = DatabaseSettings(
    statement_timeout_seconds=0.5,
    lock_timeout_seconds=0.2,
    pool_timeout_seconds=0.3,
    connect_timeout_seconds=0.5,
    pool_size=2,
)


async def test_beats_that_fail_for_a_lease_cancel_every_attempt(
    own_pg: tuple[OwnPostgres, str],
) -> None:
    pg, url = own_pg
    database = Database(url, "fail-closed-test", limits=FAST)
    clock = SettableClock(T0)
    keeper = LeaseKeeper(database.engine, "w1", TTL, 0.5, clock)
    try:
        await store.submit(database.engine, new_user(), command(), LIMITS, T0)
        (job,) = await leases.claim(database.engine, "w1", 1, TTL, T0)
        lease = keeper.hold(job)
        lease.task = asyncio.create_task(asyncio.Event().wait())  # an attempt at work
        await keeper.beat()
        assert keeper.beats == 1
        pg.stop()
        clock.advance(2)
        await keeper.beat()  # fails, but the lease may well hold still: keep working
        assert not lease.lost
        assert not lease.task.done()
        clock.advance(TTL.total_seconds())
        abandoned = {"why": "abandoned"}
        before = REGISTRY.get_sample_value("atelier_worker_leases_lost_total", abandoned)
        await keeper.beat()  # a lease's length without a beat: nobody can tell
        assert lease.lost
        after = REGISTRY.get_sample_value("atelier_worker_leases_lost_total", abandoned)
        assert after == (before or 0) + 1
        assert keeper.held == 0
        with pytest.raises(asyncio.CancelledError):
            await lease.task
    finally:
        pg.start()
        await database.close()
