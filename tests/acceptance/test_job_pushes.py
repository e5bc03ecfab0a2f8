"""The pushes a real job run records, over the whole stack (creation's job engine with
the stub provider, the outbox relay, notify's Deliver, Envoy): the app registers its
device with a push-to-start token and, once the job runs, its Live Activity token, as an
iOS app does, through the edge. When the job has SUCCEEDED notify holds one start, the
throttled updates, one end and one alert, though the relay delivers every batch again
and out of order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev.stack import Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.stacks import job_in, stack_of_its_own

UPDATE_INTERVAL = 1.0


@pytest.fixture(scope="module")
def running(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("pushes")
    engine_env = {
        "ATELIER_STUB_DURATION": "4",
        "ATELIER_HEARTBEAT": "0.5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        "ATELIER_LIVE_ACTIVITY_UPDATE_INTERVAL": str(UPDATE_INTERVAL),
        # Every batch delivered twice, reversed, and once more after the next one.
        "ATELIER_RELAY_FAULT": "duplicate_reversed",
    }
    with stack_of_its_own(postgres_admin_url, work, "all", engine_env) as stack:
        yield stack


@pytest.fixture
async def db(running: Stack) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(running.database_url))
    yield engine
    await engine.dispose()


async def pushes(db: AsyncEngine, job_id: str) -> list[dict[str, Any]]:
    async with db.connect() as connection:
        rows = await connection.execute(
            text(
                """
                SELECT p.kind, p.version, p.status, p.priority, p.next_attempt_at,
                       t.kind AS token_kind
                FROM notify.pushes p JOIN notify.push_tokens t USING (token_id)
                WHERE p.job_id = :job ORDER BY p.push_id
                """
            ),
            {"job": job_id},
        )
        return [dict(row._mapping) for row in rows]


async def recorded(
    db: AsyncEngine, job_id: str, kinds: set[str], within: float
) -> list[dict[str, Any]]:
    """The job's pushes once every one of ``kinds`` is among them (the relay delivers a
    moment after the job's own commit)."""
    deadline = time.monotonic() + within
    while True:
        rows = await pushes(db, job_id)
        if kinds <= {r["kind"] for r in rows}:
            return rows
        assert time.monotonic() < deadline, f"only {[r['kind'] for r in rows]} after {within} s"
        await asyncio.sleep(0.1)


async def test_a_job_run_records_a_start_throttled_updates_an_end_and_an_alert(
    running: Stack, db: AsyncEngine
) -> None:
    url = f"http://127.0.0.1:{running.ports.envoy}"
    user = User()
    headers = {**user.headers, "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        device = await http.post(
            f"{url}/v1/devices",
            headers=headers,
            json={
                "deviceToken": "a1" * 32,
                "environment": "APNS_ENVIRONMENT_PRODUCTION",
                "bundleId": "dev.atelier.app",
                "pushToStartToken": "b2" * 40,
                "locale": "en-GB",
            },
        )
        assert device.status_code == 200, device.text
        asset = await put_input(running, user.user_id)
        submitted = await http.post(f"{url}/v1/jobs", headers=headers, json=job_body(asset))
        job_id = submitted.json()["job"]["jobId"]
        await job_in(http, url, user.headers, job_id, {"JOB_STATUS_RUNNING"}, 15)
        await recorded(db, job_id, {"la_start"}, 10)
        # The push started the activity on the phone; the app registers its token.
        activity = await http.post(
            f"{url}/v1/jobs/{job_id}/liveActivities",
            headers=headers,
            json={
                "deviceId": device.json()["device"]["deviceId"],
                "pushToken": "c3" * 50,
                "activityId": "activity-1",
            },
        )
        assert activity.status_code == 200, activity.text
        await job_in(http, url, user.headers, job_id, {"JOB_STATUS_SUCCEEDED"}, 30)
    rows = await recorded(db, job_id, {"la_end", "alert"}, 10)

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    assert [r["token_kind"] for r in by_kind["la_start"]] == ["push_to_start"]
    assert [r["token_kind"] for r in by_kind["alert"]] == ["device"]
    assert [r["token_kind"] for r in by_kind["la_end"]] == ["activity"]
    updates = by_kind["la_update"]
    assert updates and all(r["priority"] == 5 for r in updates)
    # Nothing sends here: each update replaced the one waiting, and the end dropped the
    # last.
    assert {r["status"] for r in updates} == {"dropped"}
    # With nothing sent, the queue never held more than one: every update waited in the
    # first one's slot.
    assert len({r["next_attempt_at"] for r in updates}) == 1
    ended = by_kind["la_end"][0]
    assert ended["version"] == by_kind["alert"][0]["version"] and ended["priority"] == 10
