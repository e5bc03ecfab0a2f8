"""Hot paths cost as few round trips as their rules allow: a read is one statement with no
transaction around it, a submit is one call (the user's lock and the submit statement in
creation.submit_job, in the call's own transaction), and ListCatalog is served from memory
within its TTL. The wire records everything the store sends, through SQLAlchemy or on
asyncpg directly (tests.support.wire)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.list_filter import JobFilter
from services.creation.store import jobs as store
from services.creation.store import ledger
from services.creation.store.catalog import CachedCatalog
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.support.wire import Wire, watched_engine


@pytest.fixture
async def watched(creation_url: str) -> AsyncIterator[tuple[AsyncEngine, Wire]]:
    async with watched_engine(creation_url) as found:
        yield found


async def test_reading_a_job_is_one_statement_without_a_transaction(
    watched: tuple[AsyncEngine, Wire],
) -> None:
    engine, wire = watched
    user = new_user()
    job = (await store.submit(engine, user, command(), LIMITS, T0)).job
    await wire.caught_up()
    wire.clear()
    await store.get(engine, user, job.job_id)
    await wire.caught_up()
    assert (len(wire.statements), wire.commands) == (1, [])
    wire.clear()
    await store.list_for_user(engine, user, JobFilter(), 10, None)
    await wire.caught_up()
    assert (len(wire.statements), wire.commands) == (1, [])


async def test_the_balance_is_one_statement_and_welcomes_once(
    watched: tuple[AsyncEngine, Wire],
) -> None:
    engine, wire = watched
    user = new_user()
    first = await ledger.read_balance(engine, user, 100, T0)
    again = await ledger.read_balance(engine, user, 100, T0)
    await wire.caught_up()
    assert (first.available, again.available) == (100, 100)
    assert (len(wire.statements), wire.commands) == (2, [])


async def test_a_submit_is_one_call_without_a_transaction_around_it(
    watched: tuple[AsyncEngine, Wire],
) -> None:
    engine, wire = watched
    user = new_user()
    # The connection's first submit also reads the type of the job it returns (asyncpg's
    # introspection, once per connection); from then on a submit is one call.
    await store.submit(engine, user, command(), LIMITS, T0)
    await wire.caught_up()
    wire.clear()
    await store.submit(engine, user, command(), LIMITS, T0)
    await wire.caught_up()
    assert (len(wire.statements), wire.commands) == (1, [])
    assert "creation.submit_job(" in wire.statements[0]
    # A replay is found before the submit (one read), and the submit is not repeated.
    wire.clear()
    keyed = command(key="same")
    await store.submit(engine, user, keyed, LIMITS, T0)
    await store.find_replay(engine, user, keyed)
    await wire.caught_up()
    assert (len(wire.statements), wire.commands) == (2, [])


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_catalog_is_read_once_per_ttl_and_misses_share_one_read(
    watched: tuple[AsyncEngine, Wire],
) -> None:
    engine, wire = watched
    clock = Ticks()
    catalog = CachedCatalog(engine, ttl_seconds=5, clock=clock)
    results = await asyncio.gather(*(catalog.enabled(None) for _ in range(10)))
    reads = len(wire.statements)
    assert reads == 2  # models, styles: once for all ten callers
    assert all(r == results[0] for r in results) and results[0].models
    clock.now = 4.9
    video = await catalog.enabled("video")
    assert len(wire.statements) == reads
    assert all(m.media_kind == "video" for m in video.models)
    clock.now = 5.0
    await catalog.enabled(None)
    assert len(wire.statements) == reads * 2
