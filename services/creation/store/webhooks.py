"""Webhook endpoints, signing keys and the delivery log as operators manage them
(AdminService), and the per-job endpoint a trusted caller's submit makes. The deliverer's
own statements live with it (services/creation/webhooks/)."""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, insert, literal, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.errors import WebhookDeliveryNotFound, WebhookEndpointNotFound
from services.creation.tables import (
    WEBHOOK_TEST_EVENT,
    webhook_deliveries,
    webhook_endpoints,
    webhook_signing_keys,
)
from services.kit.db import fetch, reading

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A signing secret as Standard Webhooks spells one: 'whsec_' + base64 of 32 random
    bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True)
class Endpoint:
    """An endpoint as operators see it: everything but its secrets."""

    endpoint_id: str
    url: str
    description: str
    event_types: tuple[str, ...]
    user_ids: tuple[str, ...]
    model_ids: tuple[str, ...]
    job_id: str | None
    signing_owner: str | None
    enabled: bool
    disabled_reason: str
    failing_since: datetime | None
    max_in_flight: int
    created_by: str
    created_at: datetime
    updated_at: datetime
    previous_secret_expires_at: datetime | None


@dataclass(frozen=True)
class EndpointFields:
    """What an operator sets on an endpoint."""

    url: str
    description: str
    event_types: tuple[str, ...]
    user_ids: tuple[str, ...]
    model_ids: tuple[str, ...]
    max_in_flight: int


@dataclass(frozen=True)
class Delivery:
    delivery_id: int
    message_id: str
    endpoint_id: str
    job_id: str | None
    job_version: int
    event_type: str
    state: str
    attempts: int
    last_status_code: int | None
    last_error: str
    last_response_excerpt: str
    next_attempt_at: datetime
    last_attempt_at: datetime | None
    completed_at: datetime | None
    occurred_at: datetime
    created_at: datetime


@dataclass(frozen=True)
class EndpointCursor:
    """Where a page of endpoints ends: the last one's (created_at, endpoint_id)."""

    created_at: datetime
    endpoint_id: str


@dataclass(frozen=True)
class DeliveryCursor:
    """Where a page of deliveries ends (newest first): the last one's id."""

    delivery_id: int


@dataclass(frozen=True)
class Rotated:
    secret: str
    previous_expires_at: datetime | None


# Every column but the secrets: what a read answers, so a secret never leaves a statement
# that did not ask for it.
_SHOWN = [c for c in webhook_endpoints.c if c.name not in ("secret", "previous_secret")]


def _endpoint(row: RowMapping) -> Endpoint:
    return Endpoint(
        endpoint_id=str(row["endpoint_id"]),
        url=row["url"],
        description=row["description"],
        event_types=tuple(row["event_types"]),
        user_ids=tuple(row["user_ids"]),
        model_ids=tuple(row["model_ids"]),
        job_id=str(row["job_id"]) if row["job_id"] else None,
        signing_owner=row["signing_owner"],
        enabled=row["enabled"],
        disabled_reason=row["disabled_reason"],
        failing_since=row["failing_since"],
        max_in_flight=row["max_in_flight"],
        created_by=row["created_by"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        previous_secret_expires_at=row["previous_secret_expires_at"],
    )


def _delivery(row: RowMapping) -> Delivery:
    return Delivery(
        delivery_id=row["delivery_id"],
        message_id=row["message_id"],
        endpoint_id=str(row["endpoint_id"]),
        job_id=str(row["job_id"]) if row["job_id"] else None,
        job_version=row["job_version"],
        event_type=row["event_type"],
        state=row["state"],
        attempts=row["attempts"],
        last_status_code=row["last_status_code"],
        last_error=row["last_error"],
        last_response_excerpt=row["last_response_excerpt"],
        next_attempt_at=row["next_attempt_at"],
        last_attempt_at=row["last_attempt_at"],
        completed_at=row["completed_at"],
        occurred_at=row["occurred_at"],
        created_at=row["created_at"],
    )


_DELIVERY_SHOWN = [c for c in webhook_deliveries.c if c.name not in ("payload", "claimed_until")]


async def create_endpoint(
    engine: AsyncEngine, fields: EndpointFields, created_by: str, now: datetime
) -> tuple[Endpoint, str]:
    """A registered endpoint, enabled, with a new secret (answered this once)."""
    secret = new_secret()
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                insert(webhook_endpoints)
                .values(
                    endpoint_id=str(uuid.uuid4()),
                    url=fields.url,
                    description=fields.description,
                    event_types=list(fields.event_types),
                    user_ids=list(fields.user_ids),
                    model_ids=list(fields.model_ids),
                    max_in_flight=fields.max_in_flight,
                    secret=secret,
                    created_by=created_by,
                    created_at=now,
                    updated_at=now,
                )
                .returning(*_SHOWN)
            )
        ).one()
    return _endpoint(row._mapping), secret


async def get_endpoint(engine: AsyncEngine, endpoint_id: str) -> Endpoint:
    """By primary key."""
    rows = await fetch(
        engine, select(*_SHOWN).where(webhook_endpoints.c.endpoint_id == endpoint_id)
    )
    if not rows:
        raise WebhookEndpointNotFound()
    return _endpoint(rows[0]._mapping)


async def list_endpoints(
    engine: AsyncEngine, job_id: str | None, limit: int, after: EndpointCursor | None
) -> tuple[list[Endpoint], EndpointCursor | None]:
    """Oldest first: the registered endpoints (job_id NULL) or one job's, both through
    ix_webhook_endpoints_job_id; a few rows, sorted."""
    query = select(*_SHOWN).where(
        webhook_endpoints.c.job_id.is_(None)
        if job_id is None
        else webhook_endpoints.c.job_id == job_id
    )
    if after is not None:
        query = query.where(
            or_(
                webhook_endpoints.c.created_at > after.created_at,
                and_(
                    webhook_endpoints.c.created_at == after.created_at,
                    webhook_endpoints.c.endpoint_id > after.endpoint_id,
                ),
            )
        )
    query = query.order_by(webhook_endpoints.c.created_at, webhook_endpoints.c.endpoint_id)
    rows = await fetch(engine, query.limit(limit + 1))
    found = [_endpoint(r._mapping) for r in rows[:limit]]
    if len(rows) <= limit or not found:
        return found, None
    return found, EndpointCursor(found[-1].created_at, found[-1].endpoint_id)


async def update_endpoint(
    engine: AsyncEngine, endpoint_id: str, changes: Mapping[str, Any], now: datetime
) -> Endpoint:
    """Sets ``changes`` (columns of webhook_endpoints; ``enabled`` also sets why: false →
    'operator', true → '' and no failing run)."""
    values = dict(changes)
    if "enabled" in values:
        enabled = bool(values["enabled"])
        values["disabled_reason"] = "" if enabled else "operator"
        if enabled:
            values["failing_since"] = None
    for name in ("event_types", "user_ids", "model_ids"):
        if name in values:
            values[name] = list(values[name])
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                update(webhook_endpoints)
                .where(webhook_endpoints.c.endpoint_id == endpoint_id)
                .values(**values, updated_at=now)
                .returning(*_SHOWN)
            )
        ).first()
    if row is None:
        raise WebhookEndpointNotFound()
    return _endpoint(row._mapping)


async def delete_endpoint(engine: AsyncEngine, endpoint_id: str) -> None:
    """A real delete; its deliveries go with it (ON DELETE CASCADE)."""
    async with engine.begin() as connection:
        deleted = (
            await connection.execute(
                delete(webhook_endpoints)
                .where(webhook_endpoints.c.endpoint_id == endpoint_id)
                .returning(webhook_endpoints.c.endpoint_id)
            )
        ).first()
    if deleted is None:
        raise WebhookEndpointNotFound()


def _overlap_until(overlap_seconds: float) -> Any:
    """The end of a rotation's overlap on the database's clock (the deliverer's, which
    compares it with now()); None without one."""
    if overlap_seconds <= 0:
        return None
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, overlap_seconds)


async def rotate_endpoint_secret(
    engine: AsyncEngine, endpoint_id: str, overlap_seconds: float, now: datetime
) -> Rotated | None:
    """A registered endpoint's new secret; the current one becomes the previous (which
    signs until the overlap ends; an older previous is dropped). None: the endpoint is a
    per-job one (signed by its owner's key)."""
    secret = new_secret()
    until = _overlap_until(overlap_seconds)
    e = webhook_endpoints
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                update(e)
                .where(e.c.endpoint_id == endpoint_id, e.c.job_id.is_(None))
                .values(
                    secret=secret,
                    previous_secret=e.c.secret if until is not None else None,
                    previous_secret_expires_at=until,
                    updated_at=now,
                )
                .returning(e.c.previous_secret_expires_at)
            )
        ).first()
        if row is None:
            await _require_endpoint(connection, endpoint_id)
            return None
    return Rotated(secret, row.previous_secret_expires_at)


async def rotate_signing_key(
    engine: AsyncEngine, owner: str, overlap_seconds: float, now: datetime
) -> Rotated:
    """The identity's new per-job signing key (made on the first rotation; the current one
    becomes the previous while the overlap lasts)."""
    secret = new_secret()
    until = _overlap_until(overlap_seconds)
    keys = webhook_signing_keys
    statement = (
        pg_insert(keys)
        .values(owner=owner, secret=secret, created_at=now, updated_at=now)
        .on_conflict_do_update(
            index_elements=[keys.c.owner],
            set_={
                "secret": secret,
                "previous_secret": keys.c.secret if until is not None else None,
                "previous_secret_expires_at": until,
                "updated_at": now,
            },
        )
        .returning(keys.c.previous_secret_expires_at)
    )
    async with engine.begin() as connection:
        row = (await connection.execute(statement)).one()
    return Rotated(secret, row.previous_secret_expires_at)


async def queue_test_event(
    engine: AsyncEngine, endpoint_id: str, payload: dict[str, Any]
) -> Delivery:
    """A webhook.test delivery for the endpoint, due now (its row trigger wakes the
    deliverers at commit)."""
    source = select(
        webhook_endpoints.c.endpoint_id,
        literal(0).label("job_version"),
        literal(WEBHOOK_TEST_EVENT).label("event_type"),
        literal(payload, webhook_deliveries.c.payload.type).label("payload"),
        # The database's clock, as for the deliveries the job triggers write.
        func.now().label("occurred_at"),
        func.now().label("next_attempt_at"),
        func.now().label("created_at"),
    ).where(webhook_endpoints.c.endpoint_id == endpoint_id)
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                insert(webhook_deliveries)
                .from_select(
                    [
                        "endpoint_id",
                        "job_version",
                        "event_type",
                        "payload",
                        "occurred_at",
                        "next_attempt_at",
                        "created_at",
                    ],
                    source,
                )
                .returning(*_DELIVERY_SHOWN)
            )
        ).first()
    if row is None:
        raise WebhookEndpointNotFound()
    return _delivery(row._mapping)


async def list_deliveries(
    engine: AsyncEngine,
    *,
    endpoint_id: str | None,
    job_id: str | None,
    state: str | None,
    limit: int,
    after: DeliveryCursor | None,
) -> tuple[list[Delivery], DeliveryCursor | None]:
    """Newest first: an endpoint's (ix_webhook_deliveries_endpoint_id_delivery_id,
    backwards) or a job's (ix_webhook_deliveries_job_id, sorted). An endpoint that does
    not exist is WebhookEndpointNotFound; a job without deliveries is an empty page."""
    d = webhook_deliveries
    query = select(*_DELIVERY_SHOWN)
    if endpoint_id is not None:
        query = query.where(d.c.endpoint_id == endpoint_id)
    else:
        query = query.where(d.c.job_id == job_id)
    if state is not None:
        query = query.where(d.c.state == state)
    if after is not None:
        query = query.where(d.c.delivery_id < after.delivery_id)
    query = query.order_by(d.c.delivery_id.desc()).limit(limit + 1)
    async with reading(engine) as connection:
        if endpoint_id is not None:
            await _require_endpoint(connection, endpoint_id)
        rows = (await connection.execute(query)).all()
    found = [_delivery(r._mapping) for r in rows[:limit]]
    if len(rows) <= limit or not found:
        return found, None
    return found, DeliveryCursor(found[-1].delivery_id)


async def _require_endpoint(connection: AsyncConnection, endpoint_id: str) -> None:
    found = await connection.execute(
        select(webhook_endpoints.c.endpoint_id).where(
            webhook_endpoints.c.endpoint_id == endpoint_id
        )
    )
    if found.first() is None:
        raise WebhookEndpointNotFound()


def _pending_again() -> dict[str, Any]:
    # Attempts and message_id are kept. A claim is dropped: an attempt still in flight
    # then records nothing (its record is fenced by the claim), and the row is due again
    # at once, so a redelivery asked for is never lost to that attempt's outcome.
    return {
        "state": "pending",
        "completed_at": None,
        # Due at once on the deliverer's clock (the database's).
        "next_attempt_at": func.now(),
        "claimed_until": None,
    }


async def redeliver_one(engine: AsyncEngine, delivery_id: int) -> int:
    """One delivery, whatever its state, pending again and due now (primary key)."""
    async with engine.begin() as connection:
        row = (
            await connection.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.delivery_id == delivery_id)
                .values(**_pending_again())
                .returning(webhook_deliveries.c.delivery_id)
            )
        ).first()
    if row is None:
        raise WebhookDeliveryNotFound()
    return 1


async def redeliver_failed(engine: AsyncEngine, endpoint_id: str, since: datetime) -> int:
    """Every failed delivery of the endpoint made at or after ``since``, pending again
    (the endpoint's deliveries through ix_webhook_deliveries_endpoint_id_delivery_id)."""
    d = webhook_deliveries
    async with engine.begin() as connection:
        await _require_endpoint(connection, endpoint_id)
        result = await connection.execute(
            update(d)
            .where(d.c.endpoint_id == endpoint_id, d.c.state == "failed", d.c.created_at >= since)
            .values(**_pending_again())
            .returning(d.c.delivery_id)
        )
        return len(result.all())


# The per-job endpoint of a trusted caller's submit, written in the submit's transaction
# before the job (so the job's job.queued finds it), only when the caller has a signing
# key; $1 endpoint_id, $2 job_id, $3 url, $4 event_types, $5 owner, $6 now. No row back:
# the owner has no key.
PER_JOB_ENDPOINT = """
INSERT INTO creation.webhook_endpoints (
  endpoint_id, url, event_types, job_id, signing_owner, created_by, created_at, updated_at)
SELECT $1, $3, $4, $2, $5, $5, $6, $6
FROM creation.webhook_signing_keys
WHERE owner = $5
RETURNING endpoint_id
"""
