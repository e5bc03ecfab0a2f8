"""The one way a single job changes: lock the row, compute, update it with the version
bumped, and record the change's side rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.creation.domain import Actor, Job, Status, may_change
from services.creation.store.changes import Change, record
from services.creation.store.rows import job_from_row
from services.creation.tables import jobs


class IllegalTransition(RuntimeError):
    """The code asked for a status change the state machine does not have."""


async def lock_job(connection: AsyncConnection, *conditions: ColumnElement[bool]) -> Job | None:
    """The job matching ``conditions``, locked until the transaction ends."""
    row = (await connection.execute(select(jobs).where(*conditions).with_for_update())).first()
    return job_from_row(row._mapping) if row else None


async def write(
    connection: AsyncConnection,
    before: Job,
    values: dict[str, Any],
    *,
    actor: Actor,
    actor_id: str,
    reason: str,
    now: datetime,
) -> Job:
    """Applies ``values`` to a locked job as one new version."""
    target = Status(values.get("status", before.status))
    if target is not before.status and not may_change(before.status, target):
        # A bug in the caller, never input: the database would refuse most of these too.
        raise IllegalTransition(f"{before.status} -> {target} for job {before.job_id}")
    row = (
        await connection.execute(
            update(jobs)
            .where(jobs.c.job_id == before.job_id, jobs.c.version == before.version)
            .values(**values, version=jobs.c.version + 1, updated_at=now)
            .returning(jobs)
        )
    ).one()
    after = job_from_row(row._mapping)
    await record(connection, [Change(before.status, after, actor, actor_id, reason)], now)
    return after
