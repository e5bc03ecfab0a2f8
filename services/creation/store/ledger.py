"""The points ledger: balances, grants and the welcome grant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.store.users import user_transaction
from services.creation.tables import points_ledger

WELCOME_GRANT_KEY = "welcome"


@dataclass(frozen=True)
class Balance:
    available: int
    reserved: int
    entries: int = 0  # ledger rows of the user: none means never seen


def _total(kind: str) -> ColumnElement[Any]:
    return func.coalesce(
        func.sum(case((points_ledger.c.kind == kind, points_ledger.c.amount), else_=0)), 0
    )


# A user's ledger summed by kind (rides ix_points_ledger_user). Built once: statements are
# hot, and building SQLAlchemy expressions costs more than running them.
BALANCE = select(
    _total("grant").label("granted"),
    _total("reserve").label("reserved"),
    _total("capture").label("captured"),
    _total("release").label("released"),
    func.count().label("entries"),
).where(points_ledger.c.user_id == bindparam("user_id"))


async def balance(connection: AsyncConnection, user_id: str) -> Balance:
    """available = grants - reserves + releases; reserved = reserves - captures - releases."""
    row = (await connection.execute(BALANCE, {"user_id": user_id})).one()
    return Balance(
        available=int(row.granted - row.reserved + row.released),
        reserved=int(row.reserved - row.captured - row.released),
        entries=int(row.entries),
    )


async def grant(
    connection: AsyncConnection, user_id: str, amount: int, key: str, reason: str, now: datetime
) -> bool:
    """Adds points once per (user, key); False when that key was already granted."""
    inserted = await connection.execute(
        insert(points_ledger)
        .values(
            user_id=user_id,
            kind="grant",
            amount=amount,
            grant_key=key,
            reason=reason,
            created_at=now,
        )
        .on_conflict_do_nothing(constraint="uq_points_ledger_user_id_grant_key")
        .returning(points_ledger.c.entry_id)
    )
    return inserted.first() is not None


async def balance_after_welcome(
    connection: AsyncConnection, user_id: str, welcome_points: int, now: datetime
) -> Balance:
    """The balance, granting a user seen for the first time their welcome points (once,
    whatever happens later; call it under the user's lock)."""
    found = await balance(connection, user_id)
    if found.entries or welcome_points <= 0:
        return found
    await grant(connection, user_id, welcome_points, WELCOME_GRANT_KEY, "welcome", now)
    return Balance(available=welcome_points, reserved=0, entries=1)


async def grant_points(
    engine: AsyncEngine, user_id: str, amount: int, key: str, reason: str, now: datetime
) -> Balance:
    """An operator's grant, idempotent by ``key``; returns the balance after it."""
    async with user_transaction(engine, user_id) as connection:
        await grant(connection, user_id, amount, key, reason, now)
        return await balance(connection, user_id)


async def read_balance(
    engine: AsyncEngine, user_id: str, welcome_points: int, now: datetime
) -> Balance:
    async with user_transaction(engine, user_id) as connection:
        return await balance_after_welcome(connection, user_id, welcome_points, now)
