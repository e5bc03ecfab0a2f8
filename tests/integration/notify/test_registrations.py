"""The APNs token RPCs over a real notify server and database: devices (with their
push-to-start token) and Live Activity tokens are stored once, rotate, are removed, are
refused with field violations when they cannot be tokens, and are only ever the caller's."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from atelier.notify.v1 import notify_service_pb2_grpc
from services.kit.auth import issue_token
from services.kit.logging import JsonFormatter
from services.kit.settings import DEV_JWT_SECRET
from services.notify.store import ProjectionStore
from tests.support.notify import job_state, new_job_id, running_notify
from tests.support.rpc import bad_request, bearer, error_info

TOKEN = "ab" * 32
OTHER_TOKEN = "cd" * 32
START_TOKEN = "ef" * 40
BUNDLE = "dev.atelier.app"


def user(user_id: str) -> tuple[tuple[str, str], ...]:
    return bearer(issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user_id, 3600))


ALICE, BOB = user("alice"), user("bob")


@pytest.fixture
async def stub(
    notify_url: str, engine: AsyncEngine
) -> AsyncIterator[notify_service_pb2_grpc.NotifyServiceStub]:
    async with running_notify(notify_url) as harness, harness.public_channel() as channel:
        yield notify_service_pb2_grpc.NotifyServiceStub(channel)


def device_request(
    token: str = TOKEN, push_to_start: str = "", locale: str = "fr-FR"
) -> pb.RegisterDeviceRequest:
    return pb.RegisterDeviceRequest(
        device_token=token,
        environment=pb.APNS_ENVIRONMENT_SANDBOX,
        bundle_id=BUNDLE,
        push_to_start_token=push_to_start,
        locale=locale,
    )


async def tokens(engine: AsyncEngine) -> list[tuple[str, str, str, str | None]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT kind, token, status, status_reason FROM notify.push_tokens"
                " ORDER BY kind, token"
            )
        )
        return [(r.kind, r.token, r.status, r.status_reason) for r in rows]


async def test_a_device_registered_twice_is_stored_once_and_listed_to_its_owner_only(
    stub: notify_service_pb2_grpc.NotifyServiceStub, engine: AsyncEngine
) -> None:
    first = await stub.RegisterDevice(device_request(TOKEN.upper()), metadata=ALICE)
    again = await stub.RegisterDevice(device_request(TOKEN, START_TOKEN, "en"), metadata=ALICE)
    assert again.device.device_id == first.device.device_id
    assert again.device.has_push_to_start_token and not first.device.has_push_to_start_token
    assert again.device.locale == "en" and first.device.locale == "fr-FR"
    assert again.device.environment == pb.APNS_ENVIRONMENT_SANDBOX
    assert again.device.bundle_id == BUNDLE
    assert await tokens(engine) == [
        ("device", TOKEN, "active", None),
        ("push_to_start", START_TOKEN, "active", None),
    ]
    listed = await stub.ListDevices(pb.ListDevicesRequest(), metadata=ALICE)
    assert [d.device_id for d in listed.devices] == [first.device.device_id]
    assert (await stub.ListDevices(pb.ListDevicesRequest(), metadata=BOB)).devices == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.DeleteDevice(
            pb.DeleteDeviceRequest(device_id=first.device.device_id), metadata=BOB
        )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(refused.value).reason == "DEVICE_NOT_FOUND"


async def test_logs_carry_only_the_first_8_characters_of_a_token(
    stub: notify_service_pb2_grpc.NotifyServiceStub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    device = await stub.RegisterDevice(device_request(push_to_start=START_TOKEN), metadata=ALICE)
    job = new_job_id()
    await stub.RegisterLiveActivity(
        pb.RegisterLiveActivityRequest(
            job_id=job, device_id=device.device.device_id, push_token=OTHER_TOKEN, activity_id="a"
        ),
        metadata=ALICE,
    )
    formatter = JsonFormatter("notify")
    lines = [formatter.format(r) for r in caplog.records if r.name.startswith("services.notify")]
    logged = {json.loads(line)["action"]: json.loads(line) for line in lines}
    assert logged["device_registered"]["apns_prefix"] == TOKEN[:8]
    assert logged["live_activity_registered"]["apns_prefix"] == OTHER_TOKEN[:8]
    for whole in (TOKEN, START_TOKEN, OTHER_TOKEN):
        assert not any(whole in line for line in lines)


async def test_a_new_push_to_start_token_replaces_the_old_and_delete_retires_both(
    stub: notify_service_pb2_grpc.NotifyServiceStub, engine: AsyncEngine
) -> None:
    await stub.RegisterDevice(device_request(push_to_start=START_TOKEN), metadata=ALICE)
    newer = "12" * 40
    reply = await stub.RegisterDevice(device_request(push_to_start=newer), metadata=ALICE)
    assert await tokens(engine) == [
        ("device", TOKEN, "active", None),
        ("push_to_start", newer, "active", None),
        ("push_to_start", START_TOKEN, "retired", "replaced"),
    ]
    await stub.DeleteDevice(
        pb.DeleteDeviceRequest(device_id=reply.device.device_id), metadata=ALICE
    )
    assert [(kind, status) for kind, _, status, _ in await tokens(engine)] == [
        ("device", "retired"),
        ("push_to_start", "retired"),
        ("push_to_start", "retired"),
    ]
    assert (await stub.ListDevices(pb.ListDevicesRequest(), metadata=ALICE)).devices == []
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await stub.DeleteDevice(
            pb.DeleteDeviceRequest(device_id=reply.device.device_id), metadata=ALICE
        )
    assert again.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (device_request("ab" * 31), {"device_token"}),  # 62 digits: too short
        (device_request("ab" * 101), {"device_token"}),  # 202 digits: too long
        (device_request("a" * 65), {"device_token"}),  # an odd number of digits
        (device_request("zz" * 32), {"device_token"}),  # not hex
        (device_request(TOKEN, push_to_start="a" * 65), {"push_to_start_token"}),  # odd
        (device_request(TOKEN, locale="not a locale"), {"locale"}),
        (
            pb.RegisterDeviceRequest(device_token=TOKEN, bundle_id="nodots"),
            {"environment", "bundle_id"},
        ),
        (pb.RegisterDeviceRequest(), {"device_token", "environment", "bundle_id"}),
    ],
)
async def test_what_cannot_be_a_device_is_refused_with_field_violations(
    stub: notify_service_pb2_grpc.NotifyServiceStub,
    engine: AsyncEngine,
    request_: pb.RegisterDeviceRequest,
    fields: set[str],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.RegisterDevice(request_, metadata=ALICE)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(refused.value).reason == "INVALID_DEVICE"
    found = bad_request(refused.value)
    assert found is not None
    assert {v.field for v in found.field_violations} == fields
    assert await tokens(engine) == []


async def test_a_live_activity_token_rotates_under_its_activity_id_and_is_removed(
    stub: notify_service_pb2_grpc.NotifyServiceStub, engine: AsyncEngine
) -> None:
    device = (await stub.RegisterDevice(device_request(), metadata=ALICE)).device
    job = new_job_id()
    first, second = "11" * 50, "22" * 50

    def register(token: str) -> pb.RegisterLiveActivityRequest:
        return pb.RegisterLiveActivityRequest(
            job_id=job, device_id=device.device_id, push_token=token, activity_id="act-1"
        )

    reply = await stub.RegisterLiveActivity(register(first), metadata=ALICE)
    assert reply.job_id == job and reply.activity_id == "act-1"
    await stub.RegisterLiveActivity(register(first), metadata=ALICE)
    await stub.RegisterLiveActivity(register(second), metadata=ALICE)
    activity = [t for t in await tokens(engine) if t[0] == "activity"]
    assert activity == [
        ("activity", first, "retired", "rotated"),
        ("activity", second, "active", None),
    ]
    remove = pb.DeleteLiveActivityRequest(job_id=job, activity_id="act-1")
    with pytest.raises(grpc.aio.AioRpcError) as not_bobs:
        await stub.DeleteLiveActivity(remove, metadata=BOB)
    assert error_info(not_bobs.value).reason == "LIVE_ACTIVITY_NOT_FOUND"
    await stub.DeleteLiveActivity(remove, metadata=ALICE)
    assert all(t[2] == "retired" for t in await tokens(engine) if t[0] == "activity")
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.DeleteLiveActivity(remove, metadata=ALICE)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_live_activity_needs_the_callers_device_and_job(
    stub: notify_service_pb2_grpc.NotifyServiceStub, engine: AsyncEngine
) -> None:
    alices = (await stub.RegisterDevice(device_request(), metadata=ALICE)).device
    bobs = (await stub.RegisterDevice(device_request(OTHER_TOKEN), metadata=BOB)).device
    job = new_job_id()
    await ProjectionStore(engine).apply(
        [job_state(job, 1, user_id="alice", status=job_pb2.JOB_STATUS_QUEUED)]
    )
    on_bobs_device = pb.RegisterLiveActivityRequest(
        job_id=job, device_id=bobs.device_id, push_token="33" * 40, activity_id="a"
    )
    with pytest.raises(grpc.aio.AioRpcError) as device_refused:
        await stub.RegisterLiveActivity(on_bobs_device, metadata=ALICE)
    assert error_info(device_refused.value).reason == "DEVICE_NOT_FOUND"
    alices_job_on_bob = pb.RegisterLiveActivityRequest(
        job_id=job, device_id=bobs.device_id, push_token="33" * 40, activity_id="a"
    )
    with pytest.raises(grpc.aio.AioRpcError) as job_refused:
        await stub.RegisterLiveActivity(alices_job_on_bob, metadata=BOB)
    assert job_refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(job_refused.value).reason == "JOB_NOT_FOUND"
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stub.RegisterLiveActivity(
            pb.RegisterLiveActivityRequest(
                job_id="x", device_id=alices.device_id, push_token="4", activity_id=""
            ),
            metadata=ALICE,
        )
    assert error_info(invalid.value).reason == "INVALID_LIVE_ACTIVITY"
    found = bad_request(invalid.value)
    assert found is not None
    assert {v.field for v in found.field_violations} == {"job_id", "push_token", "activity_id"}


async def test_devices_are_listed_newest_first_in_pages(
    stub: notify_service_pb2_grpc.NotifyServiceStub,
) -> None:
    registered = [
        (await stub.RegisterDevice(device_request(f"{i:02x}" * 32), metadata=ALICE)).device
        for i in range(3)
    ]
    first = await stub.ListDevices(pb.ListDevicesRequest(page_size=2), metadata=ALICE)
    second = await stub.ListDevices(
        pb.ListDevicesRequest(page_size=2, page_token=first.next_page_token), metadata=ALICE
    )
    assert [d.device_id for d in [*first.devices, *second.devices]] == [
        d.device_id for d in reversed(registered)
    ]
    assert second.next_page_token == ""
    with pytest.raises(grpc.aio.AioRpcError) as forged:
        await stub.ListDevices(pb.ListDevicesRequest(page_token="forged"), metadata=ALICE)
    assert error_info(forged.value).reason == "INVALID_PAGE_TOKEN"


async def test_ids_in_another_spelling_are_refused_as_creation_refuses_them(
    stub: notify_service_pb2_grpc.NotifyServiceStub,
) -> None:
    """Python's uuid reads braces, urn:uuid: and missing hyphens; the kit's rule (every
    service's) does not, with the same reasons as any other malformed id."""
    device = (await stub.RegisterDevice(device_request(), metadata=ALICE)).device
    job = new_job_id()
    for spelled in (f"{{{device.device_id}}}", device.device_id.replace("-", "")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.DeleteDevice(pb.DeleteDeviceRequest(device_id=spelled), metadata=ALICE)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).reason == "INVALID_DEVICE_ID"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.RegisterLiveActivity(
            pb.RegisterLiveActivityRequest(
                job_id=f"urn:uuid:{job}",
                device_id=device.device_id.upper(),
                push_token="55" * 40,
                activity_id="a",
            ),
            metadata=ALICE,
        )
    assert error_info(refused.value).reason == "INVALID_LIVE_ACTIVITY"
    found = bad_request(refused.value)
    assert found is not None
    # The uppercase device id is the device's, spelled in the other case: accepted.
    assert {v.field for v in found.field_violations} == {"job_id"}
    listed = await stub.ListDevices(pb.ListDevicesRequest(), metadata=ALICE)
    assert [d.device_id for d in listed.devices] == [device.device_id]
