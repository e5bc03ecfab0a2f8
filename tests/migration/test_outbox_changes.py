"""Migration 0030: a job change's outbox row records what changed (job, version, event
type) and no copy of the job unless it is marked for the webhooks, whose events are the
job as of their own change; rows written before keep their payloads. Its downgrade gives
every row without a payload its job's message and brings back 0029's triggers."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from services.kit import migrations
from tests.migration.test_job_changes_file import FROZEN, FUNCTION_SOURCE, functions_of
from tests.migration.test_webhook_deliveries import (
    FAN_OUT,
    PROGRESS,
    START,
    deliveries,
    endpoint,
    play,
    submit,
)

ROWS = """
    SELECT version, event_type, webhooks_pending, payload::text
    FROM creation.outbox WHERE job_id = $1::uuid ORDER BY version
"""
NULLABLE = """
    SELECT is_nullable FROM information_schema.columns
    WHERE table_schema = 'creation' AND table_name = 'outbox' AND column_name = 'payload'
"""
MESSAGE = "SELECT creation.job_message(j)::text FROM creation.jobs AS j WHERE job_id = $1::uuid"


async def rows(connection: asyncpg.Connection, job_id: str) -> list[tuple[Any, ...]]:
    return [
        (
            r["version"],
            r["event_type"],
            r["webhooks_pending"],
            r["payload"] and json.loads(r["payload"]),
        )
        for r in await connection.fetch(ROWS, job_id)
    ]


def test_0030_keeps_a_payload_only_on_rows_marked_for_the_webhooks(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database, "0029")

    async def before(connection: asyncpg.Connection) -> None:
        job_id = await submit(connection, "u-0029")
        assert (await rows(connection, job_id))[0][3]["version"] == "1"

    play(scratch_database, before)
    migrations.upgrade("creation", scratch_database, "0030")
    installed = functions_of((FROZEN / "job_changes_0030.sql").read_text())

    async def after(connection: asyncpg.Connection) -> None:
        assert await connection.fetchval(NULLABLE) == "YES"
        for name, source in installed.items():
            assert await connection.fetchval(FUNCTION_SOURCE, name) == source, name
        # Written before: kept as it was.
        old = await connection.fetchval(
            "SELECT job_id::text FROM creation.jobs WHERE user_id = 'u-0029'"
        )
        assert (await rows(connection, old))[0][3]["version"] == "1"
        # No endpoint: each change is a row naming the job's version, with no payload.
        plain = await submit(connection, "u-plain")
        await connection.execute(START, plain)
        await connection.execute(PROGRESS, plain)
        assert await rows(connection, plain) == [
            (1, "job.queued", False, None),
            (2, "job.running", False, None),
            (3, "job.progress", False, None),
        ]
        # An endpoint enabled: each marked row keeps the job as of its version, and the
        # fan-out hands that to the delivery, however the job moved on since.
        await endpoint(connection, ["job.queued", "job.running", "job.progress"])
        hooked = await submit(connection, "u-hooked")
        await connection.execute(START, hooked)
        await connection.execute(PROGRESS, hooked)
        kept = await rows(connection, hooked)
        assert [(v, e, m) for v, e, m, _ in kept] == [
            (1, "job.queued", True),
            (2, "job.running", True),
            (3, "job.progress", True),
        ]
        assert [p["version"] for *_, p in kept] == ["1", "2", "3"]
        assert kept[-1][3] == json.loads(await connection.fetchval(MESSAGE, hooked))
        while (await connection.fetchrow(FAN_OUT, 100))["taken"]:
            pass
        delivered = await deliveries(connection, hooked)
        assert [json.loads(d["payload"]) for d in delivered] == [p for *_, p in kept]

    play(scratch_database, after)


def test_downgrading_0030_gives_each_row_a_payload_and_brings_back_0029s_triggers(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database, "0030")

    async def written(connection: asyncpg.Connection) -> None:
        job_id = await submit(connection, "u-0030")
        await connection.execute(START, job_id)

    play(scratch_database, written)
    migrations.downgrade("creation", scratch_database, "0029")
    frozen = functions_of((FROZEN / "job_changes_0029.sql").read_text())

    async def scenario(connection: asyncpg.Connection) -> None:
        assert await connection.fetchval(NULLABLE) == "NO"
        for name, source in frozen.items():
            assert await connection.fetchval(FUNCTION_SOURCE, name) == source, name
        job_id = await connection.fetchval(
            "SELECT job_id::text FROM creation.jobs WHERE user_id = 'u-0030'"
        )
        # Each row gets the job's message as it stands (what 0030's relay would send).
        message = json.loads(await connection.fetchval(MESSAGE, job_id))
        assert [p for *_, p in await rows(connection, job_id)] == [message, message]
        # 0029's triggers copy the job into every row again.
        await connection.execute(PROGRESS, job_id)
        assert (await rows(connection, job_id))[-1][3]["version"] == "3"

    play(scratch_database, scenario)
    migrations.upgrade("creation", scratch_database)
