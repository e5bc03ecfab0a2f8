"""Deliver records the pushes each update implies, in the update's own transaction, over
a real notify server and database: a job run yields one Live Activity start (through the
push-to-start token), throttled updates only on change, one end with a dismissal date and
one localised alert; a replayed Deliver records nothing new; another user's tokens and
retired tokens get nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_ingest_service_pb2 as ingest
from atelier.notify.v1 import notify_ingest_service_pb2_grpc, notify_service_pb2_grpc
from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.notify.store import PushStore
from tests.support.notify import NotifyHarness, job_state, new_job_id, running_notify
from tests.support.rpc import bearer

QUEUED = job_pb2.JOB_STATUS_QUEUED
RUNNING = job_pb2.JOB_STATUS_RUNNING
SUCCEEDED = job_pb2.JOB_STATUS_SUCCEEDED
FAILED = job_pb2.JOB_STATUS_FAILED
NEEDS_ATTENTION = job_pb2.JOB_STATUS_NEEDS_ATTENTION
SERVICE = bearer(DEV_SERVICE_TOKEN)
BUNDLE = "dev.atelier.app"
DEVICE_TOKEN, START_TOKEN, ACTIVITY_TOKEN = "aa" * 32, "bb" * 40, "cc" * 50
INTERVAL = 60  # seconds between updates: long enough that no test outruns it


def user(user_id: str) -> tuple[tuple[str, str], ...]:
    return bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 3600))


@pytest.fixture
async def notify(notify_url: str, engine: AsyncEngine) -> AsyncIterator[NotifyHarness]:
    async with running_notify(
        notify_url,
        LIVE_ACTIVITY_UPDATE_INTERVAL=str(INTERVAL),
        LIVE_ACTIVITY_DISMISS_AFTER="600",
    ) as harness:
        yield harness


class Client:
    def __init__(self, harness: NotifyHarness) -> None:
        self.harness = harness

    async def deliver(self, *states: job_pb2.Job) -> int:
        async with self.harness.internal_channel() as channel:
            reply = await notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(channel).Deliver(
                ingest.DeliverRequest(
                    messages=[
                        ingest.OutboxMessage(outbox_id=i + 1, job=s) for i, s in enumerate(states)
                    ]
                ),
                metadata=SERVICE,
            )
            return reply.applied_count

    async def register_device(
        self, who: str, token: str = DEVICE_TOKEN, start: str = "", locale: str = "fr-FR"
    ) -> str:
        async with self.harness.public_channel() as channel:
            reply = await notify_service_pb2_grpc.NotifyServiceStub(channel).RegisterDevice(
                pb.RegisterDeviceRequest(
                    device_token=token,
                    environment=pb.APNS_ENVIRONMENT_PRODUCTION,
                    bundle_id=BUNDLE,
                    push_to_start_token=start,
                    locale=locale,
                ),
                metadata=user(who),
            )
            return reply.device.device_id

    async def register_activity(self, who: str, job: str, device: str, token: str) -> None:
        async with self.harness.public_channel() as channel:
            await notify_service_pb2_grpc.NotifyServiceStub(channel).RegisterLiveActivity(
                pb.RegisterLiveActivityRequest(
                    job_id=job, device_id=device, push_token=token, activity_id="activity-1"
                ),
                metadata=user(who),
            )


async def pushes(engine: AsyncEngine, job: str) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                """
                SELECT p.kind, p.version, p.priority, p.status, p.headers, p.payload,
                       p.next_attempt_at, p.created_at, p.collapse_id, p.expires_at,
                       t.kind AS token_kind
                FROM notify.pushes p JOIN notify.push_tokens t USING (token_id)
                WHERE p.job_id = :job ORDER BY p.push_id
                """
            ),
            {"job": job},
        )
        return [dict(row._mapping) for row in rows]


async def mark_sent(engine: AsyncEngine, job: str, version: int) -> None:
    """What the sender does once APNs accepted a push."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE notify.pushes SET status = 'sent', sent_at = now()"
                " WHERE job_id = :job AND version = :version"
            ),
            {"job": job, "version": version},
        )


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return [(r["kind"], r["version"], r["status"]) for r in rows]


async def test_a_job_run_records_one_start_throttled_updates_one_end_and_one_alert(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    client = Client(notify)
    device = await client.register_device("alice", start=START_TOKEN)
    job = new_job_id()

    def at(
        version: int, status: job_pb2.JobStatus.ValueType = RUNNING, progress: int = 0, **kw: Any
    ) -> job_pb2.Job:
        return job_state(job, version, user_id="alice", status=status, progress=progress, **kw)

    await client.deliver(at(1, QUEUED))
    assert await pushes(engine, job) == []
    await client.deliver(at(2, RUNNING))
    [start] = await pushes(engine, job)
    assert (start["kind"], start["token_kind"], start["priority"]) == (
        "la_start",
        "push_to_start",
        10,
    )
    assert start["headers"]["apns-push-type"] == "liveactivity"
    assert start["headers"]["apns-topic"] == f"{BUNDLE}.push-type.liveactivity"
    aps = start["payload"]["aps"]
    assert aps["event"] == "start" and aps["attributes"] == {"jobId": job}
    assert aps["attributes-type"] == "JobActivityAttributes"
    assert aps["alert"]["title"] == "Création de votre image"  # the device's locale

    # The sender sends it; the app starts the activity from it and registers its token.
    await mark_sent(engine, job, 2)
    await client.register_activity("alice", job, device, ACTIVITY_TOKEN)
    await client.deliver(at(3, progress=30))
    # A new version that shows nothing new (only the step moved) is not worth a push.
    await client.deliver(at(4, progress=30, step=job_pb2.JOB_STEP_GENERATING))
    # Still waiting to go: the newer state takes the waiting one's place.
    await client.deliver(at(5, progress=60))
    rows = await pushes(engine, job)
    assert summary(rows)[1:] == [("la_update", 3, "dropped"), ("la_update", 5, "pending")]
    assert rows[2]["next_attempt_at"] == rows[1]["next_attempt_at"]
    assert rows[2]["priority"] == 5 and rows[2]["headers"]["apns-priority"] == "5"
    assert rows[2]["payload"]["aps"]["content-state"]["progress"] == 60

    # The sender sends it; the next update waits for the interval after that.
    await mark_sent(engine, job, 5)
    await client.deliver(at(6, progress=90))
    rows = await pushes(engine, job)
    sent_at = rows[2]["next_attempt_at"]
    assert rows[3]["kind"] == "la_update" and rows[3]["version"] == 6
    assert rows[3]["next_attempt_at"] >= rows[3]["created_at"] + timedelta(seconds=INTERVAL - 1)
    assert rows[3]["next_attempt_at"] >= sent_at

    await client.deliver(at(7, SUCCEEDED, 100))
    rows = await pushes(engine, job)
    assert summary(rows) == [
        ("la_start", 2, "sent"),
        ("la_update", 3, "dropped"),
        ("la_update", 5, "sent"),
        ("la_update", 6, "dropped"),  # the end supersedes an update that had not gone out
        ("alert", 7, "pending"),
        ("la_end", 7, "pending"),
    ]
    by_kind = {r["kind"]: r for r in rows}
    end, alert = by_kind["la_end"], by_kind["alert"]
    assert end["priority"] == 10 and end["payload"]["aps"]["event"] == "end"
    dismissal = datetime.fromtimestamp(
        end["payload"]["aps"]["dismissal-date"], end["created_at"].tzinfo
    )
    assert timedelta(seconds=590) <= dismissal - end["created_at"] <= timedelta(seconds=610)
    assert end["payload"]["aps"]["content-state"]["status"] == "succeeded"
    assert alert["headers"] == {
        "apns-push-type": "alert",
        "apns-topic": BUNDLE,
        "apns-priority": "10",
        "apns-expiration": alert["headers"]["apns-expiration"],
        "apns-collapse-id": f"job-{job}",
    }
    assert int(alert["headers"]["apns-expiration"]) == int(alert["expires_at"].timestamp())
    assert alert["payload"]["aps"]["alert"]["title"] == "Votre image est prête"
    assert len(json.dumps(alert["payload"]).encode()) <= 4096

    # Deliver replayed, in any order: nothing new.
    before = summary(await pushes(engine, job))
    states = [at(v) for v in range(1, 7)] + [at(7, SUCCEEDED, 100)]
    assert await client.deliver(*reversed(states)) == 0
    for state in states:
        await client.deliver(state)
    assert summary(await pushes(engine, job)) == before


async def test_alerts_in_english_once_per_entry_into_needs_attention_and_on_failure(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    client = Client(notify)
    await client.register_device("bob", locale="de-DE")  # no German: English
    job = new_job_id()

    def at(version: int, status: job_pb2.JobStatus.ValueType) -> job_pb2.Job:
        return job_state(job, version, user_id="bob", status=status)

    await client.deliver(at(1, RUNNING))
    await client.deliver(at(2, NEEDS_ATTENTION))
    await client.deliver(at(3, NEEDS_ATTENTION))  # still there: no second alert
    await client.deliver(at(4, FAILED))
    rows = await pushes(engine, job)
    assert summary(rows) == [("alert", 2, "pending"), ("alert", 4, "pending")]
    assert [r["payload"]["aps"]["alert"]["title"] for r in rows] == [
        "Your image is taking longer",
        "We couldn't make your image",
    ]
    assert rows[1]["payload"]["status"] == "failed"


async def test_only_the_owners_live_tokens_get_pushes(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    client = Client(notify)
    await client.register_device("carol", token="01" * 32, start="02" * 32)
    dave = await client.register_device("dave", token="03" * 32)
    async with notify.public_channel() as channel:
        await notify_service_pb2_grpc.NotifyServiceStub(channel).DeleteDevice(
            pb.DeleteDeviceRequest(device_id=dave), metadata=user("dave")
        )
    daves_job = new_job_id()
    await client.deliver(
        job_state(daves_job, 1, user_id="dave", status=RUNNING),
        job_state(daves_job, 2, user_id="dave", status=SUCCEEDED),
    )
    assert await pushes(engine, daves_job) == []


async def test_an_update_the_sender_holds_is_left_to_it_and_the_next_waits_its_turn(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    client = Client(notify)
    device = await client.register_device("erin", token="05" * 32)
    job = new_job_id()
    await client.register_activity("erin", job, device, "06" * 32)
    await client.deliver(job_state(job, 1, user_id="erin", status=RUNNING, progress=10))
    # A sender has taken the pending update (SKIP LOCKED) and is talking to APNs.
    async with engine.connect() as sender:
        transaction = await sender.begin()
        await sender.execute(
            text("SELECT push_id FROM notify.pushes WHERE status = 'pending' FOR UPDATE")
        )
        await client.deliver(job_state(job, 2, user_id="erin", status=RUNNING, progress=50))
        await transaction.rollback()
    rows = await pushes(engine, job)
    assert summary(rows) == [("la_update", 1, "pending"), ("la_update", 2, "pending")]
    assert rows[1]["next_attempt_at"] >= rows[1]["created_at"] + timedelta(seconds=INTERVAL - 1)


async def test_an_update_a_sender_claimed_is_not_replaced_while_it_is_on_its_way(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    """The sender's claim commits before it talks to APNs: no lock guards the push in
    flight. A newer state must not mark it dropped (it would reach the device unrecorded);
    the newer update waits its turn instead."""
    client = Client(notify)
    device = await client.register_device("fay", token="07" * 32)
    job = new_job_id()
    await client.register_activity("fay", job, device, "08" * 32)
    await client.deliver(job_state(job, 1, user_id="fay", status=RUNNING, progress=10))
    claimed = await PushStore(engine).claim(100, 30)
    assert [(c.kind, c.push_id) for c in claimed if c.kind == "la_update"]
    await client.deliver(job_state(job, 2, user_id="fay", status=RUNNING, progress=50))
    rows = await pushes(engine, job)
    assert summary(rows) == [("la_update", 1, "pending"), ("la_update", 2, "pending")]
    assert rows[1]["next_attempt_at"] >= rows[1]["created_at"] + timedelta(seconds=INTERVAL - 1)


async def activity_tokens(engine: AsyncEngine, who: str) -> dict[str, str]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT job_id::text, status || '/' || coalesce(status_reason, '')"
                " FROM notify.push_tokens WHERE kind = 'activity' AND user_id = :who"
            ),
            {"who": who},
        )
        return {job_id: status for job_id, status in rows.all()}


async def test_deleting_a_job_retires_its_activity_tokens_once_their_end_went(
    notify: NotifyHarness, engine: AsyncEngine
) -> None:
    client = Client(notify)
    device = await client.register_device("erin", start=START_TOKEN)
    job, kept = new_job_id(), new_job_id()
    for each in (job, kept):
        await client.deliver(job_state(each, 1, user_id="erin", status=RUNNING))
        await mark_sent(engine, each, 1)
    await client.register_activity("erin", job, device, ACTIVITY_TOKEN)
    await client.register_activity("erin", kept, device, "dd" * 50)
    await client.deliver(job_state(job, 2, user_id="erin", progress=40))
    assert summary(await pushes(engine, job))[-1] == ("la_update", 2, "pending")

    # The job ends and is deleted at once: only the tombstone arrives. It stands in for
    # the end notify never received: the waiting update gives way to the end, and the
    # activity keeps its token until the end went.
    tombstone = job_state(job, 4, user_id="erin", status=SUCCEEDED)
    tombstone.deleted = True
    assert await client.deliver(tombstone) == 1
    assert summary(await pushes(engine, job))[-3:] == [
        ("la_update", 2, "dropped"),
        ("alert", 4, "pending"),
        ("la_end", 4, "pending"),
    ]
    assert await activity_tokens(engine, "erin") == {job: "active/", kept: "active/"}

    # A finished job deleted after its end went: its activity tokens are retired.
    ended = job_state(kept, 2, user_id="erin", status=SUCCEEDED)
    await client.deliver(ended)
    await mark_sent(engine, kept, 2)
    gone = job_state(kept, 3, user_id="erin", status=SUCCEEDED)
    gone.deleted = True
    assert await client.deliver(gone) == 1
    assert summary(await pushes(engine, kept))[-1] == ("la_end", 2, "sent")
    assert (await activity_tokens(engine, "erin"))[kept] == "retired/job_deleted"
