"""SQL of the remote worker protocol: claims by pool and idempotency key (the token kept
as a hash), the lease a claim token holds, and the keyed calls' answers. The job changes
themselves are the in-process engine's fenced statements (``fenced``), run here inside
the transaction that records the call, so a call and its answer commit together and the
in-process and remote workers share one lease model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Job
from services.creation.store import leases
from services.creation.store.fenced import (
    CLAIM_SQL,
    PROVIDER_REQUEST_UNIQUE,
    FencedItem,
    FencedWrite,
)
from services.creation.store.rows import job_from_row
from services.kit.db import driver_connection
from services.kit.db_errors import unique_violation

# A new claim; a replay (same pool and key) inserts nothing. A token used before by
# another claim violates uq_remote_claims_token_hash.
_INSERT_CLAIM = """
INSERT INTO creation.remote_claims
  (pool, request_id, request_hash, token_hash, worker_id, lease_seconds, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (pool, request_id) DO NOTHING
RETURNING true
"""
_CLAIMED = """
UPDATE creation.remote_claims SET job_id = $3::uuid, lease_generation = $4
WHERE pool = $1 AND request_id = $2
"""
# Rides pk_remote_claims.
_FIND_CLAIM = """
SELECT request_hash, job_id::text AS job_id, lease_generation, worker_id
FROM creation.remote_claims WHERE pool = $1 AND request_id = $2
"""
_JOB = "SELECT * FROM creation.jobs WHERE job_id = $1::uuid"
# The lease a claim token names, with its job as it is now (rides
# uq_remote_claims_token_hash, then pk_jobs).
_LEASE = """
SELECT c.pool, c.worker_id, c.lease_generation, c.lease_seconds, j.*
FROM creation.remote_claims AS c
JOIN creation.jobs AS j ON j.job_id = c.job_id
WHERE c.token_hash = $1 AND c.job_id = $2::uuid
"""
_FIND_CALL = """
SELECT method, request_hash, response FROM creation.remote_calls
WHERE pool = $1 AND request_id = $2
"""
_INSERT_CALL = """
INSERT INTO creation.remote_calls
  (pool, request_id, method, request_hash, job_id, response, created_at)
VALUES ($1, $2, $3, $4, $5::uuid, $6, $7)
"""


class TokenReused(Exception):
    """A new claim sent a claim token that an earlier claim used."""


class CallKeyTaken(Exception):
    """Another call under the same pool and key recorded its answer at the same moment:
    the key is that call's now."""


class ProviderRequestTaken(Exception):
    """Another job holds the provider request id this write records."""


# The unique constraints a keyed call's transaction can break, and what each means.
_CALL_UNIQUE: dict[str, type[Exception]] = {
    "pk_remote_calls": CallKeyTaken,
    PROVIDER_REQUEST_UNIQUE: ProviderRequestTaken,
}


@dataclass(frozen=True)
class ClaimRecord:
    request_hash: str
    job_id: str | None
    lease_generation: int | None
    worker_id: str


@dataclass(frozen=True)
class NewClaim:
    """What a claim that was not a replay took (None: nothing was due)."""

    job: Job | None


@dataclass(frozen=True)
class Replay:
    """An earlier claim with the same key, and its job as it is now."""

    record: ClaimRecord
    job: Job | None


@dataclass(frozen=True)
class ClaimRequest:
    pool: str
    request_id: str
    request_hash: str
    token_hash: str
    worker_id: str
    owner: str  # the lease owner written on the job: pool/worker
    lease: timedelta  # granted: the worker's ask within the server's bounds


async def claim(engine: AsyncEngine, request: ClaimRequest, now: datetime) -> NewClaim | Replay:
    """Claims one due job for ``request`` (the in-process claim statement, limit 1), or
    answers the earlier claim with the same pool and key; one transaction either way."""
    async with driver_connection(engine) as connection, connection.transaction():
        try:
            inserted = await connection.fetchval(
                _INSERT_CLAIM,
                request.pool,
                request.request_id,
                request.request_hash,
                request.token_hash,
                request.worker_id,
                request.lease.total_seconds(),
                now,
            )
        except Exception as error:
            if unique_violation(error) != "uq_remote_claims_token_hash":
                raise
            raise TokenReused() from None
        if not inserted:
            row = await connection.fetchrow(_FIND_CLAIM, request.pool, request.request_id)
            record = ClaimRecord(
                row["request_hash"], row["job_id"], row["lease_generation"], row["worker_id"]
            )
            job_row = await connection.fetchrow(_JOB, record.job_id) if record.job_id else None
            return Replay(record, job_from_row(job_row) if job_row else None)
        rows = await connection.fetch(CLAIM_SQL, now, request.owner, 1, now + request.lease)
        if not rows:
            return NewClaim(None)
        job = job_from_row(rows[0])
        await connection.execute(
            _CLAIMED, request.pool, request.request_id, job.job_id, job.lease_epoch
        )
        return NewClaim(job)


@dataclass(frozen=True)
class HeldLease:
    """A claim token's lease and its job as it is now."""

    pool: str
    worker_id: str
    lease_generation: int
    lease: timedelta
    job: Job


def _held(row: Any) -> HeldLease | None:
    if row is None:
        return None
    return HeldLease(
        row["pool"],
        row["worker_id"],
        row["lease_generation"],
        timedelta(seconds=row["lease_seconds"]),
        job_from_row(row),
    )


async def read_lease(engine: AsyncEngine, token_hash: str, job_id: str) -> HeldLease | None:
    async with driver_connection(engine) as connection:
        return _held(await connection.fetchrow(_LEASE, token_hash, job_id))


@dataclass(frozen=True)
class StoredCall:
    method: str
    request_hash: str
    response: bytes


async def find_call(engine: AsyncEngine, pool: str, request_id: str) -> StoredCall | None:
    async with driver_connection(engine) as connection:
        row = await connection.fetchrow(_FIND_CALL, pool, request_id)
    return StoredCall(row["method"], row["request_hash"], bytes(row["response"])) if row else None


class CallTransaction:
    """One keyed call's transaction: the lease locked, the fenced write, the answer. The
    job's writes are the in-process worker's (``leases``), run on ``connection``."""

    def __init__(self, connection: Any, now: datetime) -> None:
        self._connection = connection
        self.now = now

    @property
    def connection(self) -> Any:
        """The asyncpg connection, in this call's transaction."""
        return self._connection

    async def lock_lease(self, token_hash: str, job_id: str) -> HeldLease | None:
        return _held(
            await self._connection.fetchrow(_LEASE + " FOR UPDATE OF j", token_hash, job_id)
        )

    async def find_call(self, pool: str, request_id: str) -> StoredCall | None:
        row = await self._connection.fetchrow(_FIND_CALL, pool, request_id)
        return (
            StoredCall(row["method"], row["request_hash"], bytes(row["response"])) if row else None
        )

    async def fenced(
        self, write: FencedWrite, job_id: str, lease_epoch: int, value: str | None = None
    ) -> Job | None:
        item = FencedItem(job_id, lease_epoch, value)
        return (await leases.apply_on(self._connection, write, [item], self.now)).get(job_id)

    async def record(
        self,
        pool: str,
        request_id: str,
        method: str,
        request_hash: str,
        job_id: str,
        response: bytes,
    ) -> None:
        await self._connection.execute(
            _INSERT_CALL, pool, request_id, method, request_hash, job_id, response, self.now
        )


@asynccontextmanager
async def call_transaction(engine: AsyncEngine, now: datetime) -> AsyncIterator[CallTransaction]:
    """A keyed call's transaction; a unique constraint it breaks is the call's domain
    error (CallKeyTaken, ProviderRequestTaken), any other a bug."""
    try:
        async with driver_connection(engine) as connection, connection.transaction():
            yield CallTransaction(connection, now)
    except Exception as error:
        taken = _CALL_UNIQUE.get(unique_violation(error) or "")
        if taken is None:
            raise
        raise taken() from None


# Pruning (with the outbox's, in the relay's housekeeping): claims older than the
# retention whose lease is over (no running job holds their generation), and calls older
# than it whose job no longer runs, so a live lease never loses its claim or its answers.
# Oldest first on their created_at indexes; rows another replica holds are skipped.


def _prune_statement(table: str, held_by: str) -> TextClause:
    """Rows of ``table`` older than :before whose job is not running (``held_by``:
    under the row's own lease), at most :limit, oldest first."""
    return text(
        f"""
        DELETE FROM creation.{table} WHERE (pool, request_id) IN (
            SELECT r.pool, r.request_id FROM creation.{table} AS r
            WHERE r.created_at < :before
              AND NOT EXISTS (
                SELECT 1 FROM creation.jobs AS j
                WHERE j.job_id = r.job_id AND j.status = 'running'{held_by}
              )
            ORDER BY r.created_at
            LIMIT :limit
            FOR UPDATE OF r SKIP LOCKED
        )
        """  # noqa: S608 (the table and condition are this module's constants)
    )


_PRUNE_CLAIMS = _prune_statement("remote_claims", " AND j.lease_epoch = r.lease_generation")
_PRUNE_CALLS = _prune_statement("remote_calls", "")


async def prune_claims(engine: AsyncEngine, before: datetime, limit: int) -> int:
    """Deletes up to ``limit`` ended claims made before ``before``; how many."""
    return await _prune(engine, _PRUNE_CLAIMS, before, limit)


async def prune_calls(engine: AsyncEngine, before: datetime, limit: int) -> int:
    """Deletes up to ``limit`` answers recorded before ``before`` of jobs no longer
    running; how many."""
    return await _prune(engine, _PRUNE_CALLS, before, limit)


async def _prune(engine: AsyncEngine, statement: TextClause, before: datetime, limit: int) -> int:
    async with engine.begin() as connection:
        result = await connection.execute(statement, {"before": before, "limit": limit})
    return int(result.rowcount)
