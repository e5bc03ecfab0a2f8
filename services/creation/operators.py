"""What operators do (AdminService): the needs-attention queue, decisions on it (adopting
the provider's request among them), a job's inspection and audit trail, and point grants.
Each decision and grant is logged with its ids."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.domain import Actor, Event, Job, Status
from services.creation.errors import JobNotFound
from services.creation.list_filter import JobFilter
from services.creation.provider_requests import ProviderRequests, ProviderView
from services.creation.providers.base import Provider
from services.creation.store import admin as admin_store
from services.creation.store import admin_reads, backlog, ledger, ledger_entries
from services.creation.store import jobs as job_store
from services.creation.store.admin import AttentionCursor, Decision, EventCursor
from services.creation.store.ledger import Balance
from services.creation.store.ledger_entries import EntryCursor, LedgerEntry
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger

log = get_logger(__name__)

# Operator grants live in their own key space, apart from the welcome grant's.
OPERATOR_GRANT_PREFIX = "operator:"
# InspectJob shows at most this many of a job's events (a job has a handful).
INSPECTED_EVENTS = 500


@dataclass(frozen=True)
class Inspection:
    """One job as an operator sees it before deciding."""

    job: Job
    events: list[Event]
    provider: ProviderView


@dataclass(frozen=True)
class QueueOverview:
    """The queue as the console's first screen shows it."""

    queued: int
    queued_due: int
    oldest_queued_age_seconds: float
    needs_attention: int
    running: int
    running_jobs: list[Job]


class Operators:
    def __init__(
        self,
        engine: AsyncEngine,
        welcome_points: int,
        clock: Clock = system_clock,
        providers: Mapping[str, Provider] | None = None,
    ) -> None:
        self._engine = engine
        self._welcome_points = welcome_points
        self._clock = clock
        self._requests = ProviderRequests(providers or {})

    async def overview(self, running_limit: int) -> QueueOverview:
        level = await backlog.read_backlog(self._engine)
        running, leased = await admin_reads.running_jobs(self._engine, running_limit)
        return QueueOverview(
            queued=sum(q.queued for q in level.queue),
            queued_due=sum(q.due for q in level.queue),
            oldest_queued_age_seconds=max((q.oldest_age_seconds for q in level.queue), default=0),
            needs_attention=level.needs_attention,
            running=running,
            running_jobs=leased,
        )

    async def find_job(self, job_id: str) -> list[Job]:
        try:
            return [await admin_store.read_job(self._engine, job_id)]
        except JobNotFound:
            return []

    async def user_jobs(self, user_id: str, limit: int) -> list[Job]:
        found, _ = await job_store.list_for_user(self._engine, user_id, JobFilter(), limit, None)
        return found

    async def user_ledger(
        self, user_id: str, limit: int, after: EntryCursor | None
    ) -> tuple[Balance, list[LedgerEntry], EntryCursor | None]:
        entries, cursor = await ledger_entries.list_for_user(self._engine, user_id, limit, after)
        return await admin_reads.user_balance(self._engine, user_id), entries, cursor

    async def inspect(self, job_id: str) -> Inspection:
        job = await admin_store.read_job(self._engine, job_id)
        events, _ = await admin_store.list_events(self._engine, job_id, INSPECTED_EVENTS, None)
        return Inspection(job, events, await self._requests.view(job))

    async def adopt(self, job_id: str, request_id: str, operator: str, reason: str) -> Job:
        """RESOLUTION_ADOPT: checked with the provider where its adapter can look, then
        written (the store checks the status again under the row lock)."""
        job = await admin_store.read_job(self._engine, job_id)
        if job.status is Status.NEEDS_ATTENTION:
            await self._requests.check_adoptable(job, request_id)
        adopted = await admin_store.adopt(
            self._engine,
            job_id,
            request_id,
            actor=Actor.OPERATOR,
            actor_id=operator,
            reason=f"adopted provider request {request_id}: {reason}",
            now=self._clock(),
        )
        log.info(
            "job_resolved",
            job_id=job_id,
            decision=Decision.ADOPT.value,
            operator=operator,
            provider_request_id=request_id,
            status=adopted.status.value,
            version=adopted.version,
        )
        return adopted

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
