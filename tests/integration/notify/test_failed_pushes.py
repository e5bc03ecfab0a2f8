"""NotifyAdminService.ListFailedPushes against a real notify (its Deliver, token RPCs and
APNs sender) over a real database, sending to the real HTTP/2 APNs peer scripted to refuse
two devices: one push the sender gives up on (400 BadCollapseId: sending again would be
refused again) and one whose token APNs refuses (400 BadDeviceToken). Both are listed for
an operator with why they failed, never with the token itself; a push that went out is
not. Pages and the time range hold; no credential, a user's token and a service of
another role are refused."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_admin_service_pb2 as admin_pb
from atelier.notify.v1 import (
    notify_admin_service_pb2_grpc,
    notify_ingest_service_pb2_grpc,
    notify_service_pb2_grpc,
)
from atelier.notify.v1 import notify_ingest_service_pb2 as ingest
from atelier.notify.v1 import notify_service_pb2 as pb
from services.dev.apns_peer import ApnsPeer
from services.kit.auth import issue_token
from services.kit.identities import entry
from services.kit.settings import DEV_JWT_SECRET
from tests.support.apns_peer import BUNDLE_ID, KEY_ID, TEAM_ID, running_peer
from tests.support.notify import NotifyHarness, job_state, new_job_id, running_notify
from tests.support.rpc import bad_request, bearer, error_info

pytestmark = pytest.mark.integration

CREATION = "creation-credential-" + "c" * 24
OPERATOR = "operator-alice-" + "a" * 24
BACKEND = "backend-shop-" + "s" * 24
REFUSED_TOKEN, BAD_TOKEN, GOOD_TOKEN = "d1" * 32, "e2" * 32, "f3" * 32
WITHIN = 15.0
OP = bearer(OPERATOR)


def identities() -> str:
    return json.dumps(
        [
            entry("creation", "creation", (CREATION,)),
            entry("alice", "operator", (OPERATOR,)),
            entry("shop", "backend", (BACKEND,), act_for_users=True),
        ]
    )


def user(user_id: str) -> tuple[tuple[str, str], ...]:
    return bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 3600))


@pytest.fixture
async def peer_and_key(tmp_path: Path) -> AsyncIterator[tuple[ApnsPeer, Path]]:
    async with running_peer(tmp_path) as running:
        yield running


@pytest.fixture
async def notify(
    notify_url: str, engine: AsyncEngine, peer_and_key: tuple[ApnsPeer, Path]
) -> AsyncIterator[NotifyHarness]:
    peer, key_path = peer_and_key
    async with running_notify(
        notify_url,
        SERVICE_CREDENTIAL=CREATION,
        SERVICE_IDENTITIES=identities(),
        APNS_ENABLED="true",
        APNS_KEY_PATH=str(key_path),
        APNS_KEY_ID=KEY_ID,
        APNS_TEAM_ID=TEAM_ID,
        APNS_BUNDLE_ID=BUNDLE_ID,
        APNS_PRODUCTION_URL=peer.url,
        APNS_SANDBOX_URL=peer.url,
        APNS_CA_FILE=peer.ca_file,
        APNS_POLL="0.05",
    ) as harness:
        yield harness


@pytest.fixture
async def admin(
    notify: NotifyHarness,
) -> AsyncIterator[notify_admin_service_pb2_grpc.NotifyAdminServiceStub]:
    async with notify.internal_channel() as channel:
        yield notify_admin_service_pb2_grpc.NotifyAdminServiceStub(channel)


async def register(notify: NotifyHarness, who: str, token: str) -> None:
    async with notify.public_channel() as channel:
        await notify_service_pb2_grpc.NotifyServiceStub(channel).RegisterDevice(
            pb.RegisterDeviceRequest(
                device_token=token,
                environment=pb.APNS_ENVIRONMENT_PRODUCTION,
                bundle_id=BUNDLE_ID,
                locale="en",
            ),
            metadata=user(who),
        )


async def succeeded(notify: NotifyHarness, *jobs: tuple[str, str]) -> None:
    """Each (user, job) reaches SUCCEEDED through Deliver, as creation's relay sends it:
    each owner's device is sent an alert."""
    states = [
        job_state(job, 3, user_id=who, status=job_pb2.JOB_STATUS_SUCCEEDED) for who, job in jobs
    ]
    async with notify.internal_channel() as channel:
        await notify_ingest_service_pb2_grpc.NotifyIngestServiceStub(channel).Deliver(
            ingest.DeliverRequest(
                messages=[
                    ingest.OutboxMessage(outbox_id=i + 1, job=s) for i, s in enumerate(states)
                ]
            ),
            metadata=bearer(CREATION),
        )


async def until_listed(
    admin: notify_admin_service_pb2_grpc.NotifyAdminServiceStub, count: int
) -> list[admin_pb.FailedPush]:
    """Until the sender recorded what the peer answered (it records after the exchange)."""
    deadline = time.monotonic() + WITHIN
    while True:
        listed = await admin.ListFailedPushes(admin_pb.ListFailedPushesRequest(), metadata=OP)
        if len(listed.pushes) >= count:
            return list(listed.pushes)
        assert time.monotonic() < deadline, list(listed.pushes)
        await asyncio.sleep(0.05)


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    found = timestamp_pb2.Timestamp()
    found.FromDatetime(moment)
    return found


async def test_an_operator_sees_why_pushes_failed_and_never_the_token(
    notify: NotifyHarness,
    admin: notify_admin_service_pb2_grpc.NotifyAdminServiceStub,
    peer_and_key: tuple[ApnsPeer, Path],
) -> None:
    peer, _ = peer_and_key
    peer.fail(REFUSED_TOKEN, 400, "BadCollapseId", times=None)
    peer.fail(BAD_TOKEN, 400, "BadDeviceToken", times=None)
    for who, token in (("ann", REFUSED_TOKEN), ("bob", BAD_TOKEN), ("cy", GOOD_TOKEN)):
        await register(notify, who, token)
    before = datetime.now(UTC) - timedelta(seconds=5)
    refused_job, bad_job, good_job = new_job_id(), new_job_id(), new_job_id()
    await succeeded(notify, ("ann", refused_job), ("bob", bad_job), ("cy", good_job))
    await peer.wait_for(lambda: len(peer.state.answers) >= 3, WITHIN)

    listed = {p.job_id: p for p in await until_listed(admin, 2)}
    assert set(listed) == {refused_job, bad_job}  # the alert that went out is no failure
    refused, bad = listed[refused_job], listed[bad_job]
    assert (refused.state, refused.http_status, refused.reason) == (
        admin_pb.FAILED_PUSH_STATE_FAILED,
        400,
        "BadCollapseId",
    )
    assert (bad.state, bad.http_status, bad.reason) == (
        admin_pb.FAILED_PUSH_STATE_TOKEN_REFUSED,
        400,
        "BadDeviceToken",
    )
    for push, who, token, job in (
        (refused, "ann", REFUSED_TOKEN, refused_job),
        (bad, "bob", BAD_TOKEN, bad_job),
    ):
        assert (push.kind, push.user_id, push.job_version) == (admin_pb.PUSH_KIND_ALERT, who, 3)
        assert push.environment == pb.APNS_ENVIRONMENT_PRODUCTION
        assert push.device_token_suffix == token[-6:]
        assert token not in push.SerializeToString().hex() + str(push)
        assert push.attempts == 1 and push.apns_id
        assert push.create_time.ToDatetime(tzinfo=UTC) >= before
        assert push.last_attempt_time.ToDatetime(tzinfo=UTC) >= push.create_time.ToDatetime(
            tzinfo=UTC
        )
        assert push.job_id == job

    # One a page: the second page holds the other, and no third.
    first = await admin.ListFailedPushes(admin_pb.ListFailedPushesRequest(page_size=1), metadata=OP)
    assert len(first.pushes) == 1 and first.next_page_token
    second = await admin.ListFailedPushes(
        admin_pb.ListFailedPushesRequest(page_size=1, page_token=first.next_page_token),
        metadata=OP,
    )
    assert {first.pushes[0].push_id, second.pushes[0].push_id} == {
        refused.push_id,
        bad.push_id,
    }
    assert first.pushes[0].create_time.ToDatetime() >= second.pushes[0].create_time.ToDatetime()
    assert second.next_page_token == ""

    # The time range: nothing planned after now, both since before the test.
    later = await admin.ListFailedPushes(
        admin_pb.ListFailedPushesRequest(since=stamp(datetime.now(UTC) + timedelta(minutes=1))),
        metadata=OP,
    )
    assert list(later.pushes) == []
    window = await admin.ListFailedPushes(
        admin_pb.ListFailedPushesRequest(
            since=stamp(before), until=stamp(datetime.now(UTC) + timedelta(minutes=1))
        ),
        metadata=OP,
    )
    assert len(window.pushes) == 2
    earlier = await admin.ListFailedPushes(
        admin_pb.ListFailedPushesRequest(until=stamp(before)), metadata=OP
    )
    assert list(earlier.pushes) == []


async def test_bad_requests_are_refused_with_a_field(
    admin: notify_admin_service_pb2_grpc.NotifyAdminServiceStub,
) -> None:
    now = datetime.now(UTC)
    page = await admin.ListFailedPushes(
        admin_pb.ListFailedPushesRequest(page_size=1, since=stamp(now - timedelta(days=1))),
        metadata=OP,
    )
    assert page.next_page_token == ""  # nothing failed: one empty page
    for request, reason, field in (
        (
            admin_pb.ListFailedPushesRequest(since=stamp(now), until=stamp(now)),
            "INVALID_ADMIN_REQUEST",
            "until",
        ),
        (admin_pb.ListFailedPushesRequest(page_size=-1), "INVALID_PAGE_SIZE", "page_size"),
        (admin_pb.ListFailedPushesRequest(page_token="nope"), "INVALID_PAGE_TOKEN", "page_token"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin.ListFailedPushes(request, metadata=OP)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).reason == reason
        found = bad_request(refused.value)
        assert found is not None and [v.field for v in found.field_violations] == [field]


async def test_only_operators_may_list_failed_pushes(
    admin: notify_admin_service_pb2_grpc.NotifyAdminServiceStub,
) -> None:
    request = admin_pb.ListFailedPushesRequest()
    for metadata, code, reason in (
        ((), grpc.StatusCode.UNAUTHENTICATED, "SERVICE_CREDENTIAL_MISSING"),
        (user("ann"), grpc.StatusCode.UNAUTHENTICATED, "SERVICE_CREDENTIAL_INVALID"),
        (bearer(CREATION), grpc.StatusCode.PERMISSION_DENIED, "RPC_NOT_PERMITTED"),
        (bearer(BACKEND), grpc.StatusCode.PERMISSION_DENIED, "RPC_NOT_PERMITTED"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin.ListFailedPushes(request, metadata=metadata)
        assert refused.value.code() == code, metadata
        assert error_info(refused.value).reason == reason
    assert (await admin.ListFailedPushes(request, metadata=OP)).pushes is not None
