"""What notify does with a client's APNs tokens: register, list and delete devices (alert
and push-to-start tokens), register and remove Live Activity tokens. Owner only: every
store call is scoped to the caller, and another user's device or job is not found.
Tokens are never logged whole (first 8 characters)."""

from __future__ import annotations

from datetime import datetime

from services.kit.logging import get_logger
from services.notify.domain import ActivityRegistration, DeviceCursor, DeviceRegistration, DeviceRow
from services.notify.errors import DeviceNotFound, LiveActivityNotFound
from services.notify.pushes import tokens
from services.notify.pushes.planner import PushPlanner
from services.notify.store import TokenStore

log = get_logger(__name__)


class Devices:
    def __init__(self, store: TokenStore, planner: PushPlanner | None = None) -> None:
        self._store = store
        # Plans what a Live Activity registered late needs to show its job as it is.
        self._planner = planner

    async def register_device(self, registration: DeviceRegistration) -> DeviceRow:
        device = await self._store.register_device(registration)
        log.info(
            "device_registered",
            device_id=device.device_id,
            apns_prefix=tokens.short(registration.token),
            environment=device.environment,
            push_to_start=registration.push_to_start_token is not None,
        )
        return device

    async def list_devices(
        self, user_id: str, limit: int, after: DeviceCursor | None
    ) -> tuple[list[DeviceRow], DeviceCursor | None]:
        """One page of the user's live devices, newest first, and the cursor of the next."""
        return await self._store.list_devices(user_id, limit, after)

    async def delete_device(self, user_id: str, device_id: str) -> None:
        """Retires the device and every token on it; DeviceNotFound unless it is the
        user's."""
        if not await self._store.delete_device(user_id, device_id):
            raise DeviceNotFound(device_id)
        log.info("device_deleted", device_id=device_id)

    async def register_activity(self, registration: ActivityRegistration) -> datetime:
        """Stores the activity's token (rotating an earlier one) and records what it needs
        to show its job as it is now; returns when it was registered. DeviceNotFound or
        JobNotFound when either is not the user's."""
        registered_at = await self._store.register_activity(registration, self._planner)
        log.info(
            "live_activity_registered",
            job_id=registration.job_id,
            activity_id=registration.activity_id,
            apns_prefix=tokens.short(registration.token),
        )
        return registered_at

    async def delete_activity(self, user_id: str, job_id: str, activity_id: str) -> None:
        """Retires the activity's tokens; LiveActivityNotFound when it has none live."""
        if not await self._store.delete_activity(user_id, job_id, activity_id):
            raise LiveActivityNotFound(job_id, activity_id)
        log.info("live_activity_removed", job_id=job_id, activity_id=activity_id)
