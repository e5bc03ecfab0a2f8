"""ledger_totals (migration 0013) on real PostgreSQL: after any mix of writers (grants and
welcomes, submits, the worker's batched captures and releases, cancels, the reaper), each
user's totals row is exactly the sums over their ledger; batch writers over overlapping
users in any order never deadlock on the totals rows; and the balance reads (the submit
function and GetBalance) no longer scan the user's ledger."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job, Status
from services.creation.errors import InsufficientPoints
from services.creation.store import jobs as store
from services.creation.store import leases, ledger
from services.creation.store.fenced import FencedItem, FencedWrite, outputs_value
from services.creation.store.jobs import SubmitLimits
from services.creation.tables import jobs
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.integration.creation.test_leases import ASSET, TTL
from tests.integration.creation.test_query_plans import _submit_statement, generic_plan
from tests.support.ledger_sums import LEDGER_SUMS, LEDGER_TOTALS

ROOMY = SubmitLimits(daily_quota=1000, in_flight_limit=1000, max_attempts=1, welcome_points=100)


async def sums_and_totals(engine: AsyncEngine) -> tuple[list[tuple[Any, ...]], list[Any]]:
    async with engine.connect() as connection:
        sums = [tuple(r) for r in (await connection.execute(text(LEDGER_SUMS))).all()]
        totals = [tuple(r) for r in (await connection.execute(text(LEDGER_TOTALS))).all()]
    return sums, totals


async def assert_totals_are_the_ledger_sums(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    sums, totals = await sums_and_totals(engine)
    assert totals == sums
    return sums


async def submit_some(engine: AsyncEngine, user: str, n: int, limits: SubmitLimits) -> None:
    for _ in range(n):
        with contextlib.suppress(InsufficientPoints):
            await store.submit(engine, user, command(), limits, T0)


async def test_totals_are_the_ledger_sums_after_a_mixed_workload(engine: AsyncEngine) -> None:
    users = [new_user() for _ in range(5)]
    # Grants (each user's first grant brings the welcome), balances read (GetBalance's own
    # welcome) and submits, all users at once, several calls per user at once.
    await asyncio.gather(
        *(
            ledger.grant_points(engine, u, 7 * i, f"g-{i}", "promo", 100, T0)
            for u in users[:3]
            for i in (1, 2)
        ),
        *(ledger.read_balance(engine, u, 100, T0) for u in users[2:]),
        *(submit_some(engine, u, 6, ROOMY) for u in users for _ in range(2)),
    )
    await assert_totals_are_the_ledger_sums(engine)

    running = await leases.claim(engine, "w1", 1000, TTL, T0)
    by_user: dict[str, list[Job]] = {}
    for job in running:
        by_user.setdefault(job.user_id, []).append(job)
    assert set(by_user) == set(users)
    # Per user: complete (capture), cancel asked then acknowledged (release), failed
    # (release), and one left for the reaper, which cancels it (release).
    completes, acknowledged, failed, reaped = [], [], [], []
    for owned in by_user.values():
        completes += owned[0:3]
        acknowledged += owned[3:5]
        failed += owned[5:7]
        reaped += owned[7:]
    for job in acknowledged + reaped:
        await store.cancel(engine, job.user_id, job.job_id, T0)
    # Queued jobs cancelled by their owners (release) while the worker writes.
    await asyncio.gather(*(submit_some(engine, u, 2, ROOMY) for u in users))
    queued = await queued_jobs(engine)
    assert queued
    outputs = outputs_value([ASSET])
    later = T0 + timedelta(seconds=5)
    random.shuffle(completes)
    half = len(completes) // 2
    await asyncio.gather(
        # Batches mixing users, as the worker's coalescing writer sends them.
        leases.apply(
            engine,
            FencedWrite.COMPLETE,
            [FencedItem(j.job_id, j.lease_epoch, outputs) for j in completes[:half]],
            later,
        ),
        leases.apply(
            engine,
            FencedWrite.COMPLETE,
            [FencedItem(j.job_id, j.lease_epoch, outputs) for j in completes[half:]],
            later,
        ),
        leases.apply(
            engine,
            FencedWrite.ACKNOWLEDGE_CANCEL,
            [FencedItem(j.job_id, j.lease_epoch) for j in acknowledged],
            later,
        ),
        *(
            leases.fail(
                engine,
                j.job_id,
                j.lease_epoch,
                "E",
                "broken",
                retryable=False,
                retry_delay=timedelta(0),
                now=later,
            )
            for j in failed
        ),
        *(store.cancel(engine, j.user_id, j.job_id, later) for j in queued),
        *(ledger.grant_points(engine, u, 3, "late", "promo", 100, later) for u in users),
    )
    # The leases of the rest ran out: the reaper cancels them in its batches.
    found = [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 4)]
    while found:
        found = [r.job for r in await leases.reap_decided(engine, T0 + TTL * 2, 4)]
    sums = await assert_totals_are_the_ledger_sums(engine)

    kinds = await ledger_kinds(engine)
    assert {"grant", "reserve", "capture", "release"} <= kinds
    assert {s[0] for s in sums} == set(users)
    # And every reader answers what the sums say.
    for user, granted, reserved, captured, released, welcomed in sums:
        assert welcomed
        expected = (granted - reserved + released, reserved - captured - released)
        async with engine.connect() as connection:
            read = await ledger.balance(connection, user)
        assert (read.available, read.reserved, read.welcomed) == (*expected, True)
        got = await ledger.read_balance(engine, user, 100, later)
        assert (got.available, got.reserved) == expected
    # No reader made a row of a user who has no entry.
    stranger = new_user()
    async with engine.connect() as connection:
        assert await ledger.balance(connection, stranger) == ledger.Balance(0, 0, welcomed=False)
    assert await assert_totals_are_the_ledger_sums(engine) == sums


async def queued_jobs(engine: AsyncEngine) -> list[Job]:
    from services.creation.store.rows import job_from_row

    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT * FROM creation.jobs WHERE status = 'queued' ORDER BY job_id")
        )
        return [job_from_row(r._mapping) for r in rows]


async def ledger_kinds(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        found = await connection.execute(text("SELECT DISTINCT kind FROM creation.points_ledger"))
        return set(found.scalars())


async def test_the_welcome_from_get_balance_counts_once_in_its_own_answer_and_after(
    engine: AsyncEngine,
) -> None:
    """GetBalance's statement inserts the welcome and cannot see what the trigger adds
    for it: the answer adds the welcome itself, once, and the next read finds it in the
    totals."""
    user = new_user()
    first = await ledger.read_balance(engine, user, 100, T0)
    again = await ledger.read_balance(engine, user, 100, T0)
    assert (first.available, first.reserved) == (again.available, again.reserved) == (100, 0)
    granted = await ledger.grant_points(engine, user, 5, "g", "promo", 100, T0)
    assert (granted.new, granted.balance.available, granted.balance.welcomed) == (True, 105, True)
    await assert_totals_are_the_ledger_sums(engine)


async def test_ledger_rows_cannot_be_changed_or_deleted(engine: AsyncEngine) -> None:
    """The totals follow inserts only: an UPDATE or DELETE of an entry is refused (a
    correction is a new entry), so the totals cannot drift from the ledger."""
    user = new_user()
    await ledger.grant_points(engine, user, 5, "g", "promo", 0, T0)
    for statement in (
        "UPDATE creation.points_ledger SET amount = 50 WHERE user_id = :u",
        "DELETE FROM creation.points_ledger WHERE user_id = :u",
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            async with engine.begin() as connection:
                await connection.execute(text(statement), {"u": user})
    assert await assert_totals_are_the_ledger_sums(engine) == [(user, 5, 0, 0, 0, False)]


async def test_batch_writers_over_overlapping_users_in_any_order_never_deadlock(
    engine: AsyncEngine,
) -> None:
    """Several connections at once, each adding entries for many of the same users in one
    statement, the users in a shuffled order each time: the trigger locks the totals rows
    in user order, so none waits in a cycle (PostgreSQL would abort one with 40P01)."""
    users = [new_user() for _ in range(12)]
    rounds, writers = 15, 6

    async def writer(seed: int) -> None:
        shuffler = random.Random(seed)
        async with engine.connect() as connection:
            for round_ in range(rounds):
                chosen = shuffler.sample(users, 8)
                values = ", ".join(
                    f"(:u{i}, 'grant', {i + 1}, :k{i}, 'load', now())" for i in range(len(chosen))
                )
                parameters = {f"u{i}": u for i, u in enumerate(chosen)}
                parameters |= {f"k{i}": f"k-{seed}-{round_}-{i}" for i in range(len(chosen))}
                async with connection.begin():
                    await connection.execute(
                        text(
                            "INSERT INTO creation.points_ledger (user_id, kind, amount,"
                            f" grant_key, reason, created_at) VALUES {values}"
                        ),
                        parameters,
                    )
                    # Held a moment, so the writers' transactions overlap.
                    await connection.execute(text("SELECT pg_sleep(0.002)"))

    await asyncio.gather(*(writer(seed) for seed in range(writers)))
    sums = await assert_totals_are_the_ledger_sums(engine)
    assert sum(s[1] for s in sums) == writers * rounds * sum(range(1, 9))


async def test_the_workers_batches_and_reapers_over_overlapping_users_never_deadlock(
    engine: AsyncEngine,
) -> None:
    """The real writers: fenced batches (many users' captures and releases in one
    statement) and reapers (one statement per job, in one transaction) at once, over the
    same users, their jobs in shuffled orders."""
    users = [new_user() for _ in range(8)]
    limits = SubmitLimits(daily_quota=1000, in_flight_limit=1000, max_attempts=1, welcome_points=0)
    await asyncio.gather(
        *(ledger.grant_points(engine, u, 10_000, "stake", "load", 0, T0) for u in users)
    )
    await asyncio.gather(*(submit_some(engine, u, 12, limits) for u in users))
    running = await leases.claim(engine, "w1", 1000, TTL, T0)
    assert len(running) == 96
    shuffler = random.Random(7)
    shuffler.shuffle(running)
    by_kind = {"complete": running[:32], "acknowledge": running[32:64], "reap": running[64:]}
    for job in by_kind["acknowledge"] + by_kind["reap"]:
        await store.cancel(engine, job.user_id, job.job_id, T0)
    # The reaper's jobs expire in an order that is not the users' order; the batches'
    # jobs not before the test is over.
    async with engine.begin() as connection:
        for n, job in enumerate(running):
            expiry = T0 + (timedelta(milliseconds=n) if n >= 64 else timedelta(hours=1))
            await connection.execute(
                update(jobs).where(jobs.c.job_id == job.job_id).values(lease_expires_at=expiry)
            )
    later = T0 + TTL * 2
    outputs = outputs_value([ASSET])

    async def batches(write: FencedWrite, chosen: list[Job], value: str | None) -> None:
        for start in range(0, len(chosen), 8):
            part = chosen[start : start + 8]
            await leases.apply(
                engine, write, [FencedItem(j.job_id, j.lease_epoch, value) for j in part], later
            )

    async def reaper() -> None:
        while [r.job for r in await leases.reap_decided(engine, later, 5)]:
            pass

    complete, acknowledge = by_kind["complete"], by_kind["acknowledge"]
    await asyncio.gather(
        batches(FencedWrite.COMPLETE, complete[::2], outputs),
        batches(FencedWrite.COMPLETE, complete[1::2], outputs),
        batches(FencedWrite.ACKNOWLEDGE_CANCEL, acknowledge[::2], None),
        batches(FencedWrite.ACKNOWLEDGE_CANCEL, acknowledge[1::2], None),
        reaper(),
        reaper(),
        reaper(),
    )
    async with engine.connect() as connection:
        statuses = (
            await connection.execute(
                text("SELECT status, count(*) FROM creation.jobs GROUP BY status")
            )
        ).all()
    assert dict(statuses) == {Status.SUCCEEDED.value: 32, Status.CANCELLED.value: 64}
    sums = await assert_totals_are_the_ledger_sums(engine)
    assert sum(s[3] for s in sums) == 32 * 5  # captured
    assert sum(s[4] for s in sums) == 64 * 5  # released


def _ledger_scans(plan: str) -> list[str]:
    """The plan's lines that read points_ledger (its inserts aside)."""
    return [
        line
        for line in plan.splitlines()
        if "points_ledger" in line and "Insert on" not in line and "Arbiter" not in line
    ]


async def test_the_submit_reads_the_totals_row_not_the_ledger(engine: AsyncEngine) -> None:
    arguments = [
        str(uuid.uuid4()),
        new_user(),
        None,
        "stub-fast",
        "watercolor",
        str(uuid.uuid4()),
        "p",
        "",
        512,
        512,
        "{}",
        3,
        "h",
        T0,
        LIMITS.daily_quota,
        LIMITS.in_flight_limit,
        LIMITS.welcome_points,
        T0,
        1,
        None,
        None,  # p_via
    ]
    statement = await _submit_statement(engine)
    assert "creation.ledger_totals" in statement
    plan = await generic_plan(engine, statement, arguments)
    assert "pk_ledger_totals" in plan, plan
    assert _ledger_scans(plan) == [], plan


async def test_get_balance_reads_the_totals_row_not_the_ledger(engine: AsyncEngine) -> None:
    arguments = ledger.BALANCE_AFTER_WELCOME.args(
        user_id=new_user(), welcome_points=100, now=T0, day_start=T0
    )
    plan = await generic_plan(engine, ledger.BALANCE_AFTER_WELCOME.sql, arguments)
    assert "pk_ledger_totals" in plan, plan
    assert _ledger_scans(plan) == [], plan
    # The store's own read (grants answer with it) is the row by its key.
    balance = str(ledger.BALANCE.compile())
    assert "points_ledger" not in balance
    assert "ledger_totals" in balance
