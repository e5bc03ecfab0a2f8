"""notify's device values (pure): what a client registers, and a device as it is listed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class DeviceRegistration:
    user_id: str
    token: str
    environment: str
    bundle_id: str
    locale: str
    push_to_start_token: str | None


@dataclass(frozen=True)
class DeviceRow:
    device_id: str
    environment: str
    bundle_id: str
    locale: str
    has_push_to_start_token: bool
    created_at: datetime
    registered_at: datetime


@dataclass(frozen=True)
class DeviceCursor:
    """The last device of a page (newest first)."""

    created_at: datetime
    device_id: str


@dataclass(frozen=True)
class ActivityRegistration:
    user_id: str
    job_id: str
    device_id: str
    token: str
    activity_id: str
