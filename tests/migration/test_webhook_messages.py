"""Migration 0031: a job change marked for the webhooks records what changed and no copy
of the job, like every outbox row; creation.fan_out_webhooks builds each delivery's job
message from the job's row when it fans the change out. Rows marked before keep their
copies, and the fan-out uses them. Its downgrade gives each marked row without a copy its
job's message and brings back 0030's triggers."""

from __future__ import annotations

import json

import asyncpg

from services.kit import migrations
from tests.migration.test_job_changes_file import FROZEN, FUNCTION_SOURCE, functions, functions_of
from tests.migration.test_outbox_changes import MESSAGE, rows
from tests.migration.test_webhook_deliveries import (
    PROGRESS,
    START,
    deliveries,
    endpoint,
    fanned,
    play,
    submit,
)


def test_0031_marks_changes_without_a_copy_and_fans_out_the_job_as_it_stands(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database, "0030")

    async def before(connection: asyncpg.Connection) -> None:
        await endpoint(connection, ["job.queued", "job.running", "job.progress"])
        job_id = await submit(connection, "u-0030")
        # 0030's trigger kept the job as of version 1 in the marked row.
        assert (await rows(connection, job_id))[0][3]["version"] == "1"

    play(scratch_database, before)
    migrations.upgrade("creation", scratch_database)

    async def after(connection: asyncpg.Connection) -> None:
        for name, source in functions().items():
            assert await connection.fetchval(FUNCTION_SOURCE, name) == source, name
        old = await connection.fetchval(
            "SELECT job_id::text FROM creation.jobs WHERE user_id = 'u-0030'"
        )
        await connection.execute(START, old)
        # Marked, with no copy: the job's statement built no message.
        assert (await rows(connection, old))[1] == (2, "job.running", True, None)
        hooked = await submit(connection, "u-0031")
        await connection.execute(START, hooked)
        await connection.execute(PROGRESS, hooked)
        assert [r[2:] for r in await rows(connection, hooked)] == [(True, None)] * 3
        # The row marked before 0031 goes out with its copy; the others with the job
        # as it stands at the fan-out.
        delivered = await fanned(connection, old)
        now = json.loads(await connection.fetchval(MESSAGE, old))
        assert [json.loads(d["payload"]) for d in delivered] == [
            json.loads(delivered[0]["outbox_payload"]),
            now,
        ]
        assert json.loads(delivered[0]["payload"])["version"] == "1"
        now = json.loads(await connection.fetchval(MESSAGE, hooked))
        assert now["version"] == "3"
        assert [json.loads(d["payload"]) for d in await deliveries(connection, hooked)] == [now] * 3

    play(scratch_database, after)


def test_downgrading_0031_gives_marked_rows_their_jobs_message_and_brings_back_0030s(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)

    async def written(connection: asyncpg.Connection) -> None:
        await endpoint(connection, ["job.queued", "job.running", "job.progress"])
        plain = await submit(connection, "u-fanned")
        await fanned(connection, plain)
        job_id = await submit(connection, "u-0031")
        await connection.execute(START, job_id)

    play(scratch_database, written)
    migrations.downgrade("creation", scratch_database, "0030")
    frozen = functions_of((FROZEN / "job_changes_0030.sql").read_text())

    async def scenario(connection: asyncpg.Connection) -> None:
        for name, source in frozen.items():
            assert await connection.fetchval(FUNCTION_SOURCE, name) == source, name
        job_id = await connection.fetchval(
            "SELECT job_id::text FROM creation.jobs WHERE user_id = 'u-0031'"
        )
        # Each marked row gets the job's message as it stands (what 0031's fan-out would
        # send); a row already fanned out is left as it was.
        message = json.loads(await connection.fetchval(MESSAGE, job_id))
        assert [p for *_, p in await rows(connection, job_id)] == [message, message]
        fanned_out = await connection.fetchval(
            "SELECT job_id::text FROM creation.jobs WHERE user_id = 'u-fanned'"
        )
        assert [p for *_, p in await rows(connection, fanned_out)] == [None]
        # 0030's triggers copy the job into a marked row again.
        await connection.execute(PROGRESS, job_id)
        assert (await rows(connection, job_id))[-1][3]["version"] == "3"

    play(scratch_database, scenario)
    migrations.upgrade("creation", scratch_database)
