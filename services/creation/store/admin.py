"""Operator actions: the needs-attention queue, decisions, the audit trail, grants."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Event, Job, Status, Step
from services.creation.errors import JobCancelRequested, JobNotAwaitingOperator, JobNotFound
from services.creation.job_errors import error_columns
from services.creation.store.predicates import status_is
from services.creation.store.rows import job_from_row
from services.creation.store.writes import cancel_asked_by, lock_job, write
from services.creation.tables import job_events, jobs
from services.kit.db import fetch, reading


@dataclass(frozen=True)
class AttentionCursor:
    """Where a page of the needs-attention queue ends: the last job's (updated_at, job_id)."""

    updated_at: datetime
    job_id: str


@dataclass(frozen=True)
class EventCursor:
    """Where a page of a job's events ends: the last event's id."""

    event_id: int


async def list_attention(
    engine: AsyncEngine, limit: int, after: AttentionCursor | None
) -> tuple[list[Job], AttentionCursor | None]:
    """Oldest first by last change (the queue through ix_jobs_needs_attention, sorted)."""
    query = select(jobs).where(status_is(Status.NEEDS_ATTENTION))
    if after is not None:
        query = query.where(
            or_(
                jobs.c.updated_at > after.updated_at,
                and_(jobs.c.updated_at == after.updated_at, jobs.c.job_id > after.job_id),
            )
        )
    query = query.order_by(jobs.c.updated_at, jobs.c.job_id).limit(limit + 1)
    rows = await fetch(engine, query)
    found = [job_from_row(r._mapping) for r in rows[:limit]]
    if len(rows) <= limit or not found:
        return found, None
    return found, AttentionCursor(found[-1].updated_at, found[-1].job_id)


class Decision(enum.StrEnum):
    """What an operator decides for a job that needs attention."""

    RETRY = "retry"
    FAIL = "fail"
    CANCEL = "cancel"
    ADOPT = "adopt"


def _resolution_values(
    decision: Decision, job: Job, operator: str, reason: str, now: datetime
) -> dict[str, Any]:
    if decision == Decision.RETRY:
        # A fresh attempt: the old provider request is abandoned, so one more try is allowed.
        return {
            "status": Status.QUEUED.value,
            "step": None,
            "progress": 0,
            "provider_request_id": None,
            "cancel_requested": False,
            "cancel_requester_kind": None,
            "cancel_requester_id": None,
            "next_attempt_at": now,
            "max_attempts": max(job.max_attempts, job.attempt + 1),
        }
    if decision == Decision.FAIL:
        return {
            "status": Status.FAILED.value,
            "completed_at": now,
            **error_columns("OPERATOR_FAILED"),
            "error_message": reason,
        }
    cancelled = {"status": Status.CANCELLED.value, "completed_at": now}
    # The CANCELLED names who asked: the owner, if they did, else the operator.
    return (
        cancelled
        if job.cancel_requested
        else {**cancelled, **cancel_asked_by(Actor.OPERATOR, operator)}
    )


async def read_job(engine: AsyncEngine, job_id: str) -> Job:
    """The job as it is now (rides pk_jobs); JobNotFound when there is none."""
    rows = await fetch(engine, select(jobs).where(jobs.c.job_id == job_id))
    if not rows:
        raise JobNotFound()
    return job_from_row(rows[0]._mapping)


def _adoption_values(request_id: str, now: datetime) -> dict[str, Any]:
    """Back to the queue holding ``request_id``: the next worker claims it without a new
    attempt and polls the request (as after a RESUME), never submitting."""
    return {
        "status": Status.QUEUED.value,
        "step": Step.GENERATING.value,
        "provider_request_id": request_id,
        "next_attempt_at": now,
        "error_code": None,
        "error_message": None,
        "error_reason": None,
        "error_retryable": None,
    }


async def adopt(
    engine: AsyncEngine,
    job_id: str,
    request_id: str,
    *,
    actor: Actor,
    actor_id: str,
    reason: str,
    now: datetime,
) -> Job:
    """Puts a NEEDS_ATTENTION job back to polling ``request_id`` (an operator's decision,
    or the reaper's automatic recovery). A job whose owner asked to cancel meanwhile is
    refused: the owner's cancel is the decision to make."""
    async with engine.begin() as connection:
        job = await lock_job(connection, jobs.c.job_id == job_id)
        if job is None:
            raise JobNotFound()
        if job.status is not Status.NEEDS_ATTENTION:
            raise JobNotAwaitingOperator(job.status.value)
        if job.cancel_requested:
            raise JobCancelRequested()
        return await write(
            connection,
            job,
            _adoption_values(request_id, now),
            actor=actor,
            actor_id=actor_id,
            reason=reason,
            now=now,
        )


async def resolve(
    engine: AsyncEngine, job_id: str, decision: Decision, operator: str, reason: str, now: datetime
) -> Job:
    """RETRY, FAIL or CANCEL (ADOPT is ``adopt``: it carries a request id)."""
    if decision is Decision.ADOPT:
        raise ValueError("adopt a request with store.admin.adopt")
    async with engine.begin() as connection:
        job = await lock_job(connection, jobs.c.job_id == job_id)
        if job is None:
            raise JobNotFound()
        if job.status is not Status.NEEDS_ATTENTION:
            raise JobNotAwaitingOperator(job.status.value)
        return await write(
            connection,
            job,
            _resolution_values(decision, job, operator, reason, now),
            actor=Actor.OPERATOR,
            actor_id=operator,
            reason=reason,
            now=now,
        )


async def list_events(
    engine: AsyncEngine, job_id: str, limit: int, after: EventCursor | None
) -> tuple[list[Event], EventCursor | None]:
    """Oldest first (rides uq_job_events_job_id_version)."""
    async with reading(engine) as connection:
        if (
            await connection.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id))
        ).first() is None:
            raise JobNotFound()
        rows = (
            await connection.execute(
                select(job_events)
                .where(
                    job_events.c.job_id == job_id,
                    job_events.c.event_id > (after.event_id if after else 0),
                )
                .order_by(job_events.c.version)
                .limit(limit + 1)
            )
        ).all()
    events = [
        Event(
            event_id=r.event_id,
            job_id=str(r.job_id),
            version=r.version,
            from_status=Status(r.from_status) if r.from_status else None,
            to_status=Status(r.to_status),
            actor=Actor(r.actor_kind),
            actor_id=r.actor_id,
            reason=r.reason,
            created_at=r.created_at,
            requester=Actor(r.requester_kind) if r.requester_kind else None,
            requester_id=r.requester_id or "",
            via=r.via or "",
        )
        for r in rows[:limit]
    ]
    if len(rows) <= limit or not events:
        return events, None
    return events, EventCursor(events[-1].event_id)
