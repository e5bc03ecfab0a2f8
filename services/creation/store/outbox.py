"""The outbox as the relay sees it: take a batch of undelivered rows (locked, skipping rows
another relay holds), mark them delivered in the same transaction, prune old ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.tables import jobs, outbox


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: int
    # A JobState in protobuf's JSON form (see store/changes.py).
    payload: dict[str, Any]
    # The job's submit trace context (read only while tracing is on).
    trace_parent: str | None = None


# Oldest first, rows another relay holds skipped: replicas share the queue without waiting
# on each other. Rides ix_outbox_undelivered.
_TAKE = (
    select(outbox.c.outbox_id, outbox.c.payload)
    .where(outbox.c.delivered_at.is_(None))
    .order_by(outbox.c.outbox_id)
    .with_for_update(skip_locked=True)
)


# The same with each row's job's trace context (the job by its primary key); only the
# outbox rows are locked, never the jobs, which workers write meanwhile.
_TAKE_TRACED = (
    select(outbox.c.outbox_id, outbox.c.payload, jobs.c.trace_parent)
    .select_from(outbox.join(jobs, jobs.c.job_id == outbox.c.job_id))
    .where(outbox.c.delivered_at.is_(None))
    .order_by(outbox.c.outbox_id)
    .with_for_update(skip_locked=True, of=outbox)
)


async def take(connection: AsyncConnection, limit: int, traced: bool = False) -> list[OutboxRow]:
    """Locks up to ``limit`` undelivered rows until ``connection``'s transaction ends;
    ``traced``: with their jobs' trace contexts."""
    if not traced:
        rows = (await connection.execute(_TAKE.limit(limit))).all()
        return [OutboxRow(int(row.outbox_id), row.payload) for row in rows]
    traced_rows = (await connection.execute(_TAKE_TRACED.limit(limit))).all()
    return [OutboxRow(int(r.outbox_id), r.payload, r.trace_parent) for r in traced_rows]


# One statement whatever the batch size (an array, not an IN list of n parameters, so it
# is prepared once). Rides pk_outbox.
_MARK_DELIVERED = text(
    "UPDATE creation.outbox SET delivered_at = :now"
    " WHERE outbox_id = ANY(CAST(:outbox_ids AS bigint[]))"
)


async def mark_delivered(
    connection: AsyncConnection, outbox_ids: Sequence[int], now: datetime
) -> None:
    """Within the transaction that took them."""
    if outbox_ids:
        await connection.execute(_MARK_DELIVERED, {"now": now, "outbox_ids": list(outbox_ids)})


# Rides ix_outbox_delivered; rows a pruning replica holds are skipped, not awaited.
_PRUNE = text(
    """
    DELETE FROM creation.outbox WHERE outbox_id IN (
        SELECT outbox_id FROM creation.outbox
        WHERE delivered_at < :before
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
