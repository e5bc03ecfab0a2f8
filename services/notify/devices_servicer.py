"""NotifyService's token RPCs: devices (alert and push-to-start tokens) and Live Activity
tokens. Thin: check the fields (fields.py), ask :class:`services.notify.devices.Devices`
as the caller, answer in protobuf."""

from __future__ import annotations

from typing import Any

from grpc import aio

from atelier.notify.v1 import notify_service_pb2 as pb
from services.kit.auth import current_principal
from services.kit.pagination import KeysetCodec, Timestamp, Uuid, page_size
from services.kit.timestamps import to_timestamp
from services.notify import fields
from services.notify.devices import Devices
from services.notify.domain import DeviceCursor, DeviceRow

Context = aio.ServicerContext[Any, Any]

DEVICE_PAGES = KeysetCodec("devices", DeviceCursor, created_at=Timestamp(), device_id=Uuid())
_ENVIRONMENT_MESSAGES = {name: value for value, name in fields.ENVIRONMENTS.items()}


def _device_message(row: DeviceRow) -> pb.Device:
    return pb.Device(
        device_id=row.device_id,
        environment=_ENVIRONMENT_MESSAGES[row.environment],
        bundle_id=row.bundle_id,
        has_push_to_start_token=row.has_push_to_start_token,
        create_time=to_timestamp(row.created_at),
        update_time=to_timestamp(row.registered_at),
        locale=row.locale,
    )


class DevicesServicer:
    """The token RPCs of NotifyService (the public servicer delegates to this)."""

    def __init__(self, devices: Devices) -> None:
        self._devices = devices

    async def RegisterDevice(
        self, request: pb.RegisterDeviceRequest, context: Context
    ) -> pb.RegisterDeviceResponse:
        registration = fields.device_registration(current_principal().user_id, request)
        device = await self._devices.register_device(registration)
        return pb.RegisterDeviceResponse(device=_device_message(device))

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: Context
    ) -> pb.ListDevicesResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        after = DEVICE_PAGES.decode(request.page_token) if request.page_token else None
        devices, cursor = await self._devices.list_devices(
            current_principal().user_id, limit, after
        )
        return pb.ListDevicesResponse(
            devices=[_device_message(d) for d in devices],
            next_page_token=DEVICE_PAGES.encode(cursor) if cursor else "",
        )

    async def DeleteDevice(
        self, request: pb.DeleteDeviceRequest, context: Context
    ) -> pb.DeleteDeviceResponse:
        device_id = fields.device_id(request.device_id)
        await self._devices.delete_device(current_principal().user_id, device_id)
        return pb.DeleteDeviceResponse()

    async def RegisterLiveActivity(
        self, request: pb.RegisterLiveActivityRequest, context: Context
    ) -> pb.RegisterLiveActivityResponse:
        registration = fields.activity_registration(current_principal().user_id, request)
        registered_at = await self._devices.register_activity(registration)
        return pb.RegisterLiveActivityResponse(
            job_id=registration.job_id,
            register_time=to_timestamp(registered_at),
            activity_id=registration.activity_id,
        )

    async def DeleteLiveActivity(
        self, request: pb.DeleteLiveActivityRequest, context: Context
    ) -> pb.DeleteLiveActivityResponse:
        job_id, activity_id = fields.activity(request)
        await self._devices.delete_activity(current_principal().user_id, job_id, activity_id)
        return pb.DeleteLiveActivityResponse()
