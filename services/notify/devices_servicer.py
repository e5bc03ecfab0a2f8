"""NotifyService's token RPCs: devices (alert and push-to-start tokens) and Live Activity
tokens. Owner only: every query is scoped to the caller, and another user's device or job
is NOT_FOUND. Tokens are checked here and never logged whole (first 8 characters)."""

from __future__ import annotations

import uuid
from typing import Any

from google.protobuf import timestamp_pb2
from grpc import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.auth import current_principal
from services.kit.errors import ApiError, FieldViolation, invalid_argument, not_found
from services.kit.logging import get_logger
from services.kit.pagination import KeysetCodec, Timestamp, Uuid, page_size
from services.notify.errors import Reason
from services.notify.pushes import registrations, tokens
from services.notify.pushes.queue import PushQueue
from services.notify.pushes.registrations import (
    ActivityRegistration,
    DeviceCursor,
    DeviceRegistration,
    DeviceRow,
)

log = get_logger(__name__)
Context = aio.ServicerContext[Any, Any]

DEVICE_PAGES = KeysetCodec("devices", DeviceCursor, created_at=Timestamp(), device_id=Uuid())
_ENVIRONMENTS = {
    pb.APNS_ENVIRONMENT_PRODUCTION: "production",
    pb.APNS_ENVIRONMENT_SANDBOX: "sandbox",
}
_ENVIRONMENT_MESSAGES = {name: value for value, name in _ENVIRONMENTS.items()}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _token_violation(field: str, token: str, required: bool = True) -> list[FieldViolation]:
    if not token:
        return [FieldViolation(field, "is required")] if required else []
    problem = tokens.token_problem(token)
    return [FieldViolation(field, problem)] if problem else []


def _timestamp(value: Any) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def _device_message(row: DeviceRow) -> pb.Device:
    return pb.Device(
        device_id=row.device_id,
        environment=_ENVIRONMENT_MESSAGES[row.environment],
        bundle_id=row.bundle_id,
        has_push_to_start_token=row.has_push_to_start_token,
        create_time=_timestamp(row.created_at),
        update_time=_timestamp(row.registered_at),
        locale=row.locale,
    )


def _device_registration(user_id: str, request: pb.RegisterDeviceRequest) -> DeviceRegistration:
    problems = _token_violation("device_token", request.device_token)
    problems += _token_violation("push_to_start_token", request.push_to_start_token, False)
    if request.environment not in _ENVIRONMENTS:
        problems.append(FieldViolation("environment", "must be PRODUCTION or SANDBOX"))
    bundle_problem = tokens.bundle_id_problem(request.bundle_id)
    if bundle_problem:
        problems.append(FieldViolation("bundle_id", bundle_problem))
    locale_problem = tokens.locale_problem(request.locale)
    if locale_problem:
        problems.append(FieldViolation("locale", locale_problem))
    if problems:
        raise invalid_argument(Reason.INVALID_DEVICE, problems)
    start = request.push_to_start_token
    return DeviceRegistration(
        user_id=user_id,
        token=tokens.normalized_token(request.device_token),
        environment=_ENVIRONMENTS[request.environment],
        bundle_id=request.bundle_id,
        locale=request.locale or tokens.DEFAULT_LOCALE,
        push_to_start_token=tokens.normalized_token(start) if start else None,
    )


def _activity_problems(job_id: str, activity_id: str) -> list[FieldViolation]:
    problems: list[FieldViolation] = []
    if not _is_uuid(job_id):
        problems.append(FieldViolation("job_id", "must be a job id (a UUID)"))
    activity_problem = tokens.activity_id_problem(activity_id)
    if activity_problem:
        problems.append(FieldViolation("activity_id", activity_problem))
    return problems


def _device_not_found() -> ApiError:
    return not_found(Reason.DEVICE_NOT_FOUND, "no such device")


class DevicesServicer:
    """The token RPCs of NotifyService (the public servicer delegates to this)."""

    def __init__(self, engine: AsyncEngine, pushes: PushQueue | None = None) -> None:
        self._engine = engine
        # Records what a Live Activity registered late needs to show its job as it is.
        self._pushes = pushes

    async def RegisterDevice(
        self, request: pb.RegisterDeviceRequest, context: Context
    ) -> pb.RegisterDeviceResponse:
        registration = _device_registration(current_principal().user_id, request)
        device = await registrations.register_device(self._engine, registration)
        log.info(
            "device_registered",
            device_id=device.device_id,
            apns_prefix=tokens.short(registration.token),
            environment=device.environment,
            push_to_start=registration.push_to_start_token is not None,
        )
        return pb.RegisterDeviceResponse(device=_device_message(device))

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: Context
    ) -> pb.ListDevicesResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        after = DEVICE_PAGES.decode(request.page_token) if request.page_token else None
        devices, cursor = await registrations.list_devices(
            self._engine, current_principal().user_id, limit, after
        )
        return pb.ListDevicesResponse(
            devices=[_device_message(d) for d in devices],
            next_page_token=DEVICE_PAGES.encode(cursor) if cursor else "",
        )

    async def DeleteDevice(
        self, request: pb.DeleteDeviceRequest, context: Context
    ) -> pb.DeleteDeviceResponse:
        if not _is_uuid(request.device_id):
            raise invalid_argument(
                Reason.INVALID_DEVICE_ID,
                [FieldViolation("device_id", "must be a device id (a UUID)")],
            )
        try:
            await registrations.delete_device(
                self._engine, current_principal().user_id, request.device_id
            )
        except registrations.DeviceNotFound:
            raise _device_not_found() from None
        log.info("device_deleted", device_id=request.device_id)
        return pb.DeleteDeviceResponse()

    async def RegisterLiveActivity(
        self, request: pb.RegisterLiveActivityRequest, context: Context
    ) -> pb.RegisterLiveActivityResponse:
        problems = _activity_problems(request.job_id, request.activity_id)
        if not _is_uuid(request.device_id):
            problems.append(FieldViolation("device_id", "must be a device id (a UUID)"))
        problems += _token_violation("push_token", request.push_token)
        if problems:
            raise invalid_argument(Reason.INVALID_LIVE_ACTIVITY, problems)
        token = tokens.normalized_token(request.push_token)
        try:
            registered_at = await registrations.register_activity(
                self._engine,
                ActivityRegistration(
                    user_id=current_principal().user_id,
                    job_id=request.job_id,
                    device_id=request.device_id,
                    token=token,
                    activity_id=request.activity_id,
                ),
                self._pushes,
            )
        except registrations.DeviceNotFound:
            raise _device_not_found() from None
        except registrations.JobNotFound:
            raise not_found(Reason.JOB_NOT_FOUND, "no such job") from None
        log.info(
            "live_activity_registered",
            job_id=request.job_id,
            activity_id=request.activity_id,
            apns_prefix=tokens.short(token),
        )
        return pb.RegisterLiveActivityResponse(
            job_id=request.job_id,
            register_time=_timestamp(registered_at),
            activity_id=request.activity_id,
        )

    async def DeleteLiveActivity(
        self, request: pb.DeleteLiveActivityRequest, context: Context
    ) -> pb.DeleteLiveActivityResponse:
        problems = _activity_problems(request.job_id, request.activity_id)
        if problems:
            raise invalid_argument(Reason.INVALID_LIVE_ACTIVITY, problems)
        removed = await registrations.delete_activity(
            self._engine, current_principal().user_id, request.job_id, request.activity_id
        )
        if not removed:
            raise not_found(Reason.LIVE_ACTIVITY_NOT_FOUND, "no such live activity")
        log.info("live_activity_removed", job_id=request.job_id, activity_id=request.activity_id)
        return pb.DeleteLiveActivityResponse()
