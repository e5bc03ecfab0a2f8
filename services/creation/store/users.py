"""Per-user serialisation: quotas, in-flight limits and balances are checked and changed
by one transaction at a time per user.

A wait for the lock is bounded twice, so one user's burst can never hold the pool that
every user shares: PostgreSQL's lock_timeout ends a wait (USER_BUSY, retry), and within a
process at most MAX_WAITERS_PER_USER requests of one user may wait at once; the next is
refused at once, its connection back in the pool within a round trip.
"""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.creation.errors import UserBusy

LOCK_USER = text("SELECT pg_advisory_xact_lock(hashtextextended('creation.user:' || :user_id, 0))")

# A user's own app rarely has more than a couple of writes in flight; beyond that, a wait
# would only queue behind the same lock.
MAX_WAITERS_PER_USER = 4

# Requests of each user now waiting for the lock in this process (one event loop).
_waiting: dict[str, int] = {}


def _lock_timed_out(error: DBAPIError) -> bool:
    cause = error.orig.__cause__ if error.orig is not None else None
    return isinstance(cause, asyncpg.exceptions.LockNotAvailableError)


async def lock_user(connection: AsyncConnection, user_id: str) -> None:
    """A transaction-scoped advisory lock on the user, released at commit or rollback.
    Raises UserBusy when too many of the user's requests wait already, or the wait
    outlasts the lock timeout."""
    waiting = _waiting.get(user_id, 0)
    if waiting >= MAX_WAITERS_PER_USER:
        raise UserBusy()
    _waiting[user_id] = waiting + 1
    try:
        await connection.execute(LOCK_USER, {"user_id": user_id})
    except DBAPIError as error:
        if _lock_timed_out(error):
            raise UserBusy() from None
        raise
    finally:
        left = _waiting[user_id] - 1
        if left:
            _waiting[user_id] = left
        else:
            del _waiting[user_id]
