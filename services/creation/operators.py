"""What operators do (AdminService): the needs-attention queue, decisions on it, a job's
audit trail, and point grants. Each decision and grant is logged with its ids."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Event, Job
from services.creation.store import admin as admin_store
from services.creation.store import ledger
from services.creation.store.admin import AttentionCursor, Decision, EventCursor
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger

log = get_logger(__name__)

# Operator grants live in their own key space, apart from the welcome grant's.
OPERATOR_GRANT_PREFIX = "operator:"


class Operators:
    def __init__(
        self, engine: AsyncEngine, welcome_points: int, clock: Clock = system_clock
    ) -> None:
        self._engine = engine
        self._welcome_points = welcome_points
        self._clock = clock

    async def attention(
        self, limit: int, after: AttentionCursor | None
    ) -> tuple[list[Job], AttentionCursor | None]:
        return await admin_store.list_attention(self._engine, limit, after)

    async def resolve(self, job_id: str, decision: Decision, operator: str, reason: str) -> Job:
        job = await admin_store.resolve(
            self._engine, job_id, decision, operator, reason, self._clock()
        )
        log.info(
            "job_resolved",
            job_id=job_id,
            decision=decision.value,
            operator=operator,
            status=job.status.value,
            version=job.version,
        )
        return job

    async def events(
        self, job_id: str, limit: int, after: EventCursor | None
    ) -> tuple[list[Event], EventCursor | None]:
        return await admin_store.list_events(self._engine, job_id, limit, after)

    async def grant(
        self, user_id: str, amount: int, request_id: str, reason: str, granted_by: str = ""
    ) -> int:
        """The user's available points after the grant; the same request_id with the same
        grant again grants nothing more, with another grant is IdempotencyKeyReused."""
        granted = await ledger.grant_points(
            self._engine,
            user_id,
            amount,
            OPERATOR_GRANT_PREFIX + request_id,
            reason,
            self._welcome_points,
            self._clock(),
            granted_by=granted_by,
        )
        log.info(
            "points_granted" if granted.new else "points_grant_replayed",
            user_id=user_id,
            amount=amount,
            request_id=request_id,
            available_points=granted.balance.available,
            # The calling identity; "" for the shared service credential.
            granted_by=granted_by,
        )
        return granted.balance.available
