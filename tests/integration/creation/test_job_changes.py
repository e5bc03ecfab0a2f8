"""The one writer of job changes (sql/job_changes.sql): whoever updates a job's row with
its version bumped, the database writes the change's event, ledger entry and outbox row;
a cancel request is an event naming who asked, and so is the CANCELLED that ends it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf import json_format, timestamp_pb2
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import admin, leases
from services.creation.store import jobs as store
from services.creation.store.fenced import FencedWrite
from services.creation.store.outbox import OUTBOX_CHANNEL
from services.creation.tables import job_events
from services.kit.db import driver_connection
from tests.integration.creation.helpers import T0, side_rows
from tests.integration.creation.test_leases import TTL, claimed
from tests.support.fenced import fenced_write
from tests.support.job_errors import AN_ERROR


async def events(engine: AsyncEngine, job_id: str) -> list[dict[str, Any]]:
    columns = (
        job_events.c.from_status,
        job_events.c.to_status,
        job_events.c.actor_kind,
        job_events.c.actor_id,
        job_events.c.reason,
        job_events.c.requester_kind,
        job_events.c.requester_id,
    )
    async with engine.connect() as connection:
        rows = await connection.execute(
            select(*columns).where(job_events.c.job_id == job_id).order_by(job_events.c.version)
        )
    return [dict(r._mapping) for r in rows]


async def test_a_cancel_request_is_an_event_naming_who_asked_and_so_is_the_cancelled(
    engine: AsyncEngine,
) -> None:
    (job,) = await claimed(engine, 1)
    await store.cancel(engine, job.user_id, job.job_id, T0)
    await fenced_write(engine, FencedWrite.ACKNOWLEDGE_CANCEL, job.job_id, job.lease_epoch, T0)
    submitted, claim, request, cancelled = await events(engine, job.job_id)
    assert submitted["actor_kind"] == "user" and submitted["requester_kind"] is None
    assert claim == {
        "from_status": "queued",
        "to_status": "running",
        "actor_kind": "worker",
        "actor_id": "w1",
        "reason": "claimed",
        "requester_kind": None,
        "requester_id": None,
    }
    assert request == {
        "from_status": "running",
        "to_status": "running",
        "actor_kind": "user",
        "actor_id": job.user_id,
        "reason": "cancel requested",
        "requester_kind": "user",
        "requester_id": job.user_id,
    }
    # Who acknowledged (the worker) and who asked (the owner).
    assert cancelled == {
        "from_status": "running",
        "to_status": "cancelled",
        "actor_kind": "worker",
        "actor_id": "w1",
        "reason": "cancelled",
        "requester_kind": "user",
        "requester_id": job.user_id,
    }


async def test_an_operator_cancel_names_the_operator_unless_the_owner_asked(
    engine: AsyncEngine,
) -> None:
    unasked, asked = await claimed(engine, 2)
    for job in (unasked, asked):
        await fenced_write(
            engine, FencedWrite.OUTCOME_UNKNOWN, job.job_id, job.lease_epoch, T0, "lost"
        )
    await store.cancel(engine, asked.user_id, asked.job_id, T0)
    for job in (unasked, asked):
        await admin.resolve(engine, job.job_id, admin.Decision.CANCEL, "ops-ana", "refund", T0)
    *_, last = await events(engine, unasked.job_id)
    assert (last["actor_kind"], last["actor_id"], last["to_status"]) == (
        "operator",
        "ops-ana",
        "cancelled",
    )
    assert (last["requester_kind"], last["requester_id"]) == ("operator", "ops-ana")
    *_, request, last = await events(engine, asked.job_id)
    assert (request["from_status"], request["to_status"]) == ("needs_attention",) * 2
    assert (last["actor_kind"], last["requester_kind"], last["requester_id"]) == (
        "operator",
        "user",
        asked.user_id,
    )


async def test_any_versioned_update_writes_its_side_rows_and_a_heartbeat_none(
    engine: AsyncEngine,
) -> None:
    """The mechanism is the database's, not a store function's: a hand-written UPDATE
    that bumps the version gets its event, ledger entry and outbox row too."""
    (job,) = await claimed(engine, 1)
    await leases.heartbeat(engine, job.job_id, job.lease_epoch, TTL, T0 + timedelta(seconds=1))
    before = await side_rows(engine, job.job_id)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                f"UPDATE creation.jobs SET status = 'failed', {AN_ERROR},"
                " completed_at = now(), lease_owner = NULL, lease_expires_at = NULL,"
                " version = version + 1, change_actor_kind = 'operator',"
                " change_actor_id = 'psql', change_reason = 'by hand'"
                " WHERE job_id = :id"
            ),
            {"id": job.job_id},
        )
    after = await side_rows(engine, job.job_id)
    assert len(before["events"]) == 2 and before["outbox_versions"] == [1, 2]
    assert after["events"][-1] == (3, "running", "failed")
    assert after["outbox_versions"] == [1, 2, 3]
    assert after["ledger"] == [("reserve", job.price_points), ("release", job.price_points)]
    *_, last = await events(engine, job.job_id)
    assert (last["actor_kind"], last["actor_id"], last["reason"]) == ("operator", "psql", "by hand")


async def test_a_heartbeat_wakes_no_relay(engine: AsyncEngine) -> None:
    """A statement that moves no version leaves the update trigger before its inserts, so
    no side table's statement trigger fires over no row: no NOTIFY on the outbox's channel
    (before migration 0034 every heartbeat woke every relay for an empty round). A
    versioned change on the same job is heard, so the listener does hear."""
    (job,) = await claimed(engine, 1)
    heard: list[str] = []

    def hear(*args: Any) -> None:
        heard.append(args[2])  # (connection, pid, channel, payload)

    async with driver_connection(engine) as listener:
        await listener.add_listener(OUTBOX_CHANNEL, hear)
        try:
            await leases.heartbeat(
                engine, job.job_id, job.lease_epoch, TTL, T0 + timedelta(seconds=1)
            )
            # A round trip after the beat's commit: a notification it sent is read first.
            await listener.execute("SELECT 1")
            await asyncio.sleep(0.2)
            await listener.execute("SELECT 1")
            assert heard == []
            async with engine.begin() as connection:
                await connection.execute(
                    text(
                        "UPDATE creation.jobs SET progress = 5, version = version + 1"
                        " WHERE job_id = :id"
                    ),
                    {"id": job.job_id},
                )
            for _ in range(50):
                await listener.execute("SELECT 1")
                if heard:
                    break
                await asyncio.sleep(0.05)
            assert heard == [OUTBOX_CHANNEL]
        finally:
            await listener.remove_listener(OUTBOX_CHANNEL, hear)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 2, 1, 2, 3, tzinfo=UTC),
        datetime(2026, 12, 2, 1, 2, 3, 120_000, tzinfo=UTC),
        datetime(2026, 12, 2, 1, 2, 3, 120_005, tzinfo=UTC),
        datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC),
    ],
    ids=["whole", "milliseconds", "microseconds", "before-epoch"],
)
async def test_the_payloads_time_is_protobufs_own_json(
    engine: AsyncEngine, moment: datetime
) -> None:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    async with engine.connect() as connection:
        written = (
            await connection.execute(text("SELECT creation.rfc3339(:t)"), {"t": moment})
        ).scalar_one()
    assert written == json_format.MessageToJson(stamp).strip('"')
