"""The outbox as the relay sees it: take a batch of undelivered rows (locked, skipping rows
another relay holds), mark them delivered and read their jobs' messages in the same
statement, prune old ones."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import DriverStatement

# A statement trigger on the outbox (migration 0003) sends NOTIFY on this channel at the
# commit of every transaction that wrote outbox rows: no writer can forget to wake the relay.
OUTBOX_CHANNEL = "creation_outbox"


@dataclass(frozen=True)
class OutboxJob:
    """One job of a taken batch: what the relay delivers for all its rows."""

    # The newest of the job's rows in the batch (the message's outbox_id).
    outbox_id: int
    # The job's message as its row stands when the batch is taken (creation.job_message,
    # sql/job_changes.sql): its version is at least every taken row's.
    payload: dict[str, Any]
    # How many of the batch's rows (the job's versions) it stands for.
    rows: int = 1
    # The job's submit trace context (only while tracing is on).
    trace_parent: str | None = None


# Takes and marks a batch in one statement: the oldest undelivered rows, rows another
# relay holds skipped (replicas share the queue without waiting on each other), marked
# delivered as of ``now`` and locked until the caller's transaction ends. The caller
# commits only once notify has the batch, and rolls back otherwise, so a row counts as
# delivered only after notify committed it. A row records what changed (job, version),
# not a copy of the job: the same statement reads each taken job's row once, however
# many of its versions the batch holds, and builds its message from it (inlined, once
# per job). Read in the statement's snapshot, in which every taken row's change is
# committed, so the message's version is at least every taken row's: the newest state
# stands for the superseded ones (notify's version gate would drop them anyway). The
# outbox row names a job whose row is never deleted (migration 0034; a deleted job is
# a tombstone row, whose message says so). Only the outbox rows are locked, never the
# jobs, which workers write meanwhile. ``due`` rides ix_outbox_undelivered, the update
# pk_outbox (or a scan of the pruned outbox while it is small), each job pk_jobs: the
# OFFSET 0 keeps the planner from joining the whole jobs table by hash instead, which
# it prefers while the table is small and a round takes a few rows.
TAKE = DriverStatement.of(
    text(
        """
        WITH taken AS (
            UPDATE creation.outbox AS o SET delivered_at = :now
            FROM (
                SELECT outbox_id FROM creation.outbox
                WHERE delivered_at IS NULL
                ORDER BY outbox_id
                LIMIT :limit
                FOR UPDATE SKIP LOCKED
            ) AS due
            WHERE o.outbox_id = due.outbox_id
            RETURNING o.outbox_id, o.job_id
        )
        SELECT l.outbox_id, l.rows, m.payload, m.trace_parent
        FROM (
            SELECT job_id, max(outbox_id) AS outbox_id, count(*) AS rows
            FROM taken GROUP BY job_id
        ) AS l
        CROSS JOIN LATERAL (
            SELECT creation.job_message(j) AS payload, j.trace_parent
            FROM creation.jobs AS j WHERE j.job_id = l.job_id
            OFFSET 0
        ) AS m
        """
    ).bindparams(bindparam("limit"), bindparam("now"))
)


async def take(connection: Any, now: datetime, limit: int, traced: bool = False) -> list[OutboxJob]:
    """Up to ``limit`` undelivered rows, oldest first, marked delivered within the
    transaction open on ``connection`` (an asyncpg connection of the pool, see
    ``kit.db.driver_connection``), as one message per job, in the order of each job's
    newest row; ``traced``: with their jobs' trace contexts."""
    rows = await connection.fetch(TAKE.sql, *TAKE.args(now=now, limit=limit))
    return sorted(
        (
            OutboxJob(
                row["outbox_id"],
                row["payload"],
                row["rows"],
                row["trace_parent"] if traced else None,
            )
            for row in rows
        ),
        key=lambda job: job.outbox_id,
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
