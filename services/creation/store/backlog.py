"""What operators watch in the database: the queue, jobs that wait for an operator, and
the outbox not yet delivered to notify. One statement, read on a timer (see
``services/creation/gauges.py``), never on a scrape."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import driver_connection


@dataclass(frozen=True)
class QueueLevel:
    priority: int
    queued: int
    # Queued jobs whose next attempt is due now (the rest wait out a retry backoff).
    due: int
    # Since the oldest queued job of this priority was submitted.
    oldest_age_seconds: float


@dataclass(frozen=True)
class Backlog:
    queue: list[QueueLevel]
    needs_attention: int
    outbox_undelivered: int
    # Since the oldest undelivered outbox row was written; 0 when none waits.
    outbox_oldest_age_seconds: float


# Ages are measured on the database's clock, the one that wrote created_at. Each part
# rides a partial index, as an index-only scan where it can: the queue
# ix_jobs_claim_queue (it holds priority, next_attempt_at and created_at), the attention
# count ix_jobs_needs_attention, the outbox ix_outbox_undelivered (the oldest row is the
# lowest id). The statuses are literals, so a cached generic plan still uses them.
# The queue is read by priority, at most 16 of them, highest first: priority is set by
# operators, and each value becomes a labelled series.
BACKLOG_SQL = """
    WITH queue AS (
        SELECT priority,
               count(*) AS queued,
               count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
               extract(epoch FROM now() - min(created_at))::float8 AS age
        FROM creation.jobs
        WHERE status = 'queued'
        GROUP BY priority
        ORDER BY priority DESC
        LIMIT 16
    )
    SELECT 'queue' AS part, priority, queued AS n, due, age FROM queue
    UNION ALL
    SELECT 'attention', NULL, count(*), NULL, NULL
    FROM creation.jobs WHERE status = 'needs_attention'
    UNION ALL
    SELECT 'outbox', NULL, count(*), NULL,
           (SELECT extract(epoch FROM now() - created_at)::float8
            FROM creation.outbox WHERE delivered_at IS NULL
            ORDER BY outbox_id LIMIT 1)
    FROM creation.outbox WHERE delivered_at IS NULL
"""


async def read_backlog(engine: AsyncEngine) -> Backlog:
    """One round trip, in autocommit mode, under the engine's statement deadline."""
    async with driver_connection(engine) as connection:
        rows = await connection.fetch(BACKLOG_SQL)
    queue: list[QueueLevel] = []
    attention = undelivered = 0
    outbox_age = 0.0
    for row in rows:
        if row["part"] == "queue":
            queue.append(
                QueueLevel(
                    int(row["priority"]), int(row["n"]), int(row["due"]), max(0.0, row["age"])
                )
            )
        elif row["part"] == "attention":
            attention = int(row["n"])
        else:
            undelivered = int(row["n"])
            outbox_age = max(0.0, row["age"] or 0.0)
    return Backlog(queue, attention, undelivered, outbox_age)
