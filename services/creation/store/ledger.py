"""The points ledger: balances, grants and the welcome grant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import quota_day_start
from services.creation.errors import IdempotencyKeyReused
from services.creation.store.users import user_transaction
from services.creation.tables import points_ledger
from services.kit.db import DriverStatement, driver_fetch

# The welcome grant's key. Operators' keys carry a prefix, so none can take this one.
WELCOME_GRANT_KEY = "welcome"


@dataclass(frozen=True)
class Balance:
    available: int
    reserved: int
    welcomed: bool = True  # whether the user has had the welcome grant
    # What the submit's quotas count (see creation.submit_job): jobs made since the start
    # of the UTC day, and jobs queued or running.
    jobs_today: int = 0
    in_flight: int = 0


@dataclass(frozen=True)
class Granted:
    balance: Balance
    new: bool  # False: the same grant was made before with this key


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
    func.count().filter(points_ledger.c.grant_key == WELCOME_GRANT_KEY).label("welcomes"),
).where(points_ledger.c.user_id == bindparam("user_id"))

# A grant made before under a key (rides uq_points_ledger_user_id_grant_key).
GRANT_BY_KEY = select(points_ledger.c.amount, points_ledger.c.reason).where(
    points_ledger.c.user_id == bindparam("user_id"),
    points_ledger.c.grant_key == bindparam("key"),
)


async def balance(connection: AsyncConnection, user_id: str) -> Balance:
    """available = grants - reserves + releases; reserved = reserves - captures - releases."""
    row = (await connection.execute(BALANCE, {"user_id": user_id})).one()
    return Balance(
        available=int(row.granted - row.reserved + row.released),
        reserved=int(row.reserved - row.captured - row.released),
        welcomed=bool(row.welcomes),
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
    """The balance, with the user's welcome points granted if they never had them: once
    per user, whether their first entry is this call's or an operator's grant (the unique
    key makes it once even outside the user's lock)."""
    found = await balance(connection, user_id)
    if found.welcomed or welcome_points <= 0:
        return found
    await grant(connection, user_id, welcome_points, WELCOME_GRANT_KEY, "welcome", now)
    return Balance(
        available=found.available + welcome_points, reserved=found.reserved, welcomed=True
    )


async def grant_points(
    engine: AsyncEngine,
    user_id: str,
    amount: int,
    key: str,
    reason: str,
    welcome_points: int,
    now: datetime,
) -> Granted:
    """An operator's grant, idempotent by ``key``: the same key with the same amount and
    reason grants nothing more; with another, IdempotencyKeyReused."""
    async with user_transaction(engine, user_id) as connection:
        new = await grant(connection, user_id, amount, key, reason, now)
        if not new:
            earlier = (
                await connection.execute(GRANT_BY_KEY, {"user_id": user_id, "key": key})
            ).one()
            if (earlier.amount, earlier.reason) != (amount, reason):
                raise IdempotencyKeyReused()
        found = await balance_after_welcome(connection, user_id, welcome_points, now)
        return Granted(found, new)


# The balance, granting the welcome points first if this user never had them; one
# statement that needs no transaction around it (the unique grant key makes the welcome
# race-free against a concurrent submit's own welcome).
BALANCE_AFTER_WELCOME = DriverStatement.of(
    text(
        """
WITH settings AS (SELECT CAST(:welcome_points AS bigint) AS welcome_points),
welcome AS (
  INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
  SELECT :user_id, 'grant', welcome_points, 'welcome', 'welcome', :now
  FROM settings
  WHERE welcome_points > 0 AND NOT EXISTS (
    SELECT 1 FROM creation.points_ledger WHERE user_id = :user_id AND grant_key = 'welcome')
  ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
  RETURNING amount
)
SELECT
  coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0) AS granted,
  coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0) AS reserved,
  coalesce(sum(amount) FILTER (WHERE kind = 'capture'), 0) AS captured,
  coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0) AS released,
  (SELECT coalesce(sum(amount), 0) FROM welcome) AS welcomed,
  -- The submit's own counts (ix_jobs_user_newest, ix_jobs_user_in_flight).
  (SELECT count(*) FROM creation.jobs
    WHERE user_id = :user_id AND created_at >= :day_start) AS jobs_today,
  (SELECT count(*) FROM creation.jobs
    WHERE user_id = :user_id AND status IN ('queued', 'running')) AS in_flight
FROM creation.points_ledger
WHERE user_id = :user_id
"""
    )
)


async def read_balance(
    engine: AsyncEngine, user_id: str, welcome_points: int, now: datetime
) -> Balance:
    """The user's balance, with their welcome points if they never had them, and what
    the daily quota and in-flight limit count now."""
    # Safe to send twice: the welcome is granted once whatever happens.
    (row,) = await driver_fetch(
        engine,
        BALANCE_AFTER_WELCOME,
        user_id=user_id,
        welcome_points=welcome_points,
        now=now,
        day_start=quota_day_start(now),
    )
    return Balance(
        available=int(row["granted"] - row["reserved"] + row["released"] + row["welcomed"]),
        reserved=int(row["reserved"] - row["captured"] - row["released"]),
        jobs_today=int(row["jobs_today"]),
        in_flight=int(row["in_flight"]),
    )
