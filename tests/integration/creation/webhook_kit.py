"""What the webhook tests share: endpoints written straight into the table (as
AdminService writes them), jobs made by the submit function, and a running deliverer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.media_client import MediaClient
from services.creation.store import webhook_deliveries
from services.creation.webhooks.deliverer import WebhookDeliverer
from services.creation.webhooks.settings import WebhookSettings
from services.creation.webhooks.signing import new_secret
from services.kit.db import driver_connection
from services.kit.settings import DEV_SERVICE_TOKEN

EVERY_EVENT = [
    "job.queued",
    "job.running",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.needs_attention",
    "job.deleted",
    "job.progress",
]

# Short retries so the tests stay fast (the default schedule spans more than a day).
FAST = WebhookSettings(
    batch=50,
    poll_seconds=0.2,
    timeout_seconds=2.0,
    claim_seconds=30.0,
    retry_schedule=(0.3, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
    jitter=0.2,
    allow_http=True,
    allowed_networks=("127.0.0.1/32",),
)

SUBMIT = """
    SELECT submit_outcome FROM creation.submit_job(
      p_job_id => $2::uuid, p_user_id => $1, p_idempotency_key => NULL,
      p_model_id => 'stub-fast', p_style_id => 'watercolor',
      p_input_asset_id => gen_random_uuid(), p_prompt => 'a fox', p_negative_prompt => '',
      p_width => 512, p_height => 512, p_parameters => '{}', p_max_attempts => 3,
      p_request_hash => repeat('0', 64), p_day_start => now() - interval '1 day',
      p_daily_quota => 100000, p_in_flight_limit => 100000, p_welcome_points => 1000000,
      p_now => now(), p_num_outputs => 1, p_trace_parent => NULL)
"""
START = """
    UPDATE creation.jobs SET status = 'running', version = version + 1, attempt = 1,
        step = 'submitting', lease_owner = 'w1', lease_epoch = 1,
        lease_expires_at = now() + interval '1 minute', started_at = now()
    WHERE job_id = $1::uuid
"""
PROGRESS = """
    UPDATE creation.jobs SET progress = progress + 10, version = version + 1
    WHERE job_id = $1::uuid
"""


async def reset(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM creation.webhook_endpoints"))


async def endpoint(
    engine: AsyncEngine,
    url: str,
    events: list[str] | None = None,
    *,
    secret: str | None = None,
    previous_secret: str | None = None,
    previous_valid_seconds: float = 3600,
    max_in_flight: int = 8,
) -> tuple[str, str]:
    """A registered endpoint (enabled): its id and secret."""
    endpoint_id = str(uuid.uuid4())
    secret = secret or new_secret()
    async with driver_connection(engine) as connection:
        await connection.execute(
            "INSERT INTO creation.webhook_endpoints (endpoint_id, url, event_types, secret,"
            " previous_secret, previous_secret_expires_at, max_in_flight, created_by)"
            " VALUES ($1, $2, $3, $4, $5,"
            " CASE WHEN $5::text IS NULL THEN NULL"
            " ELSE now() + make_interval(secs => $6) END, $7, 'op-test')",
            endpoint_id,
            url,
            events or EVERY_EVENT,
            secret,
            previous_secret,
            previous_valid_seconds,
            max_in_flight,
        )
    return endpoint_id, secret


async def submit(engine: AsyncEngine, count: int = 1, user: str | None = None) -> list[str]:
    """``count`` new queued jobs (one statement each, as SubmitJob's)."""
    user = user or f"user-{uuid.uuid4().hex[:8]}"
    made = []
    async with driver_connection(engine) as connection:
        for _ in range(count):
            job_id = str(uuid.uuid4())
            assert await connection.fetchval(SUBMIT, user, job_id) == "ok"
            made.append(job_id)
    return made


async def change(engine: AsyncEngine, statement: str, job_id: str) -> None:
    async with driver_connection(engine) as connection:
        await connection.execute(statement, job_id)


async def fan_out(engine: AsyncEngine) -> None:
    """What a deliverer's round does first: every marked job change becomes its deliveries
    (for tests that read or write deliveries with no deliverer running)."""
    async with driver_connection(engine) as connection:
        while await webhook_deliveries.fan_out(connection, 500):
            pass


async def rows(engine: AsyncEngine, where: str = "true", *args: Any) -> list[dict[str, Any]]:
    async with driver_connection(engine) as connection:
        found = await connection.fetch(
            "SELECT d.*, d.endpoint_id::text AS endpoint FROM creation.webhook_deliveries AS d"
            f" WHERE {where} ORDER BY d.delivery_id",
            *args,
        )
    return [dict(row) for row in found]


async def endpoint_row(engine: AsyncEngine, endpoint_id: str) -> dict[str, Any]:
    async with driver_connection(engine) as connection:
        row = await connection.fetchrow(
            "SELECT * FROM creation.webhook_endpoints WHERE endpoint_id = $1", endpoint_id
        )
    assert row is not None
    return dict(row)


async def eventually(
    engine: AsyncEngine, where: str, expected: int, within: float, *args: Any
) -> list[dict[str, Any]]:
    """The delivery rows matching ``where`` once there are ``expected`` of them (the
    database is looked at every 50 ms: no event tells a test about a row's update)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        found = await rows(engine, where, *args)
        if len(found) == expected:
            return found
        if loop.time() > until:
            raise AssertionError(f"{len(found)} rows where {where}, not {expected}")
        await asyncio.sleep(0.05)


def no_media() -> MediaClient:
    # Never called: these tests' jobs have no outputs to sign.
    return MediaClient("127.0.0.1:9", DEV_SERVICE_TOKEN)


@asynccontextmanager
async def delivering(
    engine: AsyncEngine, database_url: str, settings: WebhookSettings = FAST, **changes: Any
) -> AsyncIterator[WebhookDeliverer]:
    media = no_media()
    deliverer = WebhookDeliverer(engine, media, replace(settings, **changes), database_url)
    task = asyncio.create_task(deliverer.run())
    try:
        await asyncio.wait_for(deliverer.listener.connected.wait(), 30)
        yield deliverer
    finally:
        await deliverer.stop(asyncio.get_running_loop().time() + 5)
        await asyncio.wait_for(task, 30)
        await media.close()
