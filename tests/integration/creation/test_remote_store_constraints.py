"""The remote workers' store turns the unique constraints their calls can break into its
domain errors, by constraint name (kit.db_errors.unique_violation), on real PostgreSQL:
the service above it never sees a driver error for a taken key or token."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import jobs as store
from services.creation.store import remote
from services.creation.store.remote import CallKeyTaken, ClaimRequest, NewClaim, TokenReused
from tests.integration.creation.helpers import LIMITS, T0, command, new_user


def _claim(request_id: str, token_hash: str) -> ClaimRequest:
    return ClaimRequest(
        pool="gpu",
        request_id=request_id,
        request_hash=f"hash-{request_id}",
        token_hash=token_hash,
        worker_id="w",
        owner="gpu/w",
        lease=timedelta(seconds=60),
    )


async def test_a_call_key_recorded_twice_is_taken(engine: AsyncEngine) -> None:
    """Two calls under one pool and key that both found no answer (each checked before
    the other recorded): the second's insert breaks pk_remote_calls, CallKeyTaken, and its
    transaction leaves nothing behind."""
    job = (await store.submit(engine, new_user(), command(), LIMITS, T0)).job
    async with remote.call_transaction(engine, T0) as tx:
        await tx.record("gpu", "call-1", "StartJob", "h1", job.job_id, b"first")
    with pytest.raises(CallKeyTaken):
        async with remote.call_transaction(engine, T0) as tx:
            await tx.record("gpu", "call-1", "StartJob", "h2", job.job_id, b"second")
    stored = await remote.find_call(engine, "gpu", "call-1")
    assert stored is not None and stored.response == b"first"


async def test_a_claim_token_used_before_is_reused(engine: AsyncEngine) -> None:
    await store.submit(engine, new_user(), command(), LIMITS, T0)
    first = await remote.claim(engine, _claim("claim-1", "t" * 64), T0)
    assert isinstance(first, NewClaim) and first.job is not None
    with pytest.raises(TokenReused):
        await remote.claim(engine, _claim("claim-2", "t" * 64), T0)


async def test_a_constraint_the_store_does_not_expect_stays_a_bug(engine: AsyncEngine) -> None:
    """Only the constraints a keyed call may break mean something; any other unique
    violation rises as the driver raised it (INTERNAL, with its stack in the log)."""
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        async with remote.call_transaction(engine, T0) as tx:
            # A second claim under a key already used (pk_remote_claims), made by hand.
            for n in range(2):
                await tx._connection.execute(
                    "INSERT INTO creation.remote_claims (pool, request_id, request_hash,"
                    " token_hash, worker_id, lease_seconds, created_at)"
                    " VALUES ('gpu', 'by-hand', 'h', $1, 'w', 60, $2)",
                    f"token-{n}",
                    T0,
                )
    assert caught.value.constraint_name == "pk_remote_claims"
