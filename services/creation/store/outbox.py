"""The outbox as the relay sees it: take a batch of undelivered rows (locked, skipping rows
another relay holds) and mark them delivered in the same statement, prune old ones."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.tables import jobs, outbox
from services.kit.db import DriverStatement

# A statement trigger on the outbox (migration 0003) sends NOTIFY on this channel at the
# commit of every transaction that wrote outbox rows: no writer can forget to wake the relay.
OUTBOX_CHANNEL = "creation_outbox"


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: int
    # A Job in protobuf's JSON form (creation.job_message, sql/job_changes.sql).
    payload: dict[str, Any]
    # The job's submit trace context (read only while tracing is on).
    trace_parent: str | None = None


# Takes and marks a batch in one statement: the oldest undelivered rows, rows another
# relay holds skipped (replicas share the queue without waiting on each other), marked
# delivered as of ``now`` and locked until the caller's transaction ends. The caller
# commits only once notify has the batch, and rolls back otherwise, so a row counts as
# delivered only after notify committed it. The subquery rides ix_outbox_undelivered,
# the update pk_outbox.
_QUEUED = outbox.alias("queued")
_DUE = (
    select(_QUEUED.c.outbox_id)
    .where(_QUEUED.c.delivered_at.is_(None))
    .order_by(_QUEUED.c.outbox_id)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
    .subquery("due")
)
TAKE = DriverStatement.of(
    update(outbox)
    .where(outbox.c.outbox_id == _DUE.c.outbox_id)
    .values(delivered_at=bindparam("now"))
    .returning(outbox.c.outbox_id, outbox.c.payload)
)


# The same with each row's job's trace context (the job by its primary key); only the
# outbox rows are locked, never the jobs, which workers write meanwhile.
TAKE_TRACED = DriverStatement.of(
    update(outbox)
    .where(outbox.c.outbox_id == _DUE.c.outbox_id)
    .values(delivered_at=bindparam("now"))
    .returning(
        outbox.c.outbox_id,
        outbox.c.payload,
        select(jobs.c.trace_parent)
        .where(jobs.c.job_id == outbox.c.job_id)
        .scalar_subquery()
        .label("trace_parent"),
    )
)


async def take(connection: Any, now: datetime, limit: int, traced: bool = False) -> list[OutboxRow]:
    """Up to ``limit`` undelivered rows, oldest first, marked delivered within the
    transaction open on ``connection`` (an asyncpg connection of the pool, see
    ``kit.db.driver_connection``); ``traced``: with their jobs' trace contexts."""
    statement = TAKE_TRACED if traced else TAKE
    rows = await connection.fetch(statement.sql, *statement.args(now=now, limit=limit))
    return sorted(
        (
            OutboxRow(row["outbox_id"], row["payload"], row["trace_parent"] if traced else None)
            for row in rows
        ),
        key=lambda row: row.outbox_id,
    )


# Rides ix_outbox_delivered; rows a pruning replica holds are skipped, not awaited. A row
# the webhook deliverers have not fanned out yet stays, however old (they may be down).
_PRUNE = text(
    """
    DELETE FROM creation.outbox WHERE outbox_id IN (
        SELECT outbox_id FROM creation.outbox
        WHERE delivered_at < :before AND NOT webhooks_pending
        ORDER BY delivered_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    """
)


async def prune(engine: AsyncEngine, before: datetime, limit: int) -> int:
    """Deletes up to ``limit`` rows delivered before ``before``; how many it deleted."""
    async with engine.begin() as connection:
        result = await connection.execute(_PRUNE, {"before": before, "limit": limit})
    return int(result.rowcount)
