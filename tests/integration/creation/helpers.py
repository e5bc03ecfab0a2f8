"""Shared helpers for creation's integration tests: requests, counts, its own database,
and the service itself on real listeners."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.app import build
from services.creation.providers.base import Provider
from services.creation.settings import CreationSettings
from services.creation.store.jobs import SubmitLimits
from services.creation.store.webhooks import new_secret
from services.creation.submission import SubmitCommand, validate
from services.creation.tables import (
    WEBHOOK_EVENT_TYPES,
    job_events,
    outbox,
    points_ledger,
    webhook_endpoints,
)
from services.dev.processes import free_port
from services.kit.auth import issue_token
from services.kit.clock import SettableClock
from services.kit.server import RunningService
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN, ListenSettings
from tests.support.rpc import bearer

LIMITS = SubmitLimits(daily_quota=50, in_flight_limit=50, max_attempts=3, welcome_points=100)
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


def command(key: str | None = None, **overrides: Any) -> SubmitCommand:
    fields: dict[str, Any] = {
        "idempotency_key": key,
        "model_id": "stub-fast",
        "style_id": "watercolor",
        "input_asset_id": str(uuid.uuid4()),
        "prompt": "a cat in a hat",
        "negative_prompt": "",
        "width": 512,
        "height": 512,
        "parameters": dict(seed=7),
    }
    fields.update(overrides)
    built, problems = validate(**fields)
    assert built is not None, problems
    return built


async def count(engine: AsyncEngine, table: Any, **where: Any) -> int:
    query = select(func.count()).select_from(table)
    for name, value in where.items():
        query = query.where(table.c[name] == value)
    async with engine.connect() as connection:
        return int((await connection.execute(query)).scalar_one())


async def side_rows(engine: AsyncEngine, job_id: str) -> dict[str, Any]:
    async with engine.connect() as connection:
        events = (
            await connection.execute(
                select(job_events.c.version, job_events.c.from_status, job_events.c.to_status)
                .where(job_events.c.job_id == job_id)
                .order_by(job_events.c.version)
            )
        ).all()
        versions = (
            (
                await connection.execute(
                    select(outbox.c.version)
                    .where(outbox.c.job_id == job_id)
                    .order_by(outbox.c.version)
                )
            )
            .scalars()
            .all()
        )
        ledger = (
            await connection.execute(
                select(points_ledger.c.kind, points_ledger.c.amount)
                .where(points_ledger.c.job_id == job_id)
                .order_by(points_ledger.c.entry_id)
            )
        ).all()
    return {
        "events": [tuple(e) for e in events],
        "outbox_versions": list(versions),
        "ledger": [tuple(entry) for entry in ledger],
    }


@dataclass
class CreationHarness:
    """creation running in this process on real listeners over its own database."""

    running: RunningService
    clock: SettableClock

    def public_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.running.public_port}")

    def internal_channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.running.internal_port}")


@asynccontextmanager
async def running_creation(
    database_url: str,
    media_address: str | None = None,
    *,
    role: str = "all",
    providers: Mapping[str, Provider] | None = None,
    **extra: str,
) -> AsyncIterator[CreationHarness]:
    """The creation service as `atelier serve creation` builds it; media is wherever
    ``media_address`` says (by default a port where nothing listens, as for notify).
    ``providers`` are the adapters AdminService looks requests up with (and, in roles
    worker and all, the engine's)."""
    settings = CreationSettings.from_env(
        {
            "ATELIER_DATABASE_URL": database_url,
            "ATELIER_DRAIN_GRACE": "0",
            "ATELIER_MEDIA_INTERNAL_ADDRESS": media_address or f"127.0.0.1:{free_port()}",
            # The relay runs in every role: aimed where nothing listens, never at a default
            # port some other stack may hold.
            "ATELIER_NOTIFY_INTERNAL_ADDRESS": f"127.0.0.1:{free_port()}",
            **{f"ATELIER_{name}": value for name, value in extra.items()},
        }
    )
    clock = SettableClock(T0)
    app = build(settings, role, clock=clock, providers=providers)
    running = RunningService(app, settings.common, ListenSettings(0, 0, 0))
    await running.start()
    try:
        yield CreationHarness(running, clock)
    finally:
        await running.stop()


def user_token(user_id: str, ttl_seconds: int = 600) -> tuple[tuple[str, str], ...]:
    return bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, ttl_seconds))


SERVICE = bearer(DEV_SERVICE_TOKEN)


# A test's instrument, never installed by a migration: each outbox row written meanwhile
# keeps its job's message as of the row's version (the job change triggers insert the
# row after the change's statement, so the job's row read then is that version's).
_KEEP_PAYLOADS = (
    """
    CREATE FUNCTION creation.test_keep_payload() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.payload := (SELECT creation.job_message(j) FROM creation.jobs AS j
                      WHERE j.job_id = NEW.job_id);
      RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER test_keep_payload BEFORE INSERT ON creation.outbox
    FOR EACH ROW EXECUTE FUNCTION creation.test_keep_payload()
    """,
)


@asynccontextmanager
async def payloads_kept(engine: AsyncEngine) -> AsyncIterator[None]:
    """While inside, each new outbox row keeps its job's message as of its version in its
    payload, what creation.job_message builds for the relay or the webhook fan-out from
    the job's row at that version (the job change triggers build none: a row records only
    what changed, sql/job_changes.sql)."""
    async with engine.begin() as connection:
        for statement in _KEEP_PAYLOADS:
            await connection.execute(text(statement))
    try:
        yield
    finally:
        async with engine.begin() as connection:
            await connection.execute(text("DROP TRIGGER test_keep_payload ON creation.outbox"))
            await connection.execute(text("DROP FUNCTION creation.test_keep_payload()"))


@asynccontextmanager
async def endpoint_enabled(engine: AsyncEngine) -> AsyncIterator[None]:
    """While inside, an endpoint that wants every event is enabled (never called: no
    deliverer runs), so the job triggers mark each new version's outbox row for the
    webhooks."""
    endpoint_id = str(uuid.uuid4())
    async with engine.begin() as connection:
        await connection.execute(
            insert(webhook_endpoints).values(
                endpoint_id=endpoint_id,
                url="https://hooks.invalid/every-version",
                event_types=list(WEBHOOK_EVENT_TYPES),
                secret=new_secret(),
                created_by="op-test",
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as connection:
            await connection.execute(
                delete(webhook_endpoints).where(webhook_endpoints.c.endpoint_id == endpoint_id)
            )
