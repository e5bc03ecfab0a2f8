"""Migrations 0027, 0029 and 0031: while a webhook endpoint is enabled, the job change
triggers (sql/job_changes.sql) mark each new version's outbox row with its event type and
wake the deliverers at commit, and write no delivery themselves;
creation.fan_out_webhooks, which the deliverers run, turns marked rows into one delivery
per (endpoint, event) that wants it, with the job's message as the job stands then (0031;
before, the outbox row's copy). 0029's downgrade fans out what is marked and brings back
0027's triggers; 0027's brings back 0025's and takes the tables away."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from services.kit import migrations
from tests.migration.test_job_changes_file import FROZEN, FUNCTION_SOURCE, functions_of
from tests.migration.test_submit_function import SUBMIT

ENDPOINT = """
    INSERT INTO creation.webhook_endpoints (
        endpoint_id, url, event_types, user_ids, model_ids, job_id, signing_owner, secret,
        enabled, disabled_reason, created_by)
    VALUES ($1, 'https://hooks.example/in', $2, $3, $4, $5,
            CASE WHEN $5::uuid IS NULL THEN NULL ELSE 'svc-a' END,
            CASE WHEN $5::uuid IS NULL THEN 'whsec_' || md5(random()::text) END,
            $6, CASE WHEN $6 THEN '' ELSE 'operator' END, 'op-test')
"""
DELIVERIES = """
    SELECT d.endpoint_id::text, d.event_type, d.job_version, d.payload::text,
           o.payload::text AS outbox_payload,
           d.message_id, d.state, d.user_id, d.occurred_at = o.created_at AS same_time
    FROM creation.webhook_deliveries AS d
    JOIN creation.outbox AS o ON o.job_id = d.job_id AND o.version = d.job_version
    WHERE d.job_id = $1::uuid ORDER BY d.job_version, d.endpoint_id
"""
JOB_OF = "SELECT job_id::text FROM creation.jobs WHERE user_id = $1"
FAN_OUT = "SELECT taken, written FROM creation.fan_out_webhooks($1)"
MARKED = "SELECT count(*) FROM creation.outbox WHERE webhooks_pending"
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
BEAT = """
    UPDATE creation.jobs SET lease_expires_at = now() + interval '2 minutes'
    WHERE job_id = $1::uuid
"""
CANCEL = """
    UPDATE creation.jobs SET status = 'cancelled', version = version + 1,
        completed_at = now(), lease_owner = NULL, lease_expires_at = NULL
    WHERE job_id = $1::uuid
"""
DELETE = """
    UPDATE creation.jobs SET deleted_at = now(), prompt = '', negative_prompt = '',
        request_hash = '', version = version + 1
    WHERE job_id = $1::uuid
"""

Scenario = Callable[[asyncpg.Connection], Awaitable[None]]


def play(url: str, scenario: Scenario) -> None:
    async def go() -> None:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await scenario(connection)
        finally:
            await connection.close()

    asyncio.run(go())


async def endpoint(
    connection: asyncpg.Connection,
    events: list[str],
    *,
    users: list[str] | None = None,
    models: list[str] | None = None,
    job_id: str | None = None,
    enabled: bool = True,
) -> str:
    endpoint_id = str(uuid.uuid4())
    await connection.execute(
        ENDPOINT, endpoint_id, events, users or [], models or [], job_id, enabled
    )
    return endpoint_id


async def submit(connection: asyncpg.Connection, user: str) -> str:
    assert await connection.fetchval(SUBMIT, user) == "ok"
    job_id = await connection.fetchval(JOB_OF, user)
    assert isinstance(job_id, str)
    return job_id


async def deliveries(connection: asyncpg.Connection, job_id: str) -> list[dict[str, Any]]:
    return [dict(row) for row in await connection.fetch(DELIVERIES, job_id)]


async def fanned(connection: asyncpg.Connection, job_id: str) -> list[dict[str, Any]]:
    """The job's deliveries once every marked change is fanned out."""
    while (await connection.fetchrow(FAN_OUT, 100))["taken"]:
        pass
    return await deliveries(connection, job_id)


def test_without_endpoints_a_job_change_writes_no_delivery(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        job_id = await submit(connection, "u-none")
        await connection.execute(START, job_id)
        await connection.execute(PROGRESS, job_id)
        # A disabled endpoint is as good as none.
        await endpoint(connection, ["job.queued", "job.running"], enabled=False)
        other = await submit(connection, "u-disabled")
        await connection.execute(START, other)
        # No change is marked for the deliverers, so fanning out finds nothing.
        assert await connection.fetchval(MARKED) == 0
        assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (0, 0)
        assert await deliveries(connection, job_id) == []
        assert await deliveries(connection, other) == []
        assert await connection.fetchval("SELECT count(*) FROM creation.outbox") == 5
        # Unmarked rows record what changed, not the job (migration 0030).
        assert (
            await connection.fetchval(
                "SELECT count(*) FROM creation.outbox WHERE payload IS NOT NULL"
            )
            == 0
        )

    play(scratch_database, scenario)


def test_a_matching_endpoint_gets_each_new_version_with_the_job_as_fanned_out_off_the_jobs_path(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        every = await endpoint(
            connection,
            ["job.queued", "job.running", "job.progress", "job.cancelled", "job.deleted"],
        )
        job_id = await submit(connection, "u-all")
        # The job's own statements wrote no delivery and no copy of the job: they marked
        # their outbox rows (migration 0031).
        assert await deliveries(connection, job_id) == []
        assert await connection.fetchval(MARKED) == 1
        assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (1, 1)
        for change in (START, BEAT, PROGRESS):
            await connection.execute(change, job_id)
        assert await connection.fetchval(MARKED) == 2
        # Fanned out in batches (one, then the rest): each row once.
        assert tuple(await connection.fetchrow(FAN_OUT, 1)) == (1, 1)
        await connection.execute(CANCEL, job_id)
        await connection.execute(DELETE, job_id)
        assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (3, 3)
        assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (0, 0)
        found = await deliveries(connection, job_id)
        # The beat moved no version: no event.
        assert [(d["event_type"], d["job_version"]) for d in found] == [
            ("job.queued", 1),
            ("job.running", 2),
            ("job.progress", 3),
            ("job.cancelled", 4),
            ("job.deleted", 5),
        ]
        for delivery in found:
            assert delivery["endpoint_id"] == every
            assert delivery["outbox_payload"] is None
            assert delivery["same_time"]
            assert delivery["state"] == "pending" and delivery["user_id"] == "u-all"
            assert delivery["message_id"].startswith("msg_")
        assert len({d["message_id"] for d in found}) == len(found)
        # Each event is the job as it stood when its change was fanned out: its own
        # version, or a later one when the job had moved on meanwhile (job.running's is
        # the job after its progress; the three fanned out after the deletion carry the
        # deleted job's tombstone).
        assert [
            (json.loads(d["payload"])["version"], json.loads(d["payload"])["status"]) for d in found
        ] == [
            ("1", "JOB_STATUS_QUEUED"),
            ("3", "JOB_STATUS_RUNNING"),
            ("5", "JOB_STATUS_CANCELLED"),
            ("5", "JOB_STATUS_CANCELLED"),
            ("5", "JOB_STATUS_CANCELLED"),
        ]
        assert all(json.loads(d["payload"]).get("deleted") is True for d in found[2:])
        assert json.loads(found[1]["payload"])["progressPercent"] == 10

        # A change rolled back takes its mark with it: nothing to fan out.
        transaction = connection.transaction()
        await transaction.start()
        rolled = await submit(connection, "u-rolled-back")
        assert await connection.fetchval(MARKED) == 1
        await transaction.rollback()
        assert await connection.fetchval(MARKED) == 0
        assert await fanned(connection, rolled) == []
        # An endpoint disabled before a change is fanned out does not get it.
        late = await submit(connection, "u-late")
        await connection.execute(
            "UPDATE creation.webhook_endpoints SET enabled = false,"
            " disabled_reason = 'operator' WHERE endpoint_id = $1",
            every,
        )
        assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (1, 0)
        assert await deliveries(connection, late) == []

    play(scratch_database, scenario)


def test_endpoints_get_only_the_events_users_models_and_job_they_name(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        model = "stub-fast"  # the model SUBMIT names
        running_only = await endpoint(connection, ["job.running"])
        for_u1 = await endpoint(connection, ["job.queued"], users=["u1"])
        for_model = await endpoint(connection, ["job.queued"], models=[model])
        other_model = await endpoint(connection, ["job.queued"], models=["stub-slow"])
        # A per-job endpoint for a job not yet written (as SubmitJob writes it first).
        planned = str(uuid.uuid4())
        per_job = await endpoint(connection, ["job.queued", "job.running"], job_id=planned)
        await endpoint(connection, ["job.queued", "job.running"], enabled=False)

        u1 = await submit(connection, "u1")
        u2 = await submit(connection, "u2")
        sql = SUBMIT.replace("p_job_id => gen_random_uuid()", "p_job_id => $2::uuid")
        assert await connection.fetchval(sql, "u3", planned) == "ok"

        def by_endpoint(found: list[dict[str, Any]]) -> set[tuple[str, str]]:
            return {(d["endpoint_id"], d["event_type"]) for d in found}

        assert by_endpoint(await fanned(connection, u1)) == {
            (for_u1, "job.queued"),
            (for_model, "job.queued"),
        }
        assert by_endpoint(await deliveries(connection, u2)) == {(for_model, "job.queued")}
        assert by_endpoint(await deliveries(connection, planned)) == {
            (for_model, "job.queued"),
            (per_job, "job.queued"),
        }
        # Progress is told only to those that name it; a new status to those naming it.
        for job_id in (u1, planned):
            await connection.execute(START, job_id)
            await connection.execute(PROGRESS, job_id)
        running = [d for d in await fanned(connection, u1) if d["job_version"] > 1]
        assert by_endpoint(running) == {(running_only, "job.running")}
        running = [d for d in await deliveries(connection, planned) if d["job_version"] > 1]
        assert by_endpoint(running) == {(running_only, "job.running"), (per_job, "job.running")}
        assert other_model not in {d["endpoint_id"] for d in await deliveries(connection, u1)}

    play(scratch_database, scenario)


def test_marked_changes_and_new_deliveries_wake_the_deliverers_at_commit_others_do_not(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        url = scratch_database.replace("postgresql+asyncpg://", "postgresql://")
        listener = await asyncpg.connect(url)
        woken: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("creation_webhooks", lambda *a: woken.put_nowait(a[2]))
        try:
            await submit(connection, "u-quiet")
            # A round trip on the listener's connection delivers what was sent before it.
            await listener.execute("SELECT 1")
            assert woken.empty()
            await endpoint(connection, ["job.queued"])
            await submit(connection, "u-loud")
            await asyncio.wait_for(woken.get(), 30)
            # The fan-out's new deliveries wake the others (the endpoints have work).
            assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (1, 1)
            await asyncio.wait_for(woken.get(), 30)
            # A heartbeat moves no version: it wakes no one, endpoint or not.
            job_id = await connection.fetchval(JOB_OF, "u-loud")
            await connection.execute(START, job_id)
            await asyncio.wait_for(woken.get(), 30)
            await connection.execute(BEAT, job_id)
            await listener.execute("SELECT 1")
            assert woken.empty()
            await connection.fetchrow(FAN_OUT, 100)
            await listener.execute("SELECT 1")
            while not woken.empty():
                woken.get_nowait()
            # A finished delivery made pending again (a redelivery) wakes them too.
            await connection.execute(
                "UPDATE creation.webhook_deliveries SET state = 'failed', completed_at = now()"
            )
            await listener.execute("SELECT 1")
            assert woken.empty()
            await connection.execute(
                "UPDATE creation.webhook_deliveries SET state = 'pending', completed_at = NULL"
            )
            await asyncio.wait_for(woken.get(), 30)
        finally:
            await listener.close()

    play(scratch_database, scenario)


def test_the_rows_refuse_what_the_design_forbids(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        with pytest.raises(asyncpg.CheckViolationError, match="event_types_known"):
            await endpoint(connection, ["job.exploded"])
        with pytest.raises(asyncpg.CheckViolationError, match="secret_or_job"):
            await connection.execute(
                "INSERT INTO creation.webhook_endpoints (endpoint_id, url, event_types,"
                " created_by) VALUES (gen_random_uuid(), 'https://x', '{job.queued}', 'op')"
            )
        hook = await endpoint(connection, ["job.queued"])
        job_id = await submit(connection, "u-rules")
        assert len(await fanned(connection, job_id)) == 1
        with pytest.raises(asyncpg.CheckViolationError, match="excerpt_short"):
            await connection.execute(
                "UPDATE creation.webhook_deliveries SET last_response_excerpt = repeat('x', 257)"
            )
        with pytest.raises(asyncpg.UniqueViolationError):
            await connection.execute(
                "INSERT INTO creation.webhook_deliveries (endpoint_id, job_id, job_version,"
                " event_type, payload, occurred_at) VALUES ($1, $2::uuid, 1, 'job.queued',"
                " '{}', now())",
                hook,
                job_id,
            )
        # Deleting an endpoint deletes its deliveries.
        await connection.execute(
            "DELETE FROM creation.webhook_endpoints WHERE endpoint_id = $1", hook
        )
        assert await deliveries(connection, job_id) == []

    play(scratch_database, scenario)


def test_two_fan_outs_at_once_take_different_rows(scratch_database: str) -> None:
    migrations.upgrade("creation", scratch_database)

    async def scenario(connection: asyncpg.Connection) -> None:
        await endpoint(connection, ["job.queued"])
        jobs = [await submit(connection, f"u-pair-{n}") for n in range(4)]
        url = scratch_database.replace("postgresql+asyncpg://", "postgresql://")
        other = await asyncpg.connect(url)
        try:
            # One replica's fan-out holds its two rows (its transaction still open)...
            async with other.transaction():
                assert tuple(await other.fetchrow(FAN_OUT, 2)) == (2, 2)
                # ...the other, at the same time, skips them: no wait, no double.
                assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (2, 2)
            assert tuple(await connection.fetchrow(FAN_OUT, 100)) == (0, 0)
        finally:
            await other.close()
        for job_id in jobs:
            assert len(await deliveries(connection, job_id)) == 1

    play(scratch_database, scenario)


def test_downgrading_0029_fans_out_what_is_marked_and_brings_back_0027s_triggers(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)

    async def marked(connection: asyncpg.Connection) -> None:
        await endpoint(connection, ["job.queued"])
        await submit(connection, "u-marked")
        assert await connection.fetchval(MARKED) == 1

    play(scratch_database, marked)
    migrations.downgrade("creation", scratch_database, "0028")
    frozen = functions_of((FROZEN / "job_changes_0027.sql").read_text())

    async def scenario(connection: asyncpg.Connection) -> None:
        for name in ("write_job_inserts", "write_job_updates"):
            assert await connection.fetchval(FUNCTION_SOURCE, name) == frozen[name]
        marked_job = await connection.fetchval(JOB_OF, "u-marked")
        assert len(await deliveries(connection, marked_job)) == 1
        # 0027's triggers write the deliveries in the job's own statement again.
        job_id = await submit(connection, "u-0028")
        assert len(await deliveries(connection, job_id)) == 1

    play(scratch_database, scenario)
    migrations.upgrade("creation", scratch_database)


def test_downgrading_0027_brings_back_0025s_triggers_and_takes_the_tables(
    scratch_database: str,
) -> None:
    migrations.upgrade("creation", scratch_database)
    migrations.downgrade("creation", scratch_database, "0026")
    frozen = functions_of((FROZEN / "job_changes_0025.sql").read_text())

    async def scenario(connection: asyncpg.Connection) -> None:
        for name in ("write_job_inserts", "write_job_updates"):
            assert await connection.fetchval(FUNCTION_SOURCE, name) == frozen[name]
        assert await connection.fetchval("SELECT to_regclass('creation.webhook_endpoints')") is None
        await submit(connection, "u-0026")

    play(scratch_database, scenario)
    migrations.upgrade("creation", scratch_database)
