"""PostgreSQL itself refuses every status change the state machine lacks (migration 0016's
trigger, error illegal_job_transition), whatever code writes it, and lets every change it
has through."""

from __future__ import annotations

import itertools

import asyncpg
import pytest
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import TRANSITIONS, Status
from services.creation.store import jobs as store
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.support.job_errors import AN_ERROR, NO_ERROR, UNKNOWN

LATER = "created_at + interval '1 minute'"
RELEASED = "lease_owner = NULL, lease_expires_at = NULL"
# One UPDATE per status that gives the row the whole shape that status asks for (its
# CHECK), whatever status it had: so a refusal below is about the step, never the shape.
ENTER = {
    Status.QUEUED: (
        f"status = 'queued', {RELEASED}, completed_at = NULL, outputs = '{{}}',"
        f" cancel_requested = false, {NO_ERROR}"
    ),
    Status.RUNNING: (
        "status = 'running', lease_owner = 'w', lease_expires_at = now() + interval '1 hour',"
        f" lease_epoch = lease_epoch + 1, attempt = 1, started_at = {LATER},"
        f" step = 'preparing', completed_at = NULL, outputs = '{{}}', {NO_ERROR}"
    ),
    Status.SUCCEEDED: (
        f"status = 'succeeded', {RELEASED}, started_at = {LATER}, completed_at = {LATER},"
        " outputs = array_fill(gen_random_uuid()::text, ARRAY[num_outputs]),"
        f" {NO_ERROR}, progress = 100, step = 'done'"
    ),
    Status.FAILED: (
        f"status = 'failed', {RELEASED}, completed_at = {LATER}, outputs = '{{}}', {AN_ERROR}"
    ),
    Status.CANCELLED: (
        f"status = 'cancelled', {RELEASED}, completed_at = {LATER}, outputs = '{{}}'"
    ),
    Status.NEEDS_ATTENTION: (
        f"status = 'needs_attention', {RELEASED}, completed_at = NULL, outputs = '{{}}', {UNKNOWN}"
    ),
}
# How a submitted job reaches each status by legal steps.
PATH = {
    Status.QUEUED: (),
    Status.RUNNING: (Status.RUNNING,),
    Status.SUCCEEDED: (Status.RUNNING, Status.SUCCEEDED),
    Status.FAILED: (Status.RUNNING, Status.FAILED),
    Status.CANCELLED: (Status.CANCELLED,),
    Status.NEEDS_ATTENTION: (Status.RUNNING, Status.NEEDS_ATTENTION),
}
# RUNNING -> RUNNING is a new lease or a beat: the status stays, so it is no change.
PAIRS = [(a, b) for a, b in itertools.product(Status, Status) if a is not b]
PAIRS.append((Status.RUNNING, Status.RUNNING))
LEGAL = [pair for pair in PAIRS if pair in TRANSITIONS or pair[0] is pair[1]]
ILLEGAL = [pair for pair in PAIRS if pair not in LEGAL]


def _ids(pairs: list[tuple[Status, Status]]) -> list[str]:
    return [f"{source}->{target}" for source, target in pairs]


async def _enter(connection: AsyncConnection, job_id: str, status: Status) -> int:
    result = await connection.execute(
        text(f"UPDATE creation.jobs SET {ENTER[status]} WHERE job_id = :id"), {"id": job_id}
    )
    return result.rowcount


async def _job_in(engine: AsyncEngine, status: Status) -> str:
    job_id = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job.job_id
    async with engine.begin() as connection:
        for step in PATH[status]:
            assert await _enter(connection, job_id, step) == 1
    return job_id


async def _status_of(engine: AsyncEngine, job_id: str) -> str:
    async with engine.connect() as connection:
        query = text("SELECT status FROM creation.jobs WHERE job_id = :id")
        return str((await connection.execute(query, {"id": job_id})).scalar_one())


def test_the_table_covers_every_pair() -> None:
    assert len(ILLEGAL) == 36 - 6 - len(TRANSITIONS)
    assert set(LEGAL) == set(TRANSITIONS) | {(Status.RUNNING, Status.RUNNING)}


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=_ids(ILLEGAL))
async def test_an_illegal_status_change_is_refused_by_the_database(
    engine: AsyncEngine, source: Status, target: Status
) -> None:
    job_id = await _job_in(engine, source)
    with pytest.raises(sqlalchemy.exc.IntegrityError) as caught:
        async with engine.begin() as connection:
            await _enter(connection, job_id, target)
    refusal = caught.value.orig.__cause__ if caught.value.orig is not None else None
    assert isinstance(refusal, asyncpg.exceptions.CheckViolationError)
    assert refusal.constraint_name == "illegal_job_transition"
    assert refusal.table_name == "jobs"
    assert f"from {source} to {target}" in str(refusal)
    assert await _status_of(engine, job_id) == source.value
    # The same statement with triggers off goes through (and is rolled back): the row it
    # writes is a whole `target` row, so the trigger alone refused it.
    async with engine.connect() as connection, connection.begin() as transaction:
        await connection.execute(text("SET LOCAL session_replication_role = replica"))
        assert await _enter(connection, job_id, target) == 1
        await transaction.rollback()


@pytest.mark.parametrize(("source", "target"), LEGAL, ids=_ids(LEGAL))
async def test_a_legal_status_change_passes(
    engine: AsyncEngine, source: Status, target: Status
) -> None:
    job_id = await _job_in(engine, source)
    async with engine.begin() as connection:
        assert await _enter(connection, job_id, target) == 1
    assert await _status_of(engine, job_id) == target.value


async def test_a_status_that_is_no_state_is_left_to_its_check(engine: AsyncEngine) -> None:
    job_id = await _job_in(engine, Status.SUCCEEDED)
    with pytest.raises(sqlalchemy.exc.IntegrityError) as caught:
        async with engine.begin() as connection:
            await connection.execute(
                text("UPDATE creation.jobs SET status = 'paused' WHERE job_id = :id"),
                {"id": job_id},
            )
    assert '"ck_jobs_status_known"' in str(caught.value.orig)


async def test_a_statement_over_many_jobs_is_refused_whole(engine: AsyncEngine) -> None:
    """One illegal row in a batch refuses the batch: no legal row of it is written."""
    queued = await _job_in(engine, Status.QUEUED)
    failed = await _job_in(engine, Status.FAILED)
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="illegal_job_transition"):
        async with engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE creation.jobs SET {ENTER[Status.RUNNING]} WHERE job_id IN (:a, :b)"),
                {"a": queued, "b": failed},
            )
    assert await _status_of(engine, queued) == "queued"
    assert await _status_of(engine, failed) == "failed"
