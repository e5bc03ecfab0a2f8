"""What workers and the reaper do to jobs. Every write by a worker is fenced by
``(job_id, lease_epoch)``: a worker whose lease was taken over matches nothing, gets None,
and must abandon the job."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import Actor, Job, ReapDecision, Status, Step, reap_decision
from services.creation.store.changes import Change, record
from services.creation.store.predicates import status_is
from services.creation.store.rows import job_from_row
from services.creation.store.writes import lock_job, write
from services.creation.tables import jobs

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
    """Claims up to ``limit`` due jobs in one statement (rides ix_jobs_claim_queue, skipping
    rows other workers hold). A job that already has a provider request resumes polling
    in the same attempt; any other starts a new attempt."""
    due = (
        select(jobs.c.job_id)
        .where(status_is(Status.QUEUED), jobs.c.next_attempt_at <= now)
        .order_by(jobs.c.priority.desc(), jobs.c.next_attempt_at, jobs.c.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    fresh = jobs.c.provider_request_id.is_(None)
    async with engine.begin() as connection:
        rows = (
            await connection.execute(
                update(jobs)
                .where(jobs.c.job_id.in_(due.scalar_subquery()))
                .values(
                    status=Status.RUNNING.value,
                    attempt=case((fresh, jobs.c.attempt + 1), else_=jobs.c.attempt),
                    step=case((fresh, Step.PREPARING.value), else_=jobs.c.step),
                    progress=case((fresh, 0), else_=jobs.c.progress),
                    lease_owner=worker_id,
                    lease_epoch=jobs.c.lease_epoch + 1,
                    lease_expires_at=now + lease_ttl,
                    started_at=case((jobs.c.started_at.is_(None), now), else_=jobs.c.started_at),
                    version=jobs.c.version + 1,
                    updated_at=now,
                )
                .returning(jobs)
            )
        ).all()
        claimed = [job_from_row(r._mapping) for r in rows]
        await record(
            connection,
            [Change(Status.QUEUED, job, Actor.WORKER, worker_id, "claimed") for job in claimed],
            now,
        )
    return claimed


async def _fenced(
    engine: AsyncEngine,
    job_id: str,
    lease_epoch: int,
    values: dict[str, Any] | None,
    reason: str,
    now: datetime,
    *,
    require_cancel: bool = False,
) -> Job | None:
    """Applies ``values`` if the caller still holds the lease; None if it does not."""
    async with engine.begin() as connection:
        job = await _lock_leased(connection, job_id, lease_epoch)
        if job is None or (require_cancel and not job.cancel_requested):
            return None
        if values is None:
            return job
        return await _write_as_worker(connection, job, values, reason, now)


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


async def mark_submitting(
    engine: AsyncEngine, job_id: str, lease_epoch: int, now: datetime
) -> Job | None:
    """Committed before the provider is called, so a crash during the call is visible."""
    return await _fenced(
        engine, job_id, lease_epoch, {"step": Step.SUBMITTING.value}, "submitting", now
    )


async def record_request(
    engine: AsyncEngine, job_id: str, lease_epoch: int, request_id: str, now: datetime
) -> Job | None:
    """Committed as soon as the provider accepted, so no later crash submits again."""
    values = {"provider_request_id": request_id, "step": Step.GENERATING.value}
    return await _fenced(engine, job_id, lease_epoch, values, "provider accepted", now)


async def complete(
    engine: AsyncEngine, job_id: str, lease_epoch: int, output_asset_id: str, now: datetime
) -> Job | None:
    values = {
        **_RELEASE_LEASE,
        "status": Status.SUCCEEDED.value,
        "step": Step.DONE.value,
        "progress": 100,
        "output_asset_id": output_asset_id,
        "error_code": None,
        "error_message": None,
        "completed_at": now,
    }
    return await _fenced(engine, job_id, lease_epoch, values, "completed", now)


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
    anything else fails the job."""
    async with engine.begin() as connection:
        job = await _lock_leased(connection, job_id, lease_epoch)
        if job is None:
            return None
        error = {"error_code": code, "error_message": message, **_RELEASE_LEASE}
        if retryable and job.attempt < job.max_attempts and not job.cancel_requested:
            values = {
                **error,
                "status": Status.QUEUED.value,
                "step": None,
                "provider_request_id": None,
                "next_attempt_at": now + retry_delay,
            }
        else:
            values = {**error, "status": Status.FAILED.value, "completed_at": now}
        return await _write_as_worker(connection, job, values, code, now)


async def acknowledge_cancel(
    engine: AsyncEngine, job_id: str, lease_epoch: int, now: datetime
) -> Job | None:
    """The worker stopped at a safe point after the owner asked to cancel."""
    values = {**_RELEASE_LEASE, "status": Status.CANCELLED.value, "completed_at": now}
    return await _fenced(engine, job_id, lease_epoch, values, "cancelled", now, require_cancel=True)


def _reap_values(decision: ReapDecision, job: Job, now: datetime) -> dict[str, Any]:
    if decision is ReapDecision.ATTENTION:
        return {
            **_RELEASE_LEASE,
            "status": Status.NEEDS_ATTENTION.value,
            "error_code": "OUTCOME_UNKNOWN",
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
            "error_code": "LEASE_EXPIRED",
            "error_message": "the worker stopped and no attempts are left",
        }
    queued = {**_RELEASE_LEASE, "status": Status.QUEUED.value, "next_attempt_at": now}
    if decision is ReapDecision.RESUME:
        return queued  # keeps provider_request_id and step: the next worker polls it
    return {**queued, "step": None, "progress": 0}


async def reap(
    engine: AsyncEngine, now: datetime, limit: int, idempotent_providers: Collection[str] = ()
) -> list[Job]:
    """Handles running jobs whose lease expired (rides ix_jobs_lease_expiry; replicas skip
    each other's rows)."""
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
        reaped = []
        for row in rows:
            job = job_from_row(row._mapping)
            decision = reap_decision(
                job.step,
                has_request=job.provider_request_id is not None,
                cancel_requested=job.cancel_requested,
                attempts_left=job.attempt < job.max_attempts,
                provider_idempotent=job.provider_code in idempotent_providers,
            )
            reaped.append(await _write_reaped(connection, job, decision, now))
    return reaped


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
