"""PostgreSQL itself refuses every illegal combination of status, lease, timestamps,
output and error, and every second charge, whatever code tries to write it."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import jobs as store
from tests.integration.creation.helpers import LIMITS, T0, command, new_user
from tests.support.job_errors import AN_ERROR, UNKNOWN

# A moment after the job was created (the tests' clock is not the database's).
LATER = "created_at + interval '1 minute'"
LEASE = f"lease_owner = 'w', lease_expires_at = {LATER}, lease_epoch = 1"
RUNNING = f"status = 'running', {LEASE}, attempt = 1, started_at = {LATER}, step = 'preparing'"
DONE = f"completed_at = {LATER}, started_at = {LATER}"
OUTPUT = "outputs = ARRAY[gen_random_uuid()::text]"
SCRUBBED = (
    f"deleted_at = {LATER}, prompt = '', negative_prompt = '', parameters = '{{}}',"
    " error_message = NULL, idempotency_key = NULL, request_hash = ''"
)
CANCELLED = f"status = 'cancelled', completed_at = {LATER}"
RELEASED = "lease_owner = NULL, lease_expires_at = NULL"

# What each statement breaks, and the constraint that must catch it.
ILLEGAL_UPDATES = {
    "unknown status": ("status = 'paused'", "status_known"),
    "unknown step": ("step = 'dreaming'", "step_known"),
    "queued with a lease": (LEASE, "queued_shape"),
    "queued and completed": (f"completed_at = {LATER}", "queued_shape"),
    "queued with an output": (OUTPUT, "queued_shape"),
    "queued with a cancel request": ("cancel_requested = true", "queued_shape"),
    "running without a lease": (
        f"status = 'running', attempt = 1, started_at = {LATER}, step = 'preparing'",
        "running_shape",
    ),
    "running without a start": (
        f"status = 'running', {LEASE}, attempt = 1, step = 'preparing'",
        "running_shape",
    ),
    "running without a step": (
        f"status = 'running', {LEASE}, attempt = 1, started_at = {LATER}",
        "running_shape",
    ),
    "running before any attempt": (
        f"status = 'running', {LEASE}, started_at = {LATER}, step = 'preparing'",
        "running_shape",
    ),
    "running and completed": (f"{RUNNING}, completed_at = {LATER}", "running_shape"),
    "running with half a lease": (
        f"status = 'running', lease_owner = 'w', lease_epoch = 1, attempt = 1,"
        f" started_at = {LATER}, step = 'preparing'",
        "running_shape",
    ),
    "succeeded without output": (
        f"status = 'succeeded', {RELEASED}, {DONE}, progress = 100",
        "succeeded_shape",
    ),
    "succeeded without completion": (
        f"status = 'succeeded', {RELEASED}, started_at = {LATER}, {OUTPUT}, progress = 100",
        "succeeded_shape",
    ),
    "succeeded with an error": (
        f"status = 'succeeded', {RELEASED}, {DONE}, {OUTPUT}, progress = 100, {AN_ERROR}",
        "succeeded_shape",
    ),
    "succeeded short of 100%": (
        f"status = 'succeeded', {RELEASED}, {DONE}, {OUTPUT}, progress = 60",
        "succeeded_shape",
    ),
    "succeeded holding a lease": (
        f"status = 'succeeded', {DONE}, {OUTPUT}, progress = 100, {LEASE}",
        "succeeded_shape",
    ),
    "failed without an error": (f"status = 'failed', {RELEASED}, {DONE}", "failed_shape"),
    "failed with an output": (
        f"status = 'failed', {RELEASED}, {DONE}, {AN_ERROR}, {OUTPUT}",
        "failed_shape",
    ),
    # What the owner is told is stored with the code, or there is neither.
    "failed with a code but no reason": (
        f"status = 'failed', {RELEASED}, {DONE}, error_code = 'X'",
        "error_answered",
    ),
    "needs attention with no flag": (
        f"status = 'needs_attention', {RELEASED}, error_code = 'X',"
        " error_reason = 'OUTCOME_UNKNOWN'",
        "error_answered",
    ),
    "a reason without a code": (
        "error_reason = 'PROVIDER_ERROR', error_retryable = true",
        "error_answered",
    ),
    "cancelled without completion": ("status = 'cancelled'", "cancelled_shape"),
    "needs attention without a reason": (
        f"status = 'needs_attention', {RELEASED}",
        "attention_shape",
    ),
    "needs attention but completed": (
        f"status = 'needs_attention', {RELEASED}, {AN_ERROR}, completed_at = {LATER}",
        "attention_shape",
    ),
    "provider request before submitting": (
        "attempt = 1, provider_request_id = 'req'",
        "request_after_submit",
    ),
    "provider request without an attempt": (
        "step = 'generating', provider_request_id = 'req'",
        "request_has_attempt",
    ),
    "progress over 100": ("progress = 101", "progress_percent"),
    "attempts beyond the maximum": ("attempt = max_attempts + 1", "attempts_bounded"),
    "version zero": ("version = 0", "version_positive"),
    "completed before created": (
        "status = 'cancelled', completed_at = created_at - interval '1 day'",
        "completed_after_created",
    ),
    "parameters not an object": ("parameters = '[1, 2]'::jsonb", "parameters_object"),
    "size out of bounds": ("width = 10000", "size"),
    "deleted before it finished": (SCRUBBED, "deleted_shape"),
    "deleted keeping its prompt": (f"{CANCELLED}, deleted_at = {LATER}", "deleted_shape"),
    "deleted before it completed": (
        f"{CANCELLED}, {SCRUBBED.replace(LATER, 'created_at')}",
        "deleted_shape",
    ),
}

# Reached from RUNNING, the one status they may follow (from QUEUED the transition
# trigger, migration 0016, refuses the step before any CHECK sees the row).
FROM_RUNNING = {
    "succeeded without output",
    "succeeded without completion",
    "succeeded with an error",
    "succeeded short of 100%",
    "succeeded holding a lease",
    "failed without an error",
    "failed with an output",
    "needs attention without a reason",
    "needs attention but completed",
    "succeeded",
    "failed",
    "needs attention",
}


async def submitted(engine: AsyncEngine, case: str) -> str:
    """A new job's id: queued, or running when ``case`` starts from RUNNING."""
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    if case in FROM_RUNNING:
        async with engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE creation.jobs SET {RUNNING} WHERE job_id = :id"), {"id": job.job_id}
            )
    return job.job_id


@pytest.mark.parametrize(
    ("case", "assignment", "constraint"),
    [(case, *rule) for case, rule in ILLEGAL_UPDATES.items()],
    ids=list(ILLEGAL_UPDATES),
)
async def test_illegal_job_state_is_rejected(
    engine: AsyncEngine, case: str, assignment: str, constraint: str
) -> None:
    job_id = await submitted(engine, case)
    with pytest.raises(sqlalchemy.exc.IntegrityError) as caught:
        async with engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE creation.jobs SET {assignment} WHERE job_id = :id"),
                {"id": job_id},
            )
    assert f'"ck_jobs_{constraint}"' in str(caught.value.orig)


LEGAL_UPDATES = {
    "running": RUNNING,
    "succeeded": (
        f"status = 'succeeded', {RELEASED}, {DONE}, {OUTPUT}, progress = 100, step = 'done'"
    ),
    "failed": f"status = 'failed', {RELEASED}, {DONE}, {AN_ERROR}",
    "cancelled": f"status = 'cancelled', completed_at = {LATER}",
    "needs attention": f"status = 'needs_attention', {RELEASED}, {UNKNOWN}",
    "queued resuming a request": "attempt = 1, step = 'generating', provider_request_id = 'req'",
    "deleted": f"{CANCELLED}, {SCRUBBED}",
}


@pytest.mark.parametrize(
    ("case", "assignment"), list(LEGAL_UPDATES.items()), ids=list(LEGAL_UPDATES)
)
async def test_legal_job_state_is_accepted(engine: AsyncEngine, case: str, assignment: str) -> None:
    """The counterpart: the same statements with the state made whole do go through, so
    the rejections above are about the combination and nothing else."""
    job_id = await submitted(engine, case)
    async with engine.begin() as connection:
        result = await connection.execute(
            text(f"UPDATE creation.jobs SET {assignment} WHERE job_id = :id"), {"id": job_id}
        )
    assert result.rowcount == 1


LEDGER = "INSERT INTO creation.points_ledger"
ILLEGAL_LEDGER = {
    "a second reservation": f"""{LEDGER} (user_id, job_id, kind, amount, created_at)
        VALUES (:user, :job, 'reserve', 5, now())""",
    "a grant tied to a job": f"""{LEDGER} (user_id, job_id, kind, amount, grant_key, created_at)
        VALUES (:user, :job, 'grant', 5, 'k', now())""",
    "a job entry without a job": f"""{LEDGER} (user_id, kind, amount, created_at)
        VALUES (:user, 'capture', 5, now())""",
    "a negative amount": f"""{LEDGER} (user_id, kind, amount, grant_key, created_at)
        VALUES (:user, 'grant', -5, 'k2', now())""",
    "the same grant twice": f"""{LEDGER} (user_id, kind, amount, grant_key, created_at)
        VALUES (:user, 'grant', 5, 'welcome', now())""",
    "a second outbox row for a version": """INSERT INTO creation.outbox
        (job_id, user_id, version, payload, created_at)
        VALUES (:job, :user, 1, '{}'::jsonb, now())""",
    "a second event for a version": """INSERT INTO creation.job_events
        (job_id, version, to_status, actor_kind, actor_id, created_at)
        VALUES (:job, 1, 'queued', 'user', :user, now())""",
}


@pytest.mark.parametrize("statement", list(ILLEGAL_LEDGER.values()), ids=list(ILLEGAL_LEDGER))
async def test_illegal_side_rows_are_rejected(engine: AsyncEngine, statement: str) -> None:
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        async with engine.begin() as connection:
            await connection.execute(text(statement), {"user": job.user_id, "job": job.job_id})


async def test_a_job_row_is_never_deleted(engine: AsyncEngine) -> None:
    """Its events, ledger entries and outbox rows name it without a foreign key (their
    writers are its own statements' triggers, migration 0034): a DELETE is refused, as the
    foreign keys refused it for every job with a side row, which is every job."""
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="never deleted"):
        async with engine.begin() as connection:
            await connection.execute(
                text("DELETE FROM creation.jobs WHERE job_id = :job"), {"job": job.job_id}
            )
