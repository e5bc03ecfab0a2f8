"""Jobs as users see them: submit, read, list, cancel."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, select, tuple_, union_all
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Job, Status, quota_day_start, quota_reset_time
from services.creation.errors import (
    DailyQuotaExceeded,
    IdempotencyKeyReused,
    InFlightLimitReached,
    InsufficientPoints,
    InvalidRequest,
    JobAlreadyFinished,
    JobNotFound,
    Reason,
    UserBusy,
    WebhookSigningKeyMissing,
)
from services.creation.list_filter import JobFilter
from services.creation.parameters import to_stored
from services.creation.store.rows import job_from_row
from services.creation.store.submit_statement import (
    SUBMIT_CALL,
    submit_arguments,
    user_lock_timed_out,
)
from services.creation.store.users import user_turn
from services.creation.store.webhooks import PER_JOB_ENDPOINT
from services.creation.store.writes import cancel_asked_by, lock_job, write
from services.creation.submission import SubmitCommand
from services.creation.tables import jobs
from services.kit.db import DriverStatement, driver_connection, driver_fetch, fetch


@dataclass(frozen=True)
class SubmitLimits:
    daily_quota: int
    in_flight_limit: int
    max_attempts: int
    welcome_points: int


@dataclass(frozen=True)
class Submitted:
    job: Job
    replayed: bool


@dataclass(frozen=True)
class Cancelled:
    job: Job
    changed: bool  # False: already cancelled or already asked to cancel


# Hot statements, compiled once for asyncpg (kit.db.driver_fetch).

# The job an idempotency key made (rides uq_jobs_user_idempotency_key).
JOB_BY_KEY = DriverStatement.of(
    select(jobs).where(
        jobs.c.user_id == bindparam("user_id"), jobs.c.idempotency_key == bindparam("key")
    )
)


# One job of one user (primary key; another user's job and a deleted one are not found).
JOB_OF_USER = DriverStatement.of(
    select(jobs).where(
        jobs.c.job_id == bindparam("job_id"),
        jobs.c.user_id == bindparam("user_id"),
        jobs.c.deleted_at.is_(None),
    )
)


def _replay(existing: Job, command: SubmitCommand) -> Submitted:
    if existing.request_hash != command.request_hash():
        raise IdempotencyKeyReused()
    return Submitted(existing, replayed=True)


async def find_replay(
    engine: AsyncEngine, user_id: str, command: SubmitCommand
) -> Submitted | None:
    """The job an earlier submit with the same key made, if any (checked again under the
    user's lock by :func:`submit`)."""
    if command.idempotency_key is None:
        return None
    rows = await driver_fetch(engine, JOB_BY_KEY, user_id=user_id, key=command.idempotency_key)
    return _replay(job_from_row(rows[0]), command) if rows else None


def _refusal(row: Any, limits: SubmitLimits, now: datetime) -> Exception:
    """The error a submit verdict (an asyncpg record) other than ``ok`` or ``replay``
    stands for."""
    outcome = row["submit_outcome"]
    if outcome == "model_not_available":
        return InvalidRequest(Reason.MODEL_NOT_AVAILABLE, "model_id", "is not an available model")
    if outcome == "style_not_available":
        return InvalidRequest(Reason.STYLE_NOT_AVAILABLE, "style_id", "is not an available style")
    if outcome == "style_model_mismatch":
        return InvalidRequest(
            Reason.STYLE_MODEL_MISMATCH, "style_id", f"does not apply to {row['model_kind']} models"
        )
    if outcome == "daily_quota_exceeded":
        reset = quota_reset_time(now)
        return DailyQuotaExceeded(limits.daily_quota, (reset - now).total_seconds())
    if outcome == "in_flight_limit_reached":
        return InFlightLimitReached(limits.in_flight_limit)
    if outcome == "insufficient_points":
        return InsufficientPoints(int(row["available_points"]), int(row["model_price"]))
    raise AssertionError(f"unknown submit verdict {outcome!r}")


async def submit(
    engine: AsyncEngine,
    user_id: str,
    command: SubmitCommand,
    limits: SubmitLimits,
    now: datetime,
    trace_parent: str | None = None,
    via: str = "",
) -> Submitted:
    """Creates the job (its triggers add its submit event, its points reservation and its
    first outbox row) in one transaction, serialised per user so limits and idempotency
    hold under races: one call that takes the user's lock, then decides and writes (see
    submit_statement).
    ``trace_parent`` (the submit's span) is kept with the job. Not retried on a dropped
    connection: the job may have been made."""
    job_id = str(uuid.uuid4())
    arguments = submit_arguments(
        job_id=job_id,
        user_id=user_id,
        idempotency_key=command.idempotency_key,
        model_id=command.model_id,
        style_id=command.style_id,
        input_asset_id=command.input_asset_id,
        prompt=command.prompt,
        negative_prompt=command.negative_prompt,
        width=command.width,
        height=command.height,
        parameters=json.dumps(to_stored(command.parameters)),
        max_attempts=limits.max_attempts,
        request_hash=command.request_hash(),
        day_start=quota_day_start(now),
        daily_quota=limits.daily_quota,
        in_flight_limit=limits.in_flight_limit,
        welcome_points=limits.welcome_points,
        now=now,
        num_outputs=command.num_outputs,
        trace_parent=trace_parent,
        via=via or None,
    )
    try:
        async with user_turn(user_id), driver_connection(engine) as connection:
            if command.webhook is None:
                row = await connection.fetchrow(SUBMIT_CALL, *arguments)
            else:
                row = await _submit_with_webhook(connection, job_id, arguments, command, via, now)
    except Exception as error:
        # Outside the connection's block: the connection answered, and goes back to the pool.
        if user_lock_timed_out(error):
            raise UserBusy() from None
        raise
    outcome = row["submit_outcome"]
    if outcome == "replay":
        return _replay(job_from_row(row), command)
    if outcome != "ok":
        raise _refusal(row, limits, now)
    return Submitted(job_from_row(row), replayed=False)


async def _submit_with_webhook(
    connection: Any,
    job_id: str,
    arguments: list[Any],
    command: SubmitCommand,
    via: str,
    now: datetime,
) -> Any:
    """The submit call in one transaction with the job's own webhook endpoint, written
    first so the job's job.queued (its insert trigger) finds it; kept only when the submit
    made the job (a replay or a refusal rolls it back). Signed with ``via``'s key: without
    one, WebhookSigningKeyMissing and nothing is written."""
    assert command.webhook is not None
    transaction = connection.transaction()
    await transaction.start()
    try:
        made = await connection.fetchval(
            PER_JOB_ENDPOINT,
            uuid.uuid4(),
            uuid.UUID(job_id),
            command.webhook.url,
            list(command.webhook.event_types),
            via,
            now,
        )
        if made is None:
            raise WebhookSigningKeyMissing(via)
        row = await connection.fetchrow(SUBMIT_CALL, *arguments)
    except BaseException:
        await transaction.rollback()
        raise
    if row["submit_outcome"] == "ok":
        await transaction.commit()
    else:
        await transaction.rollback()
    return row


async def get(engine: AsyncEngine, user_id: str, job_id: str) -> Job:
    rows = await driver_fetch(engine, JOB_OF_USER, job_id=job_id, user_id=user_id)
    if not rows:
        raise JobNotFound()
    return job_from_row(rows[0])


@dataclass(frozen=True)
class Cursor:
    """Where a page of ListJobs ends: the last job's (created_at, job_id)."""

    created_at: datetime
    job_id: str


_NEWEST_FIRST = (jobs.c.created_at.desc(), jobs.c.job_id.desc())


def _list_query(user_id: str, chosen: JobFilter, limit: int, after: Cursor | None) -> Select[Any]:
    """A page of the user's jobs (shown ones only). Several statuses are one branch each,
    merged newest first (a Merge Append): with one IN list PostgreSQL walks the user's whole
    history through ix_jobs_user_newest instead, past every finished job on its way to the
    few active ones."""
    conditions = [jobs.c.user_id == user_id, jobs.c.deleted_at.is_(None)]
    if chosen.created_from is not None:
        conditions.append(jobs.c.created_at >= chosen.created_from)
    if chosen.created_before is not None:
        conditions.append(jobs.c.created_at < chosen.created_before)
    if after is not None:
        # A row comparison: an index condition, so a later page starts where the last ended.
        conditions.append(
            tuple_(jobs.c.created_at, jobs.c.job_id)
            < tuple_(
                after.created_at,
                after.job_id,
                types=[jobs.c.created_at.type, jobs.c.job_id.type],
            )
        )
    if len(chosen.statuses) <= 1:
        query = select(jobs).where(*conditions)
        if chosen.statuses:
            query = query.where(jobs.c.status == chosen.statuses[0].value)
        return query.order_by(*_NEWEST_FIRST).limit(limit + 1)
    branches = [
        select(jobs)
        .where(*conditions, jobs.c.status == status.value)
        .order_by(*_NEWEST_FIRST)
        .limit(limit + 1)
        for status in chosen.statuses
    ]
    merged = union_all(*branches).subquery("listed")
    return (
        select(merged).order_by(merged.c.created_at.desc(), merged.c.job_id.desc()).limit(limit + 1)
    )


async def list_for_user(
    engine: AsyncEngine, user_id: str, chosen: JobFilter, limit: int, after: Cursor | None
) -> tuple[list[Job], Cursor | None]:
    """The user's jobs that ``chosen`` admits, deleted ones aside, newest first,
    keyset-paginated. Rides ix_jobs_user_status_newest with statuses (one range per
    status), ix_jobs_user_newest without."""
    query = _list_query(user_id, chosen, limit, after)
    rows = await fetch(engine, query)
    found = [job_from_row(r._mapping) for r in rows[:limit]]
    more = len(rows) > limit
    return found, Cursor(found[-1].created_at, found[-1].job_id) if more and found else None


async def cancel(
    engine: AsyncEngine, user_id: str, job_id: str, now: datetime, via: str = ""
) -> Cancelled:
    """QUEUED: cancelled at once, points released. RUNNING or NEEDS_ATTENTION: marked
    cancel_requested (the worker or an operator finishes it). Already cancelled or already
    requested: unchanged. SUCCEEDED or FAILED: JobAlreadyFinished."""
    async with engine.begin() as connection:
        job = await lock_job(
            connection,
            jobs.c.job_id == job_id,
            jobs.c.user_id == user_id,
            jobs.c.deleted_at.is_(None),
        )
        if job is None:
            raise JobNotFound()
        if job.status is Status.CANCELLED or job.cancel_requested:
            return Cancelled(job, changed=False)
        if job.status.terminal:
            raise JobAlreadyFinished(job.status.value)
        values: dict[str, object] = {**cancel_asked_by(Actor.USER, user_id)}
        if job.status is Status.QUEUED:
            values.update(status=Status.CANCELLED.value, completed_at=now)
            reason = "cancel"
        else:
            # The worker (or an operator) ends it; the request is an event of its own.
            values.update(cancel_requested=True)
            reason = "cancel requested"
        after = await write(
            connection,
            job,
            values,
            actor=Actor.USER,
            actor_id=user_id,
            reason=reason,
            now=now,
            via=via,
        )
        return Cancelled(after, changed=True)
