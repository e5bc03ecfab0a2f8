"""Per-user serialisation: quotas, in-flight limits and balances are checked and changed
by one transaction at a time per user."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

LOCK_USER = text("SELECT pg_advisory_xact_lock(hashtextextended('creation.user:' || :user_id, 0))")


async def lock_user(connection: AsyncConnection, user_id: str) -> None:
    """A transaction-scoped advisory lock on the user, released at commit or rollback."""
    await connection.execute(LOCK_USER, {"user_id": user_id})
