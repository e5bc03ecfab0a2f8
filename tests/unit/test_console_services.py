"""The console's method table (creation's AdminService and notify's NotifyAdminService,
each on its own channel), its settings, and notify's pure parts of ListFailedPushes: the
time range a request asks for and the answer, which never carries a device token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import timestamp_pb2

from atelier.notify.v1 import notify_admin_service_pb2 as admin_pb
from atelier.notify.v1 import notify_service_pb2 as pb
from services.console.server import ADMIN, NOTIFY_ADMIN, Console, _methods
from services.console.settings import ConsoleSettings
from services.kit.errors import ApiError
from services.kit.identities import grants
from services.notify.admin_servicer import failed_push_message, time_range
from services.notify.domain import FailedPush

NOW = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    found = timestamp_pb2.Timestamp()
    found.FromDatetime(moment)
    return found


async def test_each_method_goes_to_its_service_on_its_channel() -> None:
    creation = grpc.aio.insecure_channel("127.0.0.1:1")
    notify = grpc.aio.insecure_channel("127.0.0.1:2")
    try:
        methods = _methods([(ADMIN, creation), (NOTIFY_ADMIN, notify)])
        assert methods["ListFailedPushes"].channel is notify
        assert methods["ListFailedPushes"].path == (
            "/atelier.notify.v1.NotifyAdminService/ListFailedPushes"
        )
        assert methods["RedeliverWebhooks"].channel is creation
        assert methods["GetCaller"].path == "/atelier.creation.v1.AdminService/GetCaller"
        # A name two services share would be ambiguous under /api/<Method>.
        with pytest.raises(ValueError, match="two services of the console name"):
            _methods([(ADMIN, creation), (ADMIN, notify)])
        # Without notify's channel the failed pushes are simply not there.
        assert "ListFailedPushes" not in Console(creation, 5, 0)._methods
    finally:
        await creation.close(None)
        await notify.close(None)


def test_the_console_finds_notify_where_the_settings_say() -> None:
    assert ConsoleSettings.from_env({}).notify_internal_address == "127.0.0.1:50063"
    settings = ConsoleSettings.from_env({"ATELIER_NOTIFY_INTERNAL_ADDRESS": "notify:50063"})
    assert settings.notify_internal_address == "notify:50063"


def test_operators_hold_notify_admin_and_no_other_role_does() -> None:
    _, services = grants("operator", ())
    assert "/atelier.notify.v1.NotifyAdminService/" in services
    for role in ("creation", "notify", "backend"):
        assert "/atelier.notify.v1.NotifyAdminService/" not in grants(role, ())[1]


def test_the_time_range_is_checked() -> None:
    assert time_range(admin_pb.ListFailedPushesRequest()) == (None, None)
    since, until = time_range(
        admin_pb.ListFailedPushesRequest(since=stamp(NOW), until=stamp(NOW + timedelta(hours=1)))
    )
    assert (since, until) == (NOW, NOW + timedelta(hours=1))
    for request in (
        admin_pb.ListFailedPushesRequest(since=stamp(NOW), until=stamp(NOW)),
        admin_pb.ListFailedPushesRequest(since=stamp(NOW), until=stamp(NOW - timedelta(1))),
    ):
        with pytest.raises(ApiError) as refused:
            time_range(request)
        assert refused.value.reason == "INVALID_ADMIN_REQUEST"


def test_a_failed_push_is_answered_without_its_token() -> None:
    push = FailedPush(
        push_id=7,
        kind="la_update",
        status="dropped",
        job_id="0b1e6c9e-6a3d-4b52-9d0c-7d3c5f0f6a11",
        version=4,
        user_id="ann",
        token_suffix="c0ffee",
        environment="sandbox",
        attempts=2,
        http_status=None,
        reason="BadDeviceToken",
        apns_id=None,
        created_at=NOW,
        last_attempt_at=None,
    )
    message = failed_push_message(push)
    assert message.kind == admin_pb.PUSH_KIND_LIVE_ACTIVITY_UPDATE
    assert message.state == admin_pb.FAILED_PUSH_STATE_TOKEN_REFUSED
    assert message.environment == pb.APNS_ENVIRONMENT_SANDBOX
    assert (message.http_status, message.apns_id, message.device_token_suffix) == (0, "", "c0ffee")
    assert not message.HasField("last_attempt_time")
    assert message.create_time.ToDatetime(tzinfo=UTC) == NOW
