"""The webhook deliverer's SQL: claiming due deliveries, recording attempts, and the
endpoints' failing state. Run on the pool's asyncpg connection (store/outbox.py's way).

Times are the database's (``now()``): every replica agrees on what is due."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WEBHOOKS_CHANNEL = "creation_webhooks"

# Each attempt's outcome, fenced by the claim it was made under (a lapsed claim that
# another deliverer took over records nothing).
_RECORD = """
UPDATE creation.webhook_deliveries AS d
SET state = r.state,
    attempts = d.attempts + 1,
    next_attempt_at = coalesce(r.next_attempt_at, d.next_attempt_at),
    claimed_until = NULL,
    last_attempt_at = r.attempted_at,
    last_status_code = r.status_code,
    last_error = r.error,
    last_response_excerpt = r.excerpt,
    completed_at = CASE WHEN r.state = 'pending' THEN NULL ELSE r.attempted_at END
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::timestamptz[],
            $5::timestamptz[], $6::int[], $7::text[], $8::text[])
     AS r(delivery_id, claimed_until, state, next_attempt_at, attempted_at, status_code,
          error, excerpt)
WHERE d.delivery_id = r.delivery_id AND d.claimed_until = r.claimed_until
"""

# The endpoints' failing runs: an answered attempt ends one, a failed one starts (or
# continues) it; a run as long as the limit, or a 410, disables the endpoint. Returns the
# endpoints this disabled, with why.
_ENDPOINTS = """
UPDATE creation.webhook_endpoints AS e
SET failing_since = CASE WHEN r.ok THEN NULL ELSE coalesce(e.failing_since, r.failed_at) END,
    enabled = NOT (r.gone OR (NOT r.ok AND coalesce(e.failing_since, r.failed_at)
                              <= now() - make_interval(secs => $5))),
    disabled_reason = CASE WHEN r.gone THEN 'gone'
                           WHEN NOT r.ok AND coalesce(e.failing_since, r.failed_at)
                                <= now() - make_interval(secs => $5) THEN 'failing'
                           ELSE '' END,
    updated_at = now()
FROM unnest($1::uuid[], $2::bool[], $3::bool[], $4::timestamptz[])
     AS r(endpoint_id, ok, gone, failed_at)
WHERE e.endpoint_id = r.endpoint_id AND e.enabled
  AND (NOT r.ok OR r.gone OR e.failing_since IS NOT NULL)
RETURNING e.endpoint_id::text, e.enabled, e.disabled_reason
"""

_PRUNE = """
DELETE FROM creation.webhook_deliveries WHERE delivery_id IN (
  SELECT delivery_id FROM creation.webhook_deliveries
  WHERE state <> 'pending' AND completed_at < now() - make_interval(secs => $1)
  LIMIT $2)
"""


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    claimed_until: datetime
    message_id: str
    endpoint_id: str
    event_type: str
    payload: str
    occurred_at: datetime
    attempts: int
    job_version: int
    url: str
    secret: str | None
    previous_secret: str | None
    # The endpoint was in a failing run when claimed.
    failing: bool
    # The endpoint had room past the part this claim took of it: claim again.
    more: bool = False


@dataclass(frozen=True)
class Attempted:
    delivery_id: int
    claimed_until: datetime
    endpoint_id: str
    # pending (to be retried), succeeded, failed
    state: str
    next_attempt_at: datetime | None
    attempted_at: datetime
    status_code: int | None
    error: str
    excerpt: str
    # The endpoint answered 2xx; it answered 410 Gone; it was in a failing run.
    ok: bool
    gone: bool
    failing: bool = False


async def fan_out(connection: Any, limit: int) -> int:
    """Fans out up to ``limit`` marked outbox rows to their deliveries (one statement:
    creation.fan_out_webhooks); how many rows it took."""
    taken = await connection.fetchval(
        "SELECT taken FROM creation.fan_out_webhooks($1::integer)", limit
    )
    return int(taken)


async def claim(connection: Any, limit: int, claim_seconds: float, parts: int = 1) -> list[Claimed]:
    """Claims up to ``limit`` due deliveries, each endpoint's up to its room (max_in_flight
    less what is in flight on any replica) and at most ceil(max_in_flight / ``parts``) of
    it (creation.claim_webhooks, migration 0032: each enabled endpoint with due deliveries
    locked with SKIP LOCKED, so a replica claiming for it now is skipped and the limit
    holds across replicas; then its oldest due deliveries, skipping rows another replica
    holds; a lapsed claim is due again). One statement in its own transaction."""
    rows = await connection.fetch(
        "SELECT * FROM creation.claim_webhooks($1::integer, $2::float8, $3::integer)",
        limit,
        claim_seconds,
        parts,
    )
    return [Claimed(*row) for row in rows]


async def record(
    connection: Any, attempts: Sequence[Attempted], disable_after: float
) -> list[tuple[str, str]]:
    """Writes the attempts and the endpoints' failing runs, in one transaction; the
    endpoints this disabled, with why."""
    if not attempts:
        return []
    latest: dict[str, Attempted] = {}
    first_failure: dict[str, datetime] = {}
    gone: set[str] = set()
    for attempt in attempts:
        seen = latest.get(attempt.endpoint_id)
        if seen is None or attempt.attempted_at >= seen.attempted_at:
            latest[attempt.endpoint_id] = attempt
        if not attempt.ok:
            known = first_failure.get(attempt.endpoint_id)
            if known is None or attempt.attempted_at < known:
                first_failure[attempt.endpoint_id] = attempt.attempted_at
        if attempt.gone:
            gone.add(attempt.endpoint_id)
    # Only endpoints whose failing run starts, goes on or ends: a healthy endpoint's
    # answered attempts change nothing of it (one statement, no transaction).
    failing = {a.endpoint_id for a in attempts if a.failing}
    endpoints = sorted(e for e, a in latest.items() if not a.ok or e in gone or e in failing)
    arguments = (
        [a.delivery_id for a in attempts],
        [a.claimed_until for a in attempts],
        [a.state for a in attempts],
        [a.next_attempt_at for a in attempts],
        [a.attempted_at for a in attempts],
        [a.status_code for a in attempts],
        [a.error for a in attempts],
        [a.excerpt for a in attempts],
    )
    if not endpoints:
        await connection.execute(_RECORD, *arguments)
        return []
    async with connection.transaction():
        await connection.execute(
            _RECORD,
            *arguments,
        )
        rows = await connection.fetch(
            _ENDPOINTS,
            endpoints,
            [latest[e].ok for e in endpoints],
            [e in gone for e in endpoints],
            [first_failure.get(e, latest[e].attempted_at) for e in endpoints],
            disable_after,
        )
    return [(row[0], row[2]) for row in rows if not row[1]]


# A per-job endpoint (SubmitJob's webhook) outlives its job by the retention: once the job
# is done (terminal or deleted, or gone) and has not changed for that long, and none of its
# deliveries is pending, it goes, with its delivery log. Without this the endpoints table
# would grow by one row for every job that ever had a webhook.
_PRUNE_PER_JOB = """
DELETE FROM creation.webhook_endpoints WHERE endpoint_id IN (
  SELECT e.endpoint_id FROM creation.webhook_endpoints AS e
  LEFT JOIN creation.jobs AS j ON j.job_id = e.job_id
  WHERE e.job_id IS NOT NULL
    AND (j.job_id IS NULL OR ((j.status IN ('succeeded', 'failed', 'cancelled')
                               OR j.deleted_at IS NOT NULL)
                              AND j.updated_at < now() - make_interval(secs => $1)))
    AND NOT EXISTS (SELECT FROM creation.webhook_deliveries AS d
                    WHERE d.endpoint_id = e.endpoint_id AND d.state = 'pending')
  LIMIT $2)
"""


async def prune(connection: Any, retention_seconds: float, limit: int) -> tuple[int, int]:
    """Deliveries done for longer than the retention, then per-job endpoints done with:
    how many of each were deleted."""
    deliveries = await connection.execute(_PRUNE, retention_seconds, limit)
    endpoints = await connection.execute(_PRUNE_PER_JOB, retention_seconds, limit)
    return int(deliveries.split()[-1]), int(endpoints.split()[-1])
