"""Every statement the APNs sender runs on notify.pushes, notify.push_tokens and
notify.push_attempts (asyncpg on the pool's connections, autocommit: each statement is
its own transaction, or one short transaction where a token and its pushes change
together)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import driver_connection
from services.notify.apns.claims import ClaimedPush, Exchange, Outcome
from services.notify.store.boundary import database

# Claims up to $1 due pushes and leases them for $2 seconds in one statement: SKIP LOCKED
# lets replicas claim side by side; the bumped next_attempt_at keeps a claimed push from
# being claimed again until the lease ends. Rides the partial index on next_attempt_at
# (status written literally so a generic plan still uses it).
CLAIM = """
WITH due AS (
    SELECT push_id FROM notify.pushes
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE notify.pushes AS p
SET attempts = p.attempts + 1, next_attempt_at = now() + make_interval(secs => $2)
FROM due, notify.push_tokens AS t
WHERE p.push_id = due.push_id AND t.token_id = p.token_id
RETURNING p.push_id, p.attempts, p.kind, p.created_at, p.expires_at,
    p.headers::text AS headers, p.payload::text AS payload, t.token_id, t.token,
    t.environment, t.status AS token_status, now() AS claimed_at
"""

# Records a batch's outcomes and HTTP exchanges in one statement. A row is only written
# by the claim that holds it (same attempts count, still pending): a sender whose lease
# ran out cannot overwrite what the next claim did.
RECORD = """
WITH outcome AS (
    SELECT * FROM unnest(
        $1::bigint[], $2::int[], $3::text[], $4::text[], $5::int[], $6::text[],
        $7::timestamptz[], $8::timestamptz[]
    ) AS o(push_id, attempt, status, apns_id, http_status, reason, next_attempt_at, sent_at)
), updated AS (
    UPDATE notify.pushes AS p
    SET status = o.status, apns_id = coalesce(o.apns_id, p.apns_id),
        last_http_status = o.http_status, last_reason = o.reason,
        next_attempt_at = coalesce(o.next_attempt_at, p.next_attempt_at),
        sent_at = coalesce(o.sent_at, p.sent_at)
    FROM outcome AS o
    WHERE p.push_id = o.push_id AND p.attempts = o.attempt AND p.status = 'pending'
    RETURNING p.push_id
), exchanges AS (
    INSERT INTO notify.push_attempts (push_id, attempt, apns_id, http_status, reason, at)
    SELECT * FROM unnest($9::bigint[], $10::int[], $11::text[], $12::int[], $13::text[],
        $14::timestamptz[])
    RETURNING 1
)
SELECT (SELECT count(*) FROM updated) AS updated, (SELECT count(*) FROM exchanges) AS logged
"""

# 410: the token is retired unless it was registered again after Apple's timestamp.
RETIRE_TOKEN = """
UPDATE notify.push_tokens
SET status = 'retired', status_reason = 'Unregistered', retired_at = now()
WHERE token_id = $1 AND status = 'active' AND ($2::timestamptz IS NULL OR registered_at <= $2)
RETURNING token_id
"""

MARK_TOKEN_BAD = """
UPDATE notify.push_tokens
SET status = 'bad', status_reason = $2, retired_at = now()
WHERE token_id = $1 AND status = 'active'
RETURNING token_id
"""

# A token that stopped being active takes its waiting pushes with it.
DROP_PENDING_OF_TOKEN = """
UPDATE notify.pushes SET status = 'dropped', last_reason = $2
WHERE token_id = $1 AND status = 'pending'
"""


class PushStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def claim(self, limit: int, lease_seconds: float) -> list[ClaimedPush]:
        async with driver_connection(self._engine) as connection:
            rows = await connection.fetch(CLAIM, limit, lease_seconds)
        return [_claimed(row) for row in rows]

    @database
    async def record(self, outcomes: list[Outcome], exchanges: list[Exchange]) -> int:
        """Writes outcomes and exchanges; returns how many outcomes still held their claim."""
        if not outcomes and not exchanges:
            return 0
        async with driver_connection(self._engine) as connection:
            row = await connection.fetchrow(
                RECORD,
                [o.push_id for o in outcomes],
                [o.attempt for o in outcomes],
                [o.status for o in outcomes],
                [o.apns_id for o in outcomes],
                # 0 (no answer came) is stored as NULL.
                [o.http_status or None for o in outcomes],
                [o.reason for o in outcomes],
                [o.next_attempt_at for o in outcomes],
                # A push that went is sent as of its claim (NULL: it did not go).
                [o.sent_at if o.sent else None for o in outcomes],
                [e.push_id for e in exchanges],
                [e.attempt for e in exchanges],
                [e.apns_id for e in exchanges],
                [e.http_status or None for e in exchanges],
                [e.reason for e in exchanges],
                [e.at for e in exchanges],
            )
        return int(row["updated"])

    @database
    async def retire_token(self, token_id: Any, unregistered_at: datetime | None) -> bool:
        async with driver_connection(self._engine) as connection, connection.transaction():
            retired = await connection.fetchval(RETIRE_TOKEN, token_id, unregistered_at)
            if retired is not None:
                await connection.execute(DROP_PENDING_OF_TOKEN, token_id, "TokenRetired")
        return retired is not None

    @database
    async def mark_token_bad(self, token_id: Any, reason: str) -> None:
        async with driver_connection(self._engine) as connection, connection.transaction():
            marked = await connection.fetchval(MARK_TOKEN_BAD, token_id, reason)
            if marked is not None:
                await connection.execute(DROP_PENDING_OF_TOKEN, token_id, "TokenBad")


def _claimed(row: Any) -> ClaimedPush:
    headers = json.loads(row["headers"]) or {}
    payload = json.loads(row["payload"])
    return ClaimedPush(
        push_id=row["push_id"],
        attempt=row["attempts"],
        kind=row["kind"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        headers={str(k): str(v) for k, v in headers.items() if v is not None},
        # Compact: Apple counts the bytes sent.
        payload=json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode(),
        token_id=row["token_id"],
        token=row["token"],
        environment=row["environment"],
        token_status=row["token_status"],
        claimed_at=row["claimed_at"],
    )
