"""What reaches APNs for a job's Live Activity and its owner's device: a real notify server
(Deliver, the token RPCs and its own APNs sender) over a real database, sending to the
real HTTP/2 APNs peer (services/dev/apns_peer.py), which checks each push as Apple does.

- A job's end and its deletion reaching notify together (one Deliver batch, or only the
  deletion's tombstone when the versions before it coalesced, or in quick succession
  while the end still waits to be sent) still alert the owner and end the activity.
- Every Live Activity push carries a `stale-date`.
- NEEDS_ATTENTION shows on the activity at once.
- An activity registered after the job's last change receives the job's current state
  (an update, or the end of a finished job), once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_ingest_service_pb2 as ingest
from atelier.notify.v1 import notify_ingest_service_pb2_grpc, notify_service_pb2_grpc
from atelier.notify.v1 import notify_service_pb2 as pb
from services.dev.apns_peer import ApnsPeer, Received
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.notify.pushes.payloads import NEEDS_ATTENTION_STALE_AFTER, STALE_AFTER
from tests.support.apns_peer import BUNDLE_ID, KEY_ID, TEAM_ID, running_peer
from tests.support.notify import NotifyHarness, job_state, new_job_id, running_notify
from tests.support.rpc import bearer, error_info

pytestmark = pytest.mark.integration

QUEUED = job_pb2.JOB_STATUS_QUEUED
RUNNING = job_pb2.JOB_STATUS_RUNNING
SUCCEEDED = job_pb2.JOB_STATUS_SUCCEEDED
CANCELLED = job_pb2.JOB_STATUS_CANCELLED
NEEDS_ATTENTION = job_pb2.JOB_STATUS_NEEDS_ATTENTION
SERVICE = bearer(DEV_SERVICE_TOKEN)
DEVICE_TOKEN, START_TOKEN, ACTIVITY_TOKEN = "a1" * 32, "b2" * 40, "c3" * 50
ROTATED_TOKEN = "c4" * 50
# Long enough that no test outruns it: a push that waited for the throttle would not
# reach the peer within any test's bound.
INTERVAL = 60
DISMISS_AFTER = 600
# How long a push may take from Deliver to the peer on a loaded machine (the sender
# looks every APNS_POLL; it normally takes well under a second).
WITHIN = 15.0


def user(user_id: str) -> tuple[tuple[str, str], ...]:
    return bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 3600))


@pytest.fixture
async def peer_and_key(tmp_path: Path) -> AsyncIterator[tuple[ApnsPeer, Path]]:
    async with running_peer(tmp_path) as running:
        yield running


@pytest.fixture
async def peer(peer_and_key: tuple[ApnsPeer, Path]) -> ApnsPeer:
    return peer_and_key[0]


@pytest.fixture
async def notify(
    notify_url: str, engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> AsyncIterator[NotifyHarness]:
    peer, key_path = peer_and_key
    async with running_notify(
        notify_url,
        LIVE_ACTIVITY_UPDATE_INTERVAL=str(INTERVAL),
        LIVE_ACTIVITY_DISMISS_AFTER=str(DISMISS_AFTER),
        APNS_ENABLED="true",
        APNS_KEY_PATH=str(key_path),
        APNS_KEY_ID=KEY_ID,
        APNS_TEAM_ID=TEAM_ID,
        APNS_BUNDLE_ID=BUNDLE_ID,
        APNS_PRODUCTION_URL=peer.url,
        APNS_SANDBOX_URL=peer.url,
        APNS_CA_FILE=peer.ca_file,
        # The sender looks once a second: a push recorded a moment before the next
        # Deliver is still waiting when that Deliver arrives, as on a busy server.
        APNS_POLL="1",
    ) as harness:
        yield harness


class Phone:
    """One user's app: its device (alerts, push-to-start) and the Live Activities it
    registers, through notify's public RPCs; and creation's relay, through Deliver."""

    def __init__(self, harness: NotifyHarness, who: str = "alice") -> None:
        self.harness = harness
        self.who = who
        self.device_id = ""

    async def register_device(self, start: str = "") -> None:
        async with self.harness.public_channel() as channel:
            reply = await notify_service_pb2_grpc.NotifyServiceStub(channel).RegisterDevice(
                pb.RegisterDeviceRequest(
                    device_token=DEVICE_TOKEN,
                    environment=pb.APNS_ENVIRONMENT_PRODUCTION,
                    bundle_id=BUNDLE_ID,
                    push_to_start_token=start,
                    locale="en",
                ),
                metadata=user(self.who),
            )
        self.device_id = reply.device.device_id

    async def register_activity(self, job: str, token: str = ACTIVITY_TOKEN) -> None:
        async with self.harness.public_channel() as channel:
            await notify_service_pb2_grpc.NotifyServiceStub(channel).RegisterLiveActivity(
                pb.RegisterLiveActivityRequest(
                    job_id=job, device_id=self.device_id, push_token=token, activity_id="act-1"
                ),
                metadata=user(self.who),
            )

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

    def at(
        self,
        job: str,
        version: int,
        status: job_pb2.JobStatus.ValueType,
        progress: int = 0,
        *,
        deleted: bool = False,
    ) -> job_pb2.Job:
        state = job_state(job, version, user_id=self.who, status=status, progress=progress)
        state.update_time.GetCurrentTime()
        state.deleted = deleted
        return state


def event(received: Received) -> str:
    """alert, or the Live Activity event (start, update, end)."""
    if received.headers["apns-push-type"] == "alert":
        return "alert"
    return str(received.payload["aps"]["event"])


def of_job(peer: ApnsPeer, job: str) -> list[Received]:
    """What the peer accepted for ``job``, in order (alerts name it; Live Activity pushes
    go to tokens of its activity, or name it in a start's attributes)."""
    found = []
    for received in peer.state.received:
        aps = received.payload["aps"]
        named = received.payload.get("jobId") or aps.get("attributes", {}).get("jobId")
        if named == job or (named is None and received.device_token == ACTIVITY_TOKEN):
            found.append(received)
    return found


async def until_received(
    peer: ApnsPeer, job: str, done: Callable[[list[str]], bool], what: str
) -> list[Received]:
    try:
        await peer.wait_for(lambda: done([event(r) for r in of_job(peer, job)]), WITHIN)
    except TimeoutError:
        got = [event(r) for r in of_job(peer, job)]
        raise AssertionError(f"no {what} at the peer after {WITHIN} s; it got {got}") from None
    return of_job(peer, job)


async def recorded(engine: AsyncEngine, job: str) -> list[tuple[str, int, str]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT kind, version, status FROM notify.pushes WHERE job_id = :job"
                " ORDER BY push_id"
            ),
            {"job": job},
        )
        return [(row.kind, row.version, row.status) for row in rows]


async def until_recorded(
    engine: AsyncEngine, job: str, expected: list[tuple[str, int, str]]
) -> None:
    """Until the sender recorded what the peer already accepted."""
    deadline = time.monotonic() + WITHIN
    while (found := await recorded(engine, job)) != expected:
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.05)


def ended_and_alerted(events: list[str]) -> bool:
    return "alert" in events and "end" in events


def assert_cancelled_end_and_alert(received: list[Received]) -> None:
    by_event = {event(r): r for r in received}
    alert, end = by_event["alert"], by_event["end"]
    assert alert.device_token == DEVICE_TOKEN and end.device_token == ACTIVITY_TOKEN
    assert alert.payload["status"] == "cancelled"
    assert alert.payload["aps"]["alert"]["title"] == "Generation cancelled"
    assert end.payload["aps"]["content-state"]["status"] == "cancelled"
    assert [event(r) for r in received].count("end") == 1
    assert [event(r) for r in received].count("alert") == 1


# -- point 1: an end and a deletion together -------------------------------------------


async def test_a_cancel_and_its_deletion_in_one_batch_alert_the_owner_and_end_the_activity(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, QUEUED))
    await phone.register_activity(job)

    # The relay took the cancel and the delete in one batch.
    moved = await phone.deliver(
        phone.at(job, 2, CANCELLED), phone.at(job, 3, CANCELLED, deleted=True)
    )

    assert moved == 1  # the projection holds the newest only, as ever
    received = await until_received(peer, job, ended_and_alerted, "alert and end")
    assert_cancelled_end_and_alert(received)


async def test_a_deletion_whose_cancel_coalesced_away_still_alerts_and_ends(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, QUEUED))
    await phone.register_activity(job)

    # Only the tombstone arrives: it stands in for the terminal state notify never saw.
    await phone.deliver(phone.at(job, 3, CANCELLED, deleted=True))
    received = await until_received(peer, job, ended_and_alerted, "alert and end")
    assert_cancelled_end_and_alert(received)

    # The cancel arriving late (at least once, out of order) adds nothing.
    assert await phone.deliver(phone.at(job, 2, CANCELLED)) == 0
    assert [k for k, _, _ in await recorded(engine, job) if k in ("alert", "la_end")] == [
        "alert",
        "la_end",
    ]


async def test_a_deletion_right_after_the_cancel_leaves_the_waiting_end_to_be_sent(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, QUEUED))
    await phone.register_activity(job)

    # Two Delivers a moment apart: the end is recorded, not yet sent, when the deletion
    # (which retires the job's activity tokens) arrives.
    await phone.deliver(phone.at(job, 2, CANCELLED))
    await phone.deliver(phone.at(job, 3, CANCELLED, deleted=True))

    received = await until_received(peer, job, ended_and_alerted, "alert and end")
    assert_cancelled_end_and_alert(received)
    # Replays of both change nothing.
    await phone.deliver(phone.at(job, 3, CANCELLED, deleted=True), phone.at(job, 2, CANCELLED))
    kinds = [k for k, _, _ in await recorded(engine, job)]
    assert kinds.count("la_end") == 1 and kinds.count("alert") == 1


async def test_a_finished_jobs_deletion_sends_nothing_more(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, RUNNING))
    await phone.register_activity(job)
    await phone.deliver(phone.at(job, 2, SUCCEEDED, 100))
    await until_received(peer, job, ended_and_alerted, "alert and end")

    await phone.deliver(phone.at(job, 3, SUCCEEDED, 100, deleted=True))
    # Nothing recorded for the tombstone: its terminal state's pushes were its last.
    assert {v for _, v, _ in await recorded(engine, job)} <= {1, 2}


# -- point 9: Live Activities ----------------------------------------------------------


async def test_every_live_activity_push_carries_a_stale_date(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device(start=START_TOKEN)
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, RUNNING, 10))
    # The push-to-start reached the phone, which started the activity and registers its
    # token: it shows version 1 already, so registering sends nothing.
    await until_received(peer, job, lambda events: "start" in events, "start")
    await phone.register_activity(job)
    await phone.deliver(phone.at(job, 2, RUNNING, 50))
    await until_received(peer, job, lambda events: "update" in events, "update")
    await phone.deliver(phone.at(job, 3, SUCCEEDED, 100))

    received = await until_received(peer, job, ended_and_alerted, "alert and end")
    activity = [r for r in received if event(r) != "alert"]
    assert [event(r) for r in activity] == ["start", "update", "end"]
    for push in activity:
        aps = push.payload["aps"]
        assert isinstance(aps.get("stale-date"), int), (event(push), aps)
        if event(push) == "end":
            # Final: never shown as out of date before it leaves the Lock Screen.
            assert aps["stale-date"] == aps["dismissal-date"]
        else:
            assert aps["stale-date"] == aps["timestamp"] + STALE_AFTER.total_seconds()


async def test_needs_attention_shows_on_the_activity_at_once(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.register_activity(job)
    await phone.deliver(phone.at(job, 1, RUNNING, 10))
    await until_received(peer, job, lambda events: "update" in events, "first update")

    # Within the throttle's interval (60 s) of that update, yet shown at once.
    await phone.deliver(phone.at(job, 2, NEEDS_ATTENTION, 10))

    def shown(events: list[str]) -> bool:
        return events.count("update") == 2 and "alert" in events

    received = await until_received(peer, job, shown, "needs-attention update and alert")
    update = [r for r in received if event(r) == "update"][-1]
    assert update.payload["aps"]["content-state"]["status"] == "needs_attention"
    assert update.headers["apns-priority"] == "10"
    stale = update.payload["aps"]["stale-date"] - update.payload["aps"]["timestamp"]
    assert stale == NEEDS_ATTENTION_STALE_AFTER.total_seconds()
    [alert] = [r for r in received if event(r) == "alert"]
    assert alert.payload["status"] == "needs_attention"
    # Still there a version later: no second update, nor a second alert.
    await phone.deliver(phone.at(job, 3, NEEDS_ATTENTION, 10))
    assert [k for k, v, _ in await recorded(engine, job) if v == 3] == []


async def test_an_activity_registered_after_the_last_change_gets_the_current_state_once(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, QUEUED), phone.at(job, 2, RUNNING, 40))

    await phone.register_activity(job)

    [update] = await until_received(peer, job, lambda events: "update" in events, "update")
    assert update.device_token == ACTIVITY_TOKEN
    assert update.payload["aps"]["content-state"]["progress"] == 40
    # The app registers again (a relaunch): nothing new is recorded, so nothing is sent.
    await phone.register_activity(job)
    assert [(k, v) for k, v, _ in await recorded(engine, job)] == [("la_update", 2)]
    await until_recorded(engine, job, [("la_update", 2, "sent")])
    # The next change is throttled after the registration's update, as after any.
    await phone.deliver(phone.at(job, 3, RUNNING, 70))
    async with engine.connect() as connection:
        wait = await connection.scalar(
            text(
                "SELECT next_attempt_at - created_at FROM notify.pushes"
                " WHERE job_id = :job AND version = 3"
            ),
            {"job": job},
        )
    assert wait >= timedelta(seconds=INTERVAL - 5)
    # The activity's token rotates: the waiting update moves to the new token, and still
    # waits its turn (the activity is the same, so is Apple's budget for it).
    await phone.register_activity(job, token=ROTATED_TOKEN)
    assert [(k, v, s) for k, v, s in await recorded(engine, job) if v == 3] == [
        ("la_update", 3, "dropped"),
        ("la_update", 3, "pending"),
    ]
    async with engine.connect() as connection:
        wait = await connection.scalar(
            text(
                "SELECT next_attempt_at - now() FROM notify.pushes"
                " WHERE job_id = :job AND version = 3 AND status = 'pending'"
            ),
            {"job": job},
        )
    assert wait >= timedelta(seconds=INTERVAL - 10)


async def test_an_activity_registered_after_the_job_ended_gets_its_end_once(
    notify: NotifyHarness, peer: ApnsPeer, engine: AsyncEngine
) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, RUNNING, 30), phone.at(job, 2, SUCCEEDED, 100))
    await until_received(peer, job, lambda events: "alert" in events, "alert")

    await phone.register_activity(job)

    received = await until_received(peer, job, lambda events: "end" in events, "end")
    [end] = [r for r in received if event(r) == "end"]
    assert end.payload["aps"]["content-state"]["status"] == "succeeded"
    assert end.headers["apns-priority"] == "10"
    await phone.register_activity(job)
    kinds = [k for k, _, _ in await recorded(engine, job)]
    assert sorted(kinds) == ["alert", "la_end"]


async def test_a_deleted_job_takes_no_activity(notify: NotifyHarness, engine: AsyncEngine) -> None:
    phone = Phone(notify)
    await phone.register_device()
    job = new_job_id()
    await phone.deliver(phone.at(job, 1, CANCELLED), phone.at(job, 2, CANCELLED, deleted=True))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await phone.register_activity(job)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(refused.value).reason == "JOB_NOT_FOUND"
