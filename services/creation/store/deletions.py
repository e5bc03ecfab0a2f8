"""Deleting a finished job (DeleteJob). The row stays as a tombstone for the points ledger
and the audit trail (ledger entries, events and outbox rows refer to it), with the user's
words removed; the owner's reads leave it out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, exists, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Job
from services.creation.errors import JobNotFinished, JobNotFound
from services.creation.store.rows import job_from_row
from services.creation.store.writes import lock_job, write
from services.creation.tables import jobs
from services.kit.db import DriverStatement, driver_fetch

# What deleting removes: the user's words (prompt, parameters), what a provider may have
# said about them, and the idempotency key with the hash of the request it guarded (the
# key is free for a new job). ck_jobs_deleted_shape holds every tombstone to this.
SCRUBBED: dict[str, Any] = {
    "prompt": "",
    "negative_prompt": "",
    "parameters": {},
    "error_message": None,
    "idempotency_key": None,
    "request_hash": "",
}

# One job of one user, deleted or not (primary key).
OWNED_JOB = DriverStatement.of(
    select(jobs).where(jobs.c.job_id == bindparam("job_id"), jobs.c.user_id == bindparam("user_id"))
)

# Whether another of the user's shown jobs was made from this input (rides
# ix_jobs_user_newest by user: a user's history, not the table).
INPUT_IN_USE = DriverStatement.of(
    select(
        exists().where(
            jobs.c.user_id == bindparam("user_id"),
            jobs.c.input_asset_id == bindparam("asset_id"),
            jobs.c.job_id != bindparam("job_id"),
            jobs.c.deleted_at.is_(None),
        )
    )
)


async def deletable(engine: AsyncEngine, user_id: str, job_id: str) -> Job:
    """The user's job as DeleteJob may act on it: finished (deleted or not). Unknown and
    another user's are JobNotFound; unfinished is JobNotFinished."""
    rows = await driver_fetch(engine, OWNED_JOB, job_id=job_id, user_id=user_id)
    if not rows:
        raise JobNotFound()
    job = job_from_row(rows[0])
    if not job.status.terminal:
        raise JobNotFinished(job.status.value)
    return job


async def input_in_use(engine: AsyncEngine, job: Job) -> bool:
    """Another of the owner's jobs that is still shown was made from ``job``'s input."""
    rows = await driver_fetch(
        engine, INPUT_IN_USE, user_id=job.user_id, asset_id=job.input_asset_id, job_id=job.job_id
    )
    return bool(rows[0][0])


async def mark_deleted(
    engine: AsyncEngine, user_id: str, job_id: str, now: datetime, via: str = ""
) -> Job:
    """Turns the finished job into a tombstone, as one new version whose outbox row tells
    notify (a tombstone, see creation.job_message); a job already deleted is returned
    as it is."""
    async with engine.begin() as connection:
        job = await lock_job(connection, jobs.c.job_id == job_id, jobs.c.user_id == user_id)
        if job is None:
            raise JobNotFound()
        if job.deleted_at is not None:
            return job
        if not job.status.terminal:
            raise JobNotFinished(job.status.value)
        # Never before completion, whichever clock wrote that (a worker's may run ahead).
        deleted_at = max(now, job.completed_at) if job.completed_at is not None else now
        values = {**SCRUBBED, "deleted_at": deleted_at}
        return await write(
            connection,
            job,
            values,
            actor=Actor.USER,
            actor_id=user_id,
            reason="delete",
            now=now,
            via=via,
        )
