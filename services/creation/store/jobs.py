"""Jobs as users see them: submit, read, list, cancel."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, bindparam, func, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.domain import IN_FLIGHT, Actor, Job, Status
from services.creation.errors import (
    DailyQuotaExceeded,
    IdempotencyKeyReused,
    InFlightLimitReached,
    InsufficientPoints,
    InvalidRequest,
    JobAlreadyFinished,
    JobNotFound,
    Reason,
)
from services.creation.store import ledger
from services.creation.store.changes import Change, record
from services.creation.store.predicates import status_is
from services.creation.store.rows import job_from_row
from services.creation.store.users import lock_user
from services.creation.store.writes import lock_job, write
from services.creation.submission import SubmitCommand
from services.creation.tables import jobs, models, styles


@dataclass(frozen=True)
class SubmitLimits:
    daily_quota: int
    in_flight_limit: int
    max_attempts: int
    welcome_points: int


@dataclass(frozen=True)
class Submitted:
    job: Job
    replayed: bool


def _start_of_day(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# Statements of the submit path, built once (they are hot).

# The job an idempotency key made (rides uq_jobs_user_idempotency_key).
JOB_BY_KEY = select(jobs).where(
    jobs.c.user_id == bindparam("user_id"), jobs.c.idempotency_key == bindparam("key")
)

# The enabled model with the media kind of the enabled style (primary keys).
CATALOG_SNAPSHOT = select(
    models.c.media_kind,
    models.c.price_points,
    models.c.provider_code,
    models.c.provider_model,
    select(styles.c.media_kind)
    .where(styles.c.style_id == bindparam("style_id"), styles.c.enabled)
    .scalar_subquery()
    .label("style_kind"),
).where(models.c.model_id == bindparam("model_id"), models.c.enabled)

# Jobs the user made today (rides ix_jobs_user_newest) and jobs still in flight (rides
# ix_jobs_user_in_flight): two counts in one round trip, each on its own index.
LIMIT_COUNTS = select(
    select(func.count())
    .where(jobs.c.user_id == bindparam("user_id"), jobs.c.created_at >= bindparam("day_start"))
    .scalar_subquery()
    .label("today"),
    select(func.count())
    .where(jobs.c.user_id == bindparam("user_id"), status_is(*IN_FLIGHT))
    .scalar_subquery()
    .label("in_flight"),
)


async def _by_key(connection: AsyncConnection, user_id: str, key: str) -> Job | None:
    row = (await connection.execute(JOB_BY_KEY, {"user_id": user_id, "key": key})).first()
    return job_from_row(row._mapping) if row else None


def _replay(existing: Job, command: SubmitCommand) -> Submitted:
    if existing.request_hash != command.request_hash():
        raise IdempotencyKeyReused()
    return Submitted(existing, replayed=True)


async def find_replay(
    engine: AsyncEngine, user_id: str, command: SubmitCommand
) -> Submitted | None:
    """The job an earlier submit with the same key made, if any (checked again under the
    user's lock by :func:`submit`)."""
    if command.idempotency_key is None:
        return None
    async with engine.connect() as connection:
        existing = await _by_key(connection, user_id, command.idempotency_key)
    return _replay(existing, command) if existing else None


async def _catalog_snapshot(
    connection: AsyncConnection, command: SubmitCommand
) -> dict[str, object]:
    """The model's price and provider, checked against the style, in one round trip."""
    model = (
        await connection.execute(
            CATALOG_SNAPSHOT, {"model_id": command.model_id, "style_id": command.style_id}
        )
    ).first()
    if model is None:
        raise InvalidRequest(Reason.MODEL_NOT_AVAILABLE, "model_id", "is not an available model")
    if model.style_kind is None:
        raise InvalidRequest(Reason.STYLE_NOT_AVAILABLE, "style_id", "is not an available style")
    if model.style_kind != model.media_kind:
        raise InvalidRequest(
            Reason.STYLE_MODEL_MISMATCH, "style_id", f"does not apply to {model.media_kind} models"
        )
    return {
        "price_points": model.price_points,
        "provider_code": model.provider_code,
        "provider_model": model.provider_model,
    }


async def _check_limits(
    connection: AsyncConnection, user_id: str, limits: SubmitLimits, now: datetime
) -> None:
    day_start = _start_of_day(now)
    counts = (
        await connection.execute(LIMIT_COUNTS, {"user_id": user_id, "day_start": day_start})
    ).one()
    if counts.today >= limits.daily_quota:
        reset = day_start + timedelta(days=1)
        raise DailyQuotaExceeded(limits.daily_quota, (reset - now).total_seconds())
    if counts.in_flight >= limits.in_flight_limit:
        raise InFlightLimitReached(limits.in_flight_limit)


async def submit(
    engine: AsyncEngine, user_id: str, command: SubmitCommand, limits: SubmitLimits, now: datetime
) -> Submitted:
    """Creates the job, its submit event, its points reservation and its first outbox row
    in one transaction, serialised per user so limits and idempotency hold under races."""
    async with engine.begin() as connection:
        await lock_user(connection, user_id)
        if command.idempotency_key is not None:
            existing = await _by_key(connection, user_id, command.idempotency_key)
            if existing is not None:
                return _replay(existing, command)
        snapshot = await _catalog_snapshot(connection, command)
        await _check_limits(connection, user_id, limits, now)
        available = (
            await ledger.balance_after_welcome(connection, user_id, limits.welcome_points, now)
        ).available
        price = int(snapshot["price_points"])  # type: ignore[call-overload]
        if available < price:
            raise InsufficientPoints(available, price)
        row = (
            await connection.execute(
                insert(jobs)
                .values(
                    job_id=str(uuid.uuid4()),
                    user_id=user_id,
                    model_id=command.model_id,
                    style_id=command.style_id,
                    input_asset_id=command.input_asset_id,
                    prompt=command.prompt,
                    negative_prompt=command.negative_prompt,
                    width=command.width,
                    height=command.height,
                    parameters=command.parameters,
                    status=Status.QUEUED.value,
                    max_attempts=limits.max_attempts,
                    next_attempt_at=now,
                    idempotency_key=command.idempotency_key,
                    request_hash=command.request_hash(),
                    created_at=now,
                    updated_at=now,
                    **snapshot,
                )
                .returning(jobs)
            )
        ).one()
        job = job_from_row(row._mapping)
        await record(connection, [Change(None, job, Actor.USER, user_id, "submitted")], now)
        return Submitted(job, replayed=False)


async def get(engine: AsyncEngine, user_id: str, job_id: str) -> Job:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                select(jobs).where(jobs.c.job_id == job_id, jobs.c.user_id == user_id)
            )
        ).first()
    if row is None:
        raise JobNotFound()
    return job_from_row(row._mapping)


@dataclass(frozen=True)
class Cursor:
    """Where a page of ListJobs ends: the last job's (created_at, job_id)."""

    created_at: datetime
    job_id: str


async def list_for_user(
    engine: AsyncEngine, user_id: str, status: Status | None, limit: int, after: Cursor | None
) -> tuple[list[Job], Cursor | None]:
    """Newest first, keyset-paginated (rides ix_jobs_user_newest)."""
    query = select(jobs).where(jobs.c.user_id == user_id)
    if status is not None:
        query = query.where(jobs.c.status == status.value)
    if after is not None:
        query = query.where(
            or_(
                jobs.c.created_at < after.created_at,
                and_(jobs.c.created_at == after.created_at, jobs.c.job_id < after.job_id),
            )
        )
    query = query.order_by(jobs.c.created_at.desc(), jobs.c.job_id.desc()).limit(limit + 1)
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    found = [job_from_row(r._mapping) for r in rows[:limit]]
    more = len(rows) > limit
    return found, Cursor(found[-1].created_at, found[-1].job_id) if more and found else None


async def cancel(engine: AsyncEngine, user_id: str, job_id: str, now: datetime) -> Job:
    """QUEUED: cancelled at once, points released. RUNNING or NEEDS_ATTENTION: marked
    cancel_requested (the worker or an operator finishes it). Already cancelled or already
    requested: unchanged. SUCCEEDED or FAILED: JobAlreadyFinished."""
    async with engine.begin() as connection:
        job = await lock_job(connection, jobs.c.job_id == job_id, jobs.c.user_id == user_id)
        if job is None:
            raise JobNotFound()
        if job.status is Status.CANCELLED or job.cancel_requested:
            return job
        if job.status.terminal:
            raise JobAlreadyFinished(job.status.value)
        if job.status is Status.QUEUED:
            values: dict[str, object] = {"status": Status.CANCELLED.value, "completed_at": now}
        else:
            values = {"cancel_requested": True}
        return await write(
            connection, job, values, actor=Actor.USER, actor_id=user_id, reason="cancel", now=now
        )
