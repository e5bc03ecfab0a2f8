"""A single job's change from Python: lock the row, compute, update it with the version
bumped and the change named (who, why). Every writer of a job, here or in SQL (the submit
function, store/fenced.py's batches), does only that: the triggers of sql/job_changes.sql
write the change's event, ledger entry and outbox row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.creation.domain import Actor, Job, Status, may_change
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
    via: str = "",
) -> Job:
    """Applies ``values`` to a locked job as one new version, its change named by
    ``actor``, ``actor_id`` and ``reason`` (and ``via``, the service identity that acted
    for the user, if one did)."""
    target = Status(values.get("status", before.status))
    if target is not before.status and not may_change(before.status, target):
        # A bug in the caller, never input: the database would refuse most of these too.
        raise IllegalTransition(f"{before.status} -> {target} for job {before.job_id}")
    row = (
        await connection.execute(
            update(jobs)
            .where(jobs.c.job_id == before.job_id, jobs.c.version == before.version)
            .values(
                **values,
                **change_named(actor, actor_id, reason, via),
                version=jobs.c.version + 1,
                updated_at=now,
            )
            .returning(jobs)
        )
    ).one()
    return job_from_row(row._mapping)


def change_named(actor: Actor, actor_id: str, reason: str, via: str = "") -> dict[str, str | None]:
    """The columns that name a change, for the triggers to copy to its event."""
    return {
        "change_actor_kind": actor.value,
        "change_actor_id": actor_id,
        "change_reason": reason,
        # Always written: a user's own change must not inherit an earlier one's identity.
        "change_via": via or None,
    }


def cancel_asked_by(actor: Actor, actor_id: str) -> dict[str, str]:
    """The columns that name who asked to cancel (the request's and the CANCELLED's events
    name them)."""
    return {"cancel_requester_kind": actor.value, "cancel_requester_id": actor_id}
