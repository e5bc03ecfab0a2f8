"""Operators' read of the pushes that did not reach a device (NotifyAdminService's
ListFailedPushes): notify.pushes with their token's owner, environment and last
characters, newest first."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from services.kit.db import fetch
from services.notify.domain import FailedPush, FailedPushCursor
from services.notify.store.boundary import database
from services.notify.tables import failed_push, push_attempts, push_tokens, pushes

# How many characters of a token an operator sees: enough to tell tokens apart.
TOKEN_SUFFIX = 6


class FailedPushReads:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @database
    async def page(
        self,
        since: datetime | None,
        until: datetime | None,
        limit: int,
        after: FailedPushCursor | None,
    ) -> tuple[list[FailedPush], FailedPushCursor | None]:
        """Newest first, ``limit`` at most, after ``after``. Rides ix_pushes_failed (its
        predicate written literally, so that every plan can use it); each row's last
        exchange through ix_push_attempts_push_id."""
        p, t = pushes, push_tokens
        last_attempt = (
            select(func.max(push_attempts.c.at))
            .where(push_attempts.c.push_id == p.c.push_id)
            .scalar_subquery()
        )
        query = (
            select(
                p.c.push_id,
                p.c.kind,
                p.c.status,
                p.c.job_id,
                p.c.version,
                p.c.attempts,
                p.c.last_http_status,
                p.c.last_reason,
                p.c.apns_id,
                p.c.created_at,
                t.c.user_id,
                t.c.environment,
                func.right(t.c.token, TOKEN_SUFFIX).label("token_suffix"),
                last_attempt.label("last_attempt_at"),
            )
            .join(t, t.c.token_id == p.c.token_id)
            .where(text(f"({failed_push('pushes')})"))
        )
        if since is not None:
            query = query.where(p.c.created_at >= since)
        if until is not None:
            query = query.where(p.c.created_at < until)
        if after is not None:
            query = query.where(
                tuple_(p.c.created_at, p.c.push_id) < tuple_(after.created_at, after.push_id)
            )
        query = query.order_by(p.c.created_at.desc(), p.c.push_id.desc()).limit(limit + 1)
        rows = await fetch(self._engine, query)
        found = [_failed(row._mapping) for row in rows[:limit]]
        if len(rows) <= limit or not found:
            return found, None
        return found, FailedPushCursor(found[-1].created_at, found[-1].push_id)


def _failed(row: Any) -> FailedPush:
    return FailedPush(
        push_id=row["push_id"],
        kind=row["kind"],
        status=row["status"],
        job_id=str(row["job_id"]),
        version=row["version"],
        user_id=row["user_id"],
        token_suffix=row["token_suffix"],
        environment=row["environment"],
        attempts=row["attempts"],
        http_status=row["last_http_status"],
        reason=row["last_reason"],
        apns_id=row["apns_id"],
        created_at=row["created_at"],
        last_attempt_at=row["last_attempt_at"],
    )
