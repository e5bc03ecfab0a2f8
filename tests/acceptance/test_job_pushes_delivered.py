"""Issue 11's end-to-end acceptance, with every part a real process: creation's job engine
with the stub provider, the outbox relay delivering every batch twice, reversed and once
more later, notify's Deliver planning the pushes, TWO notify processes each running its
APNs sender against the one database (as two replicas would), and the local HTTP/2 APNs
peer checking each request as Apple does. A job run to SUCCEEDED reaches the peer as one
Live Activity start, throttled updates, one end and one alert, each exactly once.

Why two notify processes rather than a second sender inside one: the claim is what keeps
replicas from sending a push twice, and only separate processes with their own pools and
HTTP/2 connections make that claim contend the way replicas do."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.dev.stack import Replica, Stack
from services.kit.db import asyncpg_url
from tests.acceptance.test_jobs_edge import User, job_body, put_input
from tests.support.edge_retry import as_a_client_would
from tests.support.stacks import job_in, stack_of_its_own

pytestmark = pytest.mark.acceptance

UPDATE_INTERVAL = 1.0
DEVICE_TOKEN = "a1" * 32
START_TOKEN = "b2" * 40
ACTIVITY_TOKEN = "c3" * 50


def tail(token: str) -> str:
    """How the peer names a device in its log."""
    return "…" + token[-8:]


@pytest.fixture(scope="module")
def running(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, Replica]]:
    work = tmp_path_factory.mktemp("pushes-delivered")
    env = {
        "ATELIER_STUB_DURATION": "5",
        "ATELIER_HEARTBEAT": "0.5",
        "ATELIER_WORKER_PROVIDER_POLL": "0.2",
        "ATELIER_LIVE_ACTIVITY_UPDATE_INTERVAL": str(UPDATE_INTERVAL),
        # Every batch delivered twice, reversed, and once more after the next one.
        "ATELIER_RELAY_FAULT": "duplicate_reversed",
        # Both senders look often, so that they contend for the same pushes.
        "ATELIER_APNS_POLL": "0.05",
    }
    with stack_of_its_own(postgres_admin_url, work, "all", env, apns_peer=True) as stack:
        yield stack, stack.start_replica("notify")


@pytest.fixture
async def db(running: tuple[Stack, Replica]) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(running[0].database_url))
    yield engine
    await engine.dispose()


def peer_log(stack: Stack) -> list[dict[str, Any]]:
    """Every push the peer accepted, in order."""
    assert stack.log_dir is not None
    path = stack.log_dir / "apns-peer.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if '"apns_peer_push"' in x]


def event(push: dict[str, Any]) -> str:
    """alert, or the Live Activity event (start, update, end)."""
    if push["push_type"] == "alert":
        return "alert"
    return str(push["payload"]["aps"]["event"])


async def pushes(db: AsyncEngine, job_id: str) -> list[dict[str, Any]]:
    async with db.connect() as connection:
        rows = await connection.execute(
            text(
                """
                SELECT p.push_id, p.kind, p.status, p.priority, p.apns_id, p.sent_at,
                       p.next_attempt_at,
                       p.last_reason, t.kind AS token_kind
                FROM notify.pushes p JOIN notify.push_tokens t USING (token_id)
                WHERE p.job_id = :job ORDER BY p.push_id
                """
            ),
            {"job": job_id},
        )
        return [dict(row._mapping) for row in rows]


def brief(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as one line each, for a failure's message."""
    return [
        f"{r['kind']} {r['status']} sent_at={r['sent_at']} next={r['next_attempt_at']}"
        for r in rows
    ]


async def until(what: str, within: float, check: Any) -> Any:
    """``await check()`` once it returns something truthy; fails after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} after {within} s"
        await asyncio.sleep(0.05)


async def sent_requests(http: httpx.AsyncClient, metrics_port: int) -> int:
    """The 200s a notify process's sender got from APNs (its Prometheus counter)."""
    body = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    found = re.search(r'^atelier_apns_requests_total\{status="200"\} (\S+)$', body, re.M)
    return int(float(found.group(1))) if found else 0


async def test_a_job_run_reaches_the_apns_peer_as_one_start_updates_one_end_one_alert(
    running: tuple[Stack, Replica], db: AsyncEngine
) -> None:
    stack, second = running
    url = f"http://127.0.0.1:{stack.ports.envoy}"
    user = User()
    headers = {**user.headers, "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        # Each request is safe to repeat (an upsert, or a submit under its request id),
        # so it is sent again after a 503 with retry-after, as a client would.
        device = await as_a_client_would(
            lambda: http.post(
                f"{url}/v1/devices",
                headers=headers,
                json={
                    "deviceToken": DEVICE_TOKEN,
                    "environment": "APNS_ENVIRONMENT_PRODUCTION",
                    "bundleId": "dev.atelier.app",
                    "pushToStartToken": START_TOKEN,
                    "locale": "en-GB",
                },
            )
        )
        assert device.status_code == 200, device.text
        asset = await put_input(stack, user.user_id)
        body = job_body(asset, requestId=str(uuid.uuid4()))
        submitted = await as_a_client_would(
            lambda: http.post(f"{url}/v1/jobs", headers=headers, json=body)
        )
        assert submitted.status_code == 200, submitted.text
        job_id = submitted.json()["job"]["jobId"]

        async def started() -> bool:
            return any(event(p) == "start" for p in peer_log(stack))

        # The push-to-start reached the phone, which starts the activity and registers
        # its token, as the app does.
        await until("la_start at the peer", 20, started)
        activity = await as_a_client_would(
            lambda: http.post(
                f"{url}/v1/jobs/{job_id}/liveActivities",
                headers=headers,
                json={
                    "deviceId": device.json()["device"]["deviceId"],
                    "pushToken": ACTIVITY_TOKEN,
                    "activityId": "activity-1",
                },
            )
        )
        assert activity.status_code == 200, activity.text
        await job_in(http, url, user.headers, job_id, {"JOB_STATUS_SUCCEEDED"}, 30)

        async def drained() -> list[dict[str, Any]] | None:
            rows = await pushes(db, job_id)
            kinds = {r["kind"] for r in rows}
            if not {"la_end", "alert"} <= kinds or any(r["status"] == "pending" for r in rows):
                return None
            sent = [r for r in rows if r["status"] == "sent"]
            return rows if len(peer_log(stack)) >= len(sent) else None

        rows = await until("drained push queue", 20, drained)
        by_sender = [
            await sent_requests(http, stack.ports.metrics["notify"]),
            await sent_requests(http, second.metrics_port),
        ]

    received = peer_log(stack)
    events = [event(p) for p in received]
    # Exactly once each, in the order a phone needs them.
    assert events.count("start") == 1 and events.count("end") == 1
    assert events.count("alert") == 1
    updates = [p for p in received if event(p) == "update"]
    assert len(updates) >= 2, (events, brief(rows))
    # The start first; no update after the end (an ended activity takes none).
    assert events[0] == "start" or events.index("start") < events.index("update")
    assert max(i for i, e in enumerate(events) if e == "update") < events.index("end")
    # No push reached the peer twice, though Deliver was replayed and two senders ran.
    apns_ids = [p["apns_id"] for p in received]
    assert len(set(apns_ids)) == len(apns_ids)
    assert sum(by_sender) == len(received), by_sender
    print(f"pushes accepted from each notify: {by_sender}; events: {events}")
    # Who got what.
    devices = {event(p): p["device"] for p in received}
    assert devices == {
        "start": tail(START_TOKEN),
        "update": tail(ACTIVITY_TOKEN),
        "end": tail(ACTIVITY_TOKEN),
        "alert": tail(DEVICE_TOKEN),
    }
    assert all(p["priority"] == "5" for p in updates)
    progress = [p["payload"]["aps"]["content-state"]["progress"] for p in updates]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)

    # The queue agrees with the peer: every push sent, once, with the apns-id the peer
    # saw; only updates a newer one replaced before they went were never sent.
    sent = [r for r in rows if r["status"] == "sent"]
    assert sorted(r["apns_id"] for r in sent) == sorted(apns_ids)
    unsent = [r for r in rows if r["status"] != "sent"]
    assert all(r["kind"] == "la_update" and r["status"] == "dropped" for r in unsent), brief(unsent)
    assert sorted(r["kind"] for r in sent if r["kind"] != "la_update") == [
        "alert",
        "la_end",
        "la_start",
    ]
    # Throttled: each update went at least an interval after the one before.
    went = sorted(r["sent_at"] for r in sent if r["kind"] == "la_update")
    gaps = [later - earlier for earlier, later in itertools.pairwise(went)]
    assert all(gap >= timedelta(seconds=UPDATE_INTERVAL) for gap in gaps), gaps
