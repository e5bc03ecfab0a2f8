"""Per-user serialisation: quotas, in-flight limits and balances are checked and changed
by one transaction at a time per user.

One user's burst must never hold the pool every user shares. So a user's requests queue
in the process first, without a connection (at most one of them holds a connection and
the user's advisory lock at a time), and every wait is bounded: the queue by
QUEUE_WAIT_SECONDS and MAX_QUEUED_PER_USER, the advisory lock (held by another process)
by PostgreSQL's lock_timeout. Past a bound the answer is USER_BUSY, to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.errors import UserBusy
from services.kit.db_errors import failure_kind

LOCK_USER = text("SELECT pg_advisory_xact_lock(hashtextextended('creation.user:' || :user_id, 0))")

# A user's transactions take milliseconds: a queue this long or this slow means the user's
# lock is stuck elsewhere, and waiting longer only ties up the caller.
QUEUE_WAIT_SECONDS = 5.0
MAX_QUEUED_PER_USER = 64


@dataclass
class _Queue:
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    members: int = 0  # the request holding the turn and those waiting for it


# Each user's queue in this process (one event loop), while it has members.
_queues: dict[str, _Queue] = {}


async def lock_user(connection: AsyncConnection, user_id: str) -> None:
    """A transaction-scoped advisory lock on the user, released at commit or rollback;
    UserBusy when the wait outlasts the lock timeout."""
    try:
        await connection.execute(LOCK_USER, {"user_id": user_id})
    except DBAPIError as error:
        # The statement's one lock wait is the user's: past lock_timeout, the user is busy.
        if failure_kind(error) == "lock_timeout":
            raise UserBusy() from None
        raise


@asynccontextmanager
async def user_turn(user_id: str) -> AsyncIterator[None]:
    """The user's turn in this process: one request of a user at a time holds a
    connection and the user's lock; the others wait here, bounded, without one."""
    queue = _queues.get(user_id)
    if queue is None:
        queue = _queues[user_id] = _Queue()
    if queue.members >= MAX_QUEUED_PER_USER:
        raise UserBusy()
    alone = queue.members == 0
    queue.members += 1
    try:
        if alone:
            # Nobody holds or waits for the turn: it is taken at once (and without the
            # task wait_for would start for it, on every submit).
            await queue.turn.acquire()
        else:
            try:
                await asyncio.wait_for(queue.turn.acquire(), QUEUE_WAIT_SECONDS)
            except TimeoutError:
                raise UserBusy() from None
        try:
            yield
        finally:
            queue.turn.release()
    finally:
        queue.members -= 1
        if queue.members == 0:
            del _queues[user_id]


@asynccontextmanager
async def user_transaction(engine: AsyncEngine, user_id: str) -> AsyncIterator[AsyncConnection]:
    """A transaction that holds the user's lock, entered in the user's turn."""
    async with user_turn(user_id), engine.begin() as connection:
        await lock_user(connection, user_id)
        yield connection
