"""notify's operator metrics, read from the service's real /metrics endpoint over HTTP:
open watch streams by kind, and push outcomes by reason (the service's own sender against
the real HTTP/2 APNs peer, on real PostgreSQL)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from services.dev.processes import free_port
from services.kit.settings import ListenSettings
from tests.support.apns_peer import insert_push, insert_token, push_row, running_peer, settings_for
from tests.support.notify_streams import replica, settings, watch_job, watch_jobs
from tests.support.projection import apply, job_state
from tests.support.scrape import Scrape, scrape, scrape_until


async def change_push(engine: AsyncEngine, push_id: int, assignments: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(f"UPDATE notify.pushes SET {assignments} WHERE push_id = :push_id"),
            {"push_id": push_id},
        )


def streams_open(got: Scrape, kind: str) -> float:
    return got.get("atelier_notify_open_streams", kind=kind)


async def test_open_streams_are_counted_by_kind(engine: AsyncEngine, notify_url: str) -> None:
    port = free_port()
    user, job = f"user-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    await apply(engine, [job_state(job, user, 1, job_pb2.JOB_STATUS_QUEUED)])
    async with replica(replace(settings(notify_url), listen=ListenSettings(0, 0, port))) as rep:
        before = await scrape(port)
        one_job = watch_job(rep, user, job)
        all_jobs = watch_jobs(rep, user)
        # Each stream has registered once it has sent its first message.
        await one_job.next()
        await all_jobs.next()
        got = await scrape(port)
        assert streams_open(got, "job") - streams_open(before, "job") == 1
        assert streams_open(got, "user") - streams_open(before, "user") == 1

        one_job.cancel()
        all_jobs.cancel()
        await scrape_until(
            port,
            lambda s: (
                streams_open(s, "job") == streams_open(before, "job")
                and streams_open(s, "user") == streams_open(before, "user")
            ),
        )


async def test_push_outcomes_are_counted_by_reason(
    engine: AsyncEngine, notify_url: str, tmp_path: Path
) -> None:
    """One push sent, one to a token Apple says is gone (410 Unregistered), one that
    expired before it could go; the service's own sender handles them."""
    async with running_peer(tmp_path) as (peer, key_path):
        sent_to, _ = await insert_token(engine)
        gone_to, gone_token = await insert_token(engine)
        peer.fail(gone_token, 410, "Unregistered")
        late_to, _ = await insert_token(engine)
        port = free_port()
        apns = settings_for(peer, key_path)
        notify = replace(settings(notify_url), listen=ListenSettings(0, 0, port), apns=apns)
        # Expired already, and not due until the sender runs (made due in one statement).
        late = await insert_push(engine, late_to)
        await change_push(
            engine,
            late,
            "expires_at = now() - interval '1 minute', next_attempt_at = now() + interval '1 hour'",
        )
        async with replica(notify) as _:
            # Before the pushes are due, so the sender cannot have handled any of them yet.
            before = await scrape(port)
            pushes = {
                "sent": await insert_push(engine, sent_to),
                "gone": await insert_push(engine, gone_to),
                "late": late,
            }
            await change_push(engine, late, "next_attempt_at = now()")
            name = "atelier_apns_pushes_total"

            def counted(got: Scrape, outcome: str, reason: str) -> float:
                was = before.value(name, outcome=outcome, reason=reason) or 0.0
                return (got.value(name, outcome=outcome, reason=reason) or 0.0) - was

            got = await scrape_until(
                port,
                lambda s: (
                    counted(s, "sent", "none") == 1
                    and counted(s, "dropped", "Unregistered") == 1
                    and counted(s, "dropped", "Expired") == 1
                ),
            )
            assert counted(got, "failed", "other") == 0
        statuses = {k: (await push_row(engine, v))["status"] for k, v in pushes.items()}
        assert statuses == {"sent": "sent", "gone": "dropped", "late": "dropped"}
