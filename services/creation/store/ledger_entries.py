"""A user's ledger entries, newest first, for ListLedgerEntries.

Newest by sequence: entry_id is the order the entries were made in. Their created_at is
the writer's clock (the API's, a worker's), which may disagree between processes and
ties within a statement (a first submit's welcome grant and reserve), so it orders
nothing; entry_id is unique, so the order is total and a page's last entry positions
the next page exactly."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.tables import points_ledger
from services.kit.db import DriverStatement, driver_fetch


@dataclass(frozen=True)
class LedgerEntry:
    entry_id: int
    kind: str  # one of tables.LEDGER_KINDS
    amount: int  # positive; the kind says which way it moved
    job_id: str | None
    grant_key: str | None
    reason: str
    created_at: datetime


@dataclass(frozen=True)
class EntryCursor:
    """Where a page ends: its last entry's entry_id."""

    entry_id: int


_COLUMNS = (
    points_ledger.c.entry_id,
    points_ledger.c.kind,
    points_ledger.c.amount,
    points_ledger.c.job_id,
    points_ledger.c.grant_key,
    points_ledger.c.reason,
    points_ledger.c.created_at,
)
_NEWEST_FIRST = points_ledger.c.entry_id.desc()

# The first page and the pages after a cursor (both ride ix_points_ledger_user_sequence).
FIRST_PAGE = DriverStatement.of(
    select(*_COLUMNS)
    .where(points_ledger.c.user_id == bindparam("user_id"))
    .order_by(_NEWEST_FIRST)
    .limit(bindparam("limit"))
)
NEXT_PAGE = DriverStatement.of(
    select(*_COLUMNS)
    .where(
        points_ledger.c.user_id == bindparam("user_id"),
        points_ledger.c.entry_id < bindparam("entry_id"),
    )
    .order_by(_NEWEST_FIRST)
    .limit(bindparam("limit"))
)


async def list_for_user(
    engine: AsyncEngine, user_id: str, limit: int, after: EntryCursor | None
) -> tuple[list[LedgerEntry], EntryCursor | None]:
    """Up to ``limit`` entries after ``after``, and the cursor of the next page (None on
    the last)."""
    if after is None:
        rows = await driver_fetch(engine, FIRST_PAGE, user_id=user_id, limit=limit + 1)
    else:
        rows = await driver_fetch(
            engine,
            NEXT_PAGE,
            user_id=user_id,
            entry_id=after.entry_id,
            limit=limit + 1,
        )
    found = [
        LedgerEntry(
            entry_id=row["entry_id"],
            kind=row["kind"],
            amount=row["amount"],
            job_id=str(row["job_id"]) if row["job_id"] is not None else None,
            grant_key=row["grant_key"],
            reason=row["reason"],
            created_at=row["created_at"],
        )
        for row in rows[:limit]
    ]
    more = len(rows) > limit
    return found, EntryCursor(found[-1].entry_id) if more else None
