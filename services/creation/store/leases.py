"""Leases: what workers and the reaper do to running jobs. Every write by a worker is
fenced by ``(job_id, lease_epoch)``: a worker whose lease was taken over matches nothing,
gets None, and must abandon the job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Boolean, column, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import Actor, Job, ReapDecision, Status, reap_decision
from services.creation.job_errors import error_columns, job_error
from services.creation.store.fenced import (
    CLAIM_SQL,
    FAIL_SQL,
    HAND_BACK_SQL,
    FencedItem,
    FencedWrite,
    Written,
    brief,
)
from services.creation.store.predicates import status_is
from services.creation.store.rows import STATUSES, job_from_row
from services.creation.store.writes import lock_job, write
from services.creation.tables import jobs
from services.kit.db import driver_connection

# A trigger (migration 0004) NOTIFYs this channel whenever a job becomes queued.
QUEUED_CHANNEL = "creation_jobs"

_RELEASE_LEASE = {"lease_owner": None, "lease_expires_at": None}


async def _lock_leased(connection: AsyncConnection, job_id: str, lease_epoch: int) -> Job | None:
    """The running job, locked, if ``lease_epoch`` still holds its lease (the fence)."""
    return await lock_job(
        connection,
        jobs.c.job_id == job_id,
        jobs.c.lease_epoch == lease_epoch,
        status_is(Status.RUNNING),
    )


async def _write_as_worker(
    connection: AsyncConnection, job: Job, values: dict[str, Any], reason: str, now: datetime
) -> Job:
    return await write(
        connection,
        job,
        values,
        actor=Actor.WORKER,
        actor_id=job.lease_owner or "",
        reason=reason,
        now=now,
    )


async def claim(
    engine: AsyncEngine, worker_id: str, limit: int, lease_ttl: timedelta, now: datetime
) -> list[Job]:
    """Claims up to ``limit`` due jobs in one statement, in priority, next attempt, age
    order (see ``fenced.CLAIM_SQL``)."""
    async with driver_connection(engine) as connection:
        rows = await connection.fetch(CLAIM_SQL, now, worker_id, limit, now + lease_ttl)
    return [job_from_row(r) for r in rows]


async def apply(
    engine: AsyncEngine, write: FencedWrite, items: Sequence[FencedItem], now: datetime
) -> dict[str, Job]:
    """Applies ``write`` to every job of ``items`` whose lease the item still holds, in
    one statement; the jobs as written, by id. A job missing from the answer was not
    written (its lease is gone, or its cancel request says otherwise)."""
    if not items:
        return {}
    async with driver_connection(engine) as connection:
        return await apply_on(connection, write, items, now)


async def apply_on(
    connection: Any, write: FencedWrite, items: Sequence[FencedItem], now: datetime
) -> dict[str, Job]:
    """``apply`` on an asyncpg connection the caller holds (in its transaction: a remote
    worker's call commits with its answer)."""
    rows = await connection.fetch(
        write.value,
        now,
        [i.job_id for i in items],
        [i.lease_epoch for i in items],
        [i.value for i in items],
    )
    return {str(r["job_id"]): job_from_row(r) for r in rows}


async def apply_briefly(
    engine: AsyncEngine, write: FencedWrite, items: Sequence[FencedItem], now: datetime
) -> dict[str, Written]:
    """``apply``, answering each written job's status and version only."""
    if not items:
        return {}
    async with driver_connection(engine) as connection:
        rows = await connection.fetch(
            brief(write),
            now,
            [i.job_id for i in items],
            [i.lease_epoch for i in items],
            [i.value for i in items],
        )
    return {
        str(r["job_id"]): Written(str(r["job_id"]), STATUSES[r["status"]], r["version"])
        for r in rows
    }


async def heartbeat(
    engine: AsyncEngine,
    job_id: str,
    lease_epoch: int,
    lease_ttl: timedelta,
    now: datetime,
    progress: int | None = None,
) -> Job | None:
    """Extends the lease. Reported progress that changed is a new version; an unchanged
    heartbeat only moves the lease (no version, no outbox row)."""
    async with engine.begin() as connection:
        job = await _lock_leased(connection, job_id, lease_epoch)
        if job is None:
            return None
        lease = {"lease_expires_at": now + lease_ttl}
        if progress is not None and progress != job.progress:
            return await _write_as_worker(
                connection, job, {**lease, "progress": progress}, "progress", now
            )
        row = (
            await connection.execute(
                update(jobs).where(jobs.c.job_id == job_id).values(**lease).returning(jobs)
            )
        ).one()
        return job_from_row(row._mapping)


async def fail(
    engine: AsyncEngine,
    job_id: str,
    lease_epoch: int,
    code: str,
    message: str,
    *,
    retryable: bool,
    retry_delay: timedelta,
    now: datetime,
) -> Job | None:
    """A retryable failure with attempts left queues a fresh attempt after ``retry_delay``;
    anything else fails the job (see ``fenced.FAIL_SQL``)."""
    async with driver_connection(engine) as connection:
        return await fail_on(
            connection,
            job_id,
            lease_epoch,
            code,
            message,
            retryable=retryable,
            retry_delay=retry_delay,
            now=now,
        )


async def fail_on(
    connection: Any,
    job_id: str,
    lease_epoch: int,
    code: str,
    message: str,
    *,
    retryable: bool,
    retry_delay: timedelta,
    now: datetime,
) -> Job | None:
    """``fail`` on an asyncpg connection the caller holds. ``retryable`` is whether another
    attempt may cure ``code``; what the owner is told of it is job_errors' to say."""
    answer = job_error(code, retryable)
    row = await connection.fetchrow(
        FAIL_SQL,
        now,
        job_id,
        lease_epoch,
        code,
        message,
        retryable,
        now + retry_delay,
        answer.reason,
        answer.retryable,
    )
    return job_from_row(row) if row is not None else None


async def hand_back(
    engine: AsyncEngine, job_id: str, lease_epoch: int, delay: timedelta, now: datetime
) -> Job | None:
    """Queues a job this worker will not finish (a drain, media out while landing) with
    what it has (see ``fenced.HAND_BACK_SQL``). A job whose owner asked to cancel is
    returned unchanged (still RUNNING): the caller cancels it instead."""
    async with driver_connection(engine) as connection:
        return await hand_back_on(connection, job_id, lease_epoch, delay, now)


async def hand_back_on(
    connection: Any, job_id: str, lease_epoch: int, delay: timedelta, now: datetime
) -> Job | None:
    """``hand_back`` on an asyncpg connection the caller holds."""
    row = await connection.fetchrow(HAND_BACK_SQL, now, job_id, lease_epoch, now + delay)
    return job_from_row(row) if row is not None else None


_OUTCOME_UNKNOWN = {
    **_RELEASE_LEASE,
    "status": Status.NEEDS_ATTENTION.value,
    **error_columns("OUTCOME_UNKNOWN"),
}


def _reap_values(decision: ReapDecision, job: Job, now: datetime) -> dict[str, Any]:
    if decision is ReapDecision.ATTENTION:
        return {
            **_OUTCOME_UNKNOWN,
            "error_message": "the worker stopped while submitting to the provider; "
            "whether the provider has the request is unknown",
        }
    if decision is ReapDecision.CANCEL:
        return {**_RELEASE_LEASE, "status": Status.CANCELLED.value, "completed_at": now}
    if decision is ReapDecision.FAIL:
        return {
            **_RELEASE_LEASE,
            "status": Status.FAILED.value,
            "completed_at": now,
            **error_columns("LEASE_EXPIRED"),
            "error_message": "the worker stopped and no attempts are left",
        }
    queued = {**_RELEASE_LEASE, "status": Status.QUEUED.value, "next_attempt_at": now}
    if decision is ReapDecision.RESUME:
        return queued  # keeps provider_request_id and step: the next worker polls it
    return {**queued, "step": None, "progress": 0}


@dataclass(frozen=True)
class Reaped:
    """A job whose expired lease the reaper resolved, as written, and what it decided."""

    job: Job
    decision: ReapDecision


async def reap_decided(
    engine: AsyncEngine,
    now: datetime,
    limit: int,
    idempotent_providers: Collection[str] = (),
    before_cancel: Callable[[Job], Awaitable[None]] | None = None,
) -> list[Reaped]:
    """Handles running jobs whose lease expired (rides ix_jobs_lease_expiry; replicas skip
    each other's rows). A dead worker's job whose owner asked to cancel and whose request
    the provider holds goes through ``before_cancel`` (which tells the provider) while the
    row is still locked, so one reaper alone tells it, before the job is CANCELLED."""
    async with engine.begin() as connection:
        rows = (
            await connection.execute(
                select(jobs)
                .where(status_is(Status.RUNNING), jobs.c.lease_expires_at < now)
                .order_by(jobs.c.lease_expires_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).all()
        decided = []
        for row in rows:
            job = job_from_row(row._mapping)
            decision = reap_decision(
                job.step,
                has_request=job.provider_request_id is not None,
                cancel_requested=job.cancel_requested,
                attempts_left=job.attempt < job.max_attempts,
                provider_idempotent=job.provider_code in idempotent_providers,
            )
            if (
                decision is ReapDecision.CANCEL
                and job.provider_request_id is not None
                and before_cancel is not None
            ):
                await before_cancel(job)
            decided.append((job, decision))
        # Written in user order, after every provider call: each write may add a ledger
        # entry, whose trigger locks the user's totals row until commit, and writers take
        # those locks in user order only (Python's str order is the trigger's COLLATE "C";
        # see migration 0013). Answered in the order the jobs were taken.
        written = {}
        for job, decision in sorted(decided, key=lambda d: (d[0].user_id, d[0].job_id)):
            written[job.job_id] = await _write_reaped(connection, job, decision, now)
    return [Reaped(written[job.job_id], decision) for job, decision in decided]


async def _write_reaped(
    connection: AsyncConnection, job: Job, decision: ReapDecision, now: datetime
) -> Job:
    return await write(
        connection,
        job,
        _reap_values(decision, job, now),
        actor=Actor.REAPER,
        actor_id="reaper",
        reason=f"lease expired: {decision.value}",
        now=now,
    )


@dataclass(frozen=True)
class Beat:
    """One running attempt as the lease keeper reports it: the lease it holds and the
    newest progress not yet written (None: nothing new)."""

    job_id: str
    lease_epoch: int
    progress: int | None = None


@dataclass(frozen=True)
class BeatResult:
    """Which beaten jobs this process still holds, with their owners' cancel requests. A
    job that is missing has lost its lease."""

    held: dict[str, bool]
    progressed: list[Job]


# One statement per beat for every attempt of the process. `held` is the fence: rows
# still leased at the epoch the attempt holds, locked (in job id order, as the fenced
# writes lock them) so progress is compared with the row as it is now; only a changed
# progress bumps the version (and names the change: the triggers then write its outbox
# row, see sql/job_changes.sql). Rides pk_jobs (one lookup per beaten job id); the statuses
# are literals, like status_is.
BEAT_SQL = """
    WITH beat AS (
        SELECT *
        FROM unnest(CAST(:job_ids AS uuid[]), CAST(:epochs AS bigint[]),
                    CAST(:progress AS integer[])) AS b(job_id, lease_epoch, progress)
    ),
    held AS (
        SELECT j.job_id,
               coalesce(b.progress <> j.progress, false) AS progressed,
               b.progress
        FROM creation.jobs AS j
        JOIN beat AS b ON b.job_id = j.job_id AND b.lease_epoch = j.lease_epoch
        WHERE j.status = 'running'
        ORDER BY j.job_id
        FOR UPDATE OF j
    )
    UPDATE creation.jobs AS j
    SET lease_expires_at = :expires_at,
        progress = CASE WHEN held.progressed THEN held.progress ELSE j.progress END,
        version = j.version + CASE WHEN held.progressed THEN 1 ELSE 0 END,
        updated_at = CASE WHEN held.progressed THEN :now ELSE j.updated_at END,
        change_actor_kind = CASE WHEN held.progressed THEN 'worker' ELSE j.change_actor_kind END,
        change_actor_id = CASE WHEN held.progressed THEN :worker_id ELSE j.change_actor_id END,
        change_reason = CASE WHEN held.progressed THEN 'progress' ELSE j.change_reason END
    FROM held
    WHERE j.job_id = held.job_id
    RETURNING j.*, held.progressed
"""
_BEAT = text(BEAT_SQL).columns(*jobs.c, column("progressed", Boolean))


async def beat(
    engine: AsyncEngine,
    worker_id: str,
    beats: Sequence[Beat],
    lease_ttl: timedelta,
    now: datetime,
) -> BeatResult:
    """Extends the leases of ``beats`` and writes their changed progress (a version and an
    outbox row each, at most one per job per beat), in one transaction."""
    if not beats:
        return BeatResult({}, [])
    async with engine.begin() as connection:
        rows = (
            await connection.execute(
                _BEAT,
                {
                    "job_ids": [b.job_id for b in beats],
                    "epochs": [b.lease_epoch for b in beats],
                    "progress": [b.progress for b in beats],
                    "expires_at": now + lease_ttl,
                    "now": now,
                    "worker_id": worker_id,
                },
            )
        ).all()
        held = {str(r.job_id): bool(r.cancel_requested) for r in rows}
        progressed = [job_from_row(r._mapping) for r in rows if r.progressed]
    return BeatResult(held, progressed)
