"""The points ledger: balances, grants and the welcome grant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import quota_day_start
from services.creation.errors import MAX_POINTS, IdempotencyKeyReused, PointsPastLimit
from services.creation.store.users import user_transaction
from services.creation.tables import ledger_totals, points_ledger
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


# A user's totals row (pk_ledger_totals; a trigger on points_ledger keeps it, migration
# 0013): one row however long the user's history. Built once: statements are hot, and
# building SQLAlchemy expressions costs more than running them.
BALANCE = select(
    ledger_totals.c.granted,
    ledger_totals.c.reserved,
    ledger_totals.c.captured,
    ledger_totals.c.released,
    ledger_totals.c.welcomed,
).where(ledger_totals.c.user_id == bindparam("user_id"))

# A grant made before under a key (rides uq_points_ledger_user_id_grant_key).
GRANT_BY_KEY = select(points_ledger.c.amount, points_ledger.c.reason).where(
    points_ledger.c.user_id == bindparam("user_id"),
    points_ledger.c.grant_key == bindparam("key"),
)


async def balance(connection: AsyncConnection, user_id: str) -> Balance:
    """available = grants - reserves + releases; reserved = reserves - captures - releases."""
    row = (await connection.execute(BALANCE, {"user_id": user_id})).first()
    if row is None:  # no entry yet
        return Balance(available=0, reserved=0, welcomed=False)
    return Balance(
        available=int(row.granted - row.reserved + row.released),
        reserved=int(row.reserved - row.captured - row.released),
        welcomed=bool(row.welcomed),
    )


# An operator's grant and, if the user never had it, their welcome grant, in one statement
# (the grant first, as entries). One statement because the trigger that adds it to the
# user's totals locks their row at its end: a second statement inserting the welcome could
# then wait on GetBalance's uncommitted welcome while that GetBalance waits for the row
# (the deadlock argument is in migration 0013). The welcome's unique key makes it once even
# outside the user's lock; the answer lists the keys inserted.
GRANT_WITH_WELCOME = text(
    """
INSERT INTO creation.points_ledger (
  user_id, kind, amount, grant_key, reason, created_at, granted_by)
SELECT :user_id, 'grant', g.amount, g.grant_key, g.reason, :now, g.granted_by
FROM (VALUES (1, CAST(:amount AS bigint), CAST(:key AS text), CAST(:reason AS text),
              CAST(:granted_by AS text)),
             (2, CAST(:welcome_points AS bigint), 'welcome', 'welcome', NULL))
  AS g(n, amount, grant_key, reason, granted_by)
WHERE g.n = 1 OR (g.amount > 0 AND NOT EXISTS (
  SELECT 1 FROM creation.ledger_totals WHERE user_id = :user_id AND welcomed))
ORDER BY g.n
ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
RETURNING grant_key
"""
)


async def grant_points(
    engine: AsyncEngine,
    user_id: str,
    amount: int,
    key: str,
    reason: str,
    welcome_points: int,
    now: datetime,
    granted_by: str = "",
) -> Granted:
    """An operator's grant, idempotent by ``key``: the same key with the same amount and
    reason grants nothing more; with another, IdempotencyKeyReused. ``granted_by`` (the
    operator identity, "" for the shared service credential) is kept on the entry. The
    user's welcome points come with it if they never had them, whether their first entry
    is this grant or not. A grant that would take the user's points (available plus reserved) past
    MAX_POINTS is PointsPastLimit, and nothing is granted."""
    async with user_transaction(engine, user_id) as connection:
        inserted = await connection.execute(
            GRANT_WITH_WELCOME,
            {
                "user_id": user_id,
                "amount": amount,
                "key": key,
                "reason": reason,
                "welcome_points": welcome_points,
                "now": now,
                "granted_by": granted_by or None,
            },
        )
        new = key in inserted.scalars().all()
        if not new:
            earlier = (
                await connection.execute(GRANT_BY_KEY, {"user_id": user_id, "key": key})
            ).one()
            if (earlier.amount, earlier.reason) != (amount, reason):
                raise IdempotencyKeyReused()
        # A statement of its own: it sees what the trigger added.
        after = await balance(connection, user_id)
        if new and after.available + after.reserved > MAX_POINTS:
            raise PointsPastLimit()  # rolls the grant back
        return Granted(after, new)


# The balance, granting the welcome points first if this user never had them; one
# statement that needs no transaction around it (the unique grant key makes the welcome
# race-free against a concurrent submit's own welcome).
BALANCE_AFTER_WELCOME = DriverStatement.of(
    text(
        """
WITH settings AS (SELECT CAST(:welcome_points AS bigint) AS welcome_points),
totals AS (SELECT * FROM creation.ledger_totals WHERE user_id = :user_id),
welcome AS (
  INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
  SELECT :user_id, 'grant', welcome_points, 'welcome', 'welcome', :now
  FROM settings
  WHERE welcome_points > 0 AND NOT EXISTS (SELECT 1 FROM totals WHERE welcomed)
  ON CONFLICT ON CONSTRAINT uq_points_ledger_user_id_grant_key DO NOTHING
  RETURNING amount
)
-- The totals as the statement began: the welcome it inserts (and what the ledger's
-- trigger adds for it) is not visible here, so ``welcomed`` is its amount, added apart.
SELECT
  coalesce(t.granted, 0) AS granted,
  coalesce(t.reserved, 0) AS reserved,
  coalesce(t.captured, 0) AS captured,
  coalesce(t.released, 0) AS released,
  (SELECT coalesce(sum(amount), 0) FROM welcome) AS welcomed,
  -- The submit's own counts (ix_jobs_user_newest, ix_jobs_user_in_flight): a cancelled
  -- job gives its slot of the day back (sql/submit_job.sql).
  (SELECT count(*) FROM creation.jobs
    WHERE user_id = :user_id AND created_at >= :day_start
      AND status <> 'cancelled') AS jobs_today,
  (SELECT count(*) FROM creation.jobs
    WHERE user_id = :user_id AND status IN ('queued', 'running')) AS in_flight
FROM settings
LEFT JOIN totals AS t ON true
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
